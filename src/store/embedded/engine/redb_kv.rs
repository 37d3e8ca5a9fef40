//! redb 4 under the embedded backend: one file (`{data_dir}/hookrelay.redb`), a table
//! per tree, bytes to bytes.
//!
//! Every write commits without an fsync (`Durability::None`: visible to readers, not
//! yet durable); [`RedbDb::flush`] is a durable commit, which makes every earlier one
//! durable with it, shared by concurrent writers (`../flush.rs`) and run by a thread
//! every `flush_interval` for the `buffered` mode. Durable commits save the allocator
//! state ("quick repair"): after a crash the file opens in milliseconds, where a full
//! repair walks the whole file (8 s at a million events, measured).

use std::cell::RefCell;
use std::ops::Bound;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    TableHandle,
};

use super::Visit;
use super::{Bytes, EngineOptions, Iter, Tree, TxError, TxResult, TxTree};
use crate::store::StoreError;

/// The database file in `storage.data_dir`.
pub(crate) const FILE_NAME: &str = "hookrelay.redb";

type Def = TableDefinition<'static, &'static [u8], &'static [u8]>;
/// A table open in a write transaction.
pub(crate) type TxTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// redb's error as the store's.
fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { backend: "redb", message: e.to_string() }
}

/// An abort of the transaction with redb's error.
fn abort(e: impl std::fmt::Display) -> TxError {
    TxError::Abort(err(e))
}

/// The database and whether it holds commits not durable yet.
pub(crate) struct Shared {
    db: Database,
    /// Set by every non-durable commit, cleared by a durable one: the periodic flush
    /// commits only when there is something to make durable (an idle relay does not
    /// fsync twice a second).
    dirty: AtomicBool,
}

impl std::ops::Deref for Shared {
    type Target = Database;
    fn deref(&self) -> &Database {
        &self.db
    }
}

/// An open redb database.
pub(crate) struct RedbDb {
    db: Arc<Shared>,
    file: PathBuf,
    /// The periodic flush's thread, stopped and joined when the database is dropped.
    _flusher: Option<crate::store::Ticker>,
}

/// One table of a [`RedbDb`].
#[derive(Clone)]
pub(crate) struct RedbTree {
    db: Arc<Shared>,
    def: Def,
}

impl RedbDb {
    pub(super) fn open(opts: &EngineOptions<'_>) -> Result<Self, StoreError> {
        std::fs::create_dir_all(opts.path).map_err(|e| {
            err(format!("creating the data directory {}: {e}", opts.path.display()))
        })?;
        let file = opts.path.join(FILE_NAME);
        let cache = usize::try_from(opts.cache_capacity_bytes).unwrap_or(usize::MAX);
        let db = Database::builder().set_cache_size(cache).create(&file).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => err(format!(
                "{} is in use by another process (is another hookrelay serving this \
                 storage.data_dir?): stop it, or give this relay a data_dir of its own",
                file.display()
            )),
            e => err(format!("opening {}: {e}", file.display())),
        })?;
        let db = Arc::new(Shared { db, dirty: AtomicBool::new(false) });
        let flusher = start_flusher(Arc::downgrade(&db), opts.flush_interval);
        Ok(Self { db, file, _flusher: flusher })
    }

    pub(super) fn open_tree(&self, name: &'static str) -> Result<RedbTree, StoreError> {
        let def = Def::new(name);
        let tree = RedbTree { db: self.db.clone(), def };
        // Created by a write that opens it.
        if tree.db.begin_read().map_err(err)?.open_table(def).is_err() {
            tree.write(|_| Ok(()))?;
        }
        Ok(tree)
    }

    /// Every entry of the tables `names` that exist, from one read transaction: one
    /// snapshot, whatever is written meanwhile.
    pub(super) fn snapshot(
        &self,
        names: &[&'static str],
        visit: &mut Visit<'_>,
    ) -> Result<(), StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        for (i, name) in names.iter().enumerate() {
            let table = match txn.open_table(Def::new(name)) {
                Ok(table) => table,
                Err(redb::TableError::TableDoesNotExist(_)) => continue,
                Err(e) => return Err(err(e)),
            };
            for item in table.iter().map_err(err)? {
                let (k, v) = item.map_err(err)?;
                visit(i, k.value(), v.value())?;
            }
        }
        Ok(())
    }

    pub(super) fn tree_names(&self) -> Result<Vec<String>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let names = txn.list_tables().map_err(err)?.map(|t| t.name().to_owned()).collect();
        Ok(names)
    }

    pub(super) fn flush(&self) -> Result<(), StoreError> {
        durable_commit(&self.db)
    }

    /// The space the file takes on disk (its allocated blocks), not its apparent
    /// length: redb grows its file in steps and leaves holes, so the length says
    /// little about how near the disk is to full.
    pub(super) fn size_on_disk(&self) -> Result<u64, StoreError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&self.file)
            .map_err(|e| err(format!("reading the size of {}: {e}", self.file.display())))?;
        Ok(meta.blocks().saturating_mul(512))
    }

    pub(super) fn transaction<T>(
        &self,
        trees: &[&Tree],
        body: impl Fn(&[TxTree<'_>]) -> TxResult<T>,
    ) -> Result<T, StoreError> {
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::None).map_err(err)?;
        let result = {
            let tables = trees
                .iter()
                .map(|t| match t {
                    Tree::Redb(t) => {
                        txn.open_table(t.def).map(|t| TxTree::Redb(RefCell::new(t))).map_err(err)
                    }
                    Tree::Sled(_) => {
                        Err(StoreError::Task("a sled tree in a redb transaction".into()))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            body(&tables)
        };
        match result {
            Ok(value) => {
                self.db.dirty.store(true, Ordering::Release);
                txn.commit().map_err(err)?;
                Ok(value)
            }
            // Dropping the transaction aborts it.
            Err(TxError::Abort(e)) => Err(e),
            Err(TxError::Conflict) => Err(StoreError::Conflict("redb transaction".into())),
        }
    }
}

/// A commit that makes every earlier one durable, saving the allocator state.
fn durable_commit(db: &Shared) -> Result<(), StoreError> {
    // Cleared first: a commit after this point sets it again for the next flush.
    db.dirty.store(false, Ordering::Release);
    let commit = || -> Result<(), StoreError> {
        let mut txn = db.begin_write().map_err(err)?;
        txn.set_durability(Durability::Immediate).map_err(err)?;
        txn.set_quick_repair(true);
        txn.commit().map_err(err)
    };
    let result = commit();
    if result.is_err() {
        // Still not durable: the next flush tries again.
        db.dirty.store(true, Ordering::Release);
    }
    result
}

/// Makes the writes durable every `interval` while the database is open (`buffered`
/// mode; in `durable` mode every write flushes anyway), on a thread the [`RedbDb`]
/// owns: it stops with it.
fn start_flusher(db: Weak<Shared>, interval: Duration) -> Option<crate::store::Ticker> {
    let spawned = crate::store::Ticker::start("redb-flush", interval, move || {
        let Some(db) = db.upgrade() else { return ControlFlow::Break(()) };
        if db.dirty.load(Ordering::Acquire) {
            if let Err(e) = durable_commit(&db) {
                tracing::warn!(error = %e, "redb's periodic flush failed (the next write says so too)");
            }
        }
        ControlFlow::Continue(())
    });
    match spawned {
        Ok(ticker) => Some(ticker),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start redb's flush thread: writes become durable \
                                        only when the relay asks for it");
            None
        }
    }
}

impl RedbTree {
    fn read(&self) -> Result<redb::ReadOnlyTable<&'static [u8], &'static [u8]>, StoreError> {
        self.db.begin_read().map_err(err)?.open_table(self.def).map_err(err)
    }

    /// One non-durable write transaction on this table.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut TxTable<'_>) -> Result<T, redb::StorageError>,
    ) -> Result<T, StoreError> {
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::None).map_err(err)?;
        let out = {
            let mut table = txn.open_table(self.def).map_err(err)?;
            f(&mut table).map_err(err)?
        };
        self.db.dirty.store(true, Ordering::Release);
        txn.commit().map_err(err)?;
        Ok(out)
    }

    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.read()?.get(key).map_err(err)?.map(|v| Bytes::Owned(v.value().to_vec())))
    }

    /// Whether `key` is there, without copying its value (dispatch asks it per record).
    pub(super) fn contains_key(&self, key: &[u8]) -> Result<bool, StoreError> {
        Ok(self.read()?.get(key).map_err(err)?.is_some())
    }

    pub(super) fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.write(|t| Ok(t.insert(key, value)?.map(|v| Bytes::Owned(v.value().to_vec()))))
    }

    pub(super) fn remove(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.write(|t| Ok(t.remove(key)?.map(|v| Bytes::Owned(v.value().to_vec()))))
    }

    pub(super) fn apply_batch(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        self.write(|t| {
            for (k, v) in &ops {
                t.insert(k.as_slice(), v.as_slice())?;
            }
            Ok(())
        })
    }

    /// Removes every key of `ops`, then writes each with its new value, in one
    /// transaction ([`super::Tree::apply_shrinking`]).
    pub(super) fn apply_shrinking(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        self.write(|t| {
            for (k, _) in &ops {
                t.remove(k.as_slice())?;
            }
            for (k, v) in &ops {
                t.insert(k.as_slice(), v.as_slice())?;
            }
            Ok(())
        })
    }

    pub(super) fn range(&self, (lower, upper): (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Iter {
        fn borrow(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
            match b {
                Bound::Included(k) => Bound::Included(k.as_slice()),
                Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
                Bound::Unbounded => Bound::Unbounded,
            }
        }
        let scan = self
            .read()
            .and_then(|t| t.range::<&[u8]>((borrow(&lower), borrow(&upper))).map_err(err));
        match scan {
            Ok(scan) => Box::new(scan.map(|item| {
                let (k, v) = item.map_err(err)?;
                Ok((Bytes::Owned(k.value().to_vec()), Bytes::Owned(v.value().to_vec())))
            })),
            Err(e) => Box::new(std::iter::once(Err(e))),
        }
    }

    pub(super) fn len(&self) -> Result<u64, StoreError> {
        self.read()?.len().map_err(err)
    }
}

pub(super) fn tx_get(t: &TxTable<'_>, key: &[u8]) -> TxResult<Option<Bytes>> {
    Ok(t.get(key).map_err(abort)?.map(|v| Bytes::Owned(v.value().to_vec())))
}

pub(super) fn tx_insert(t: &mut TxTable<'_>, key: &[u8], value: &[u8]) -> TxResult<Option<Bytes>> {
    Ok(t.insert(key, value).map_err(abort)?.map(|v| Bytes::Owned(v.value().to_vec())))
}

pub(super) fn tx_remove(t: &mut TxTable<'_>, key: &[u8]) -> TxResult<Option<Bytes>> {
    Ok(t.remove(key).map_err(abort)?.map(|v| Bytes::Owned(v.value().to_vec())))
}
