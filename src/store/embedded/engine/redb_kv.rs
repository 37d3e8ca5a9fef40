//! redb 4 under the embedded backend: one file (`{data_dir}/hookrelay.redb`), a table
//! per tree, bytes to bytes, with its redo log beside it (`redo/mod.rs`).
//!
//! Every write commits without an fsync (`Durability::None`: visible to readers, not
//! yet durable) and appends its writes to the redo log; [`RedbDb::flush`] makes them
//! durable with one append and `fdatasync` of the log, shared by concurrent writers
//! (`../flush.rs`). A thread checkpoints every `flush_interval` (in `durable` mode
//! paced by the checkpoints' own length, up to 5 s apart: `../background_flush.rs`),
//! or sooner once 1 MiB was logged (a durable commit, which makes every earlier one
//! durable with it, then the log emptied; `redb_kv/checkpoint.rs`, with the recovery
//! at open): it bounds the log and what a crash replays, and is what makes writes
//! durable in the `buffered` mode.
//! Durable commits save the allocator state ("quick repair"): after a crash the file
//! opens in milliseconds, where a full repair walks the whole file (8 s at a million
//! events, measured); then the log's records after the checkpoint are applied again.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use super::redo::{self, Ops, RedoLog};
use super::Visit;
use super::{Bytes, EngineOptions, Tree, TxError, TxResult, TxTree};
use crate::store::StoreError;
use checkpoint::{checkpoint, recover, start_checkpointer, REDO_TABLE};

mod checkpoint;
mod reads;
mod tree;

pub(crate) use reads::read_scope;
pub(crate) use tree::{tx_get, tx_insert, tx_remove};

/// The database file in `storage.data_dir`.
pub(crate) const FILE_NAME: &str = "hookrelay.redb";
type Def = TableDefinition<'static, &'static [u8], &'static [u8]>;

/// A table open in a write transaction, and the writes made to it for the redo log.
pub(crate) struct TxTable<'t> {
    table: redb::Table<'t, &'static [u8], &'static [u8]>,
    name: &'static str,
    ops: Ops,
}

impl TxTable<'_> {
    fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Bytes>, redb::StorageError> {
        self.ops.insert(self.name, key, value);
        Ok(self.table.insert(key, value)?.map(|v| Bytes::Owned(v.value().to_vec())))
    }

    fn remove(&mut self, key: &[u8]) -> Result<Option<Bytes>, redb::StorageError> {
        let old = self.table.remove(key)?.map(|v| Bytes::Owned(v.value().to_vec()));
        // A remove of nothing changes nothing: not logged.
        if old.is_some() {
            self.ops.remove(self.name, key);
        }
        Ok(old)
    }
}

/// redb's error as the store's.
fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend { backend: "redb", message: e.to_string() }
}

/// An abort of the transaction with redb's error.
fn abort(e: impl std::fmt::Display) -> TxError {
    TxError::Abort(err(e))
}

/// The redo log's I/O error as the store's, saying which file.
fn log_err<'a>(dir: &'a Path, what: &'a str) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |e| err(format!("{what} {}: {e}", dir.join(redo::FILE_NAME).display()))
}

/// The database, its redo log, and whether it holds commits not checkpointed yet.
pub(crate) struct Shared {
    db: Database,
    redo: RedoLog,
    dir: PathBuf,
    /// How many writes were committed: a table a read scope kept is used again only
    /// while this has not moved since it was opened (`reads`).
    commits: AtomicU64,
    /// The count of `commits` the last checkpoint covered: while it is the count, there
    /// is nothing new to checkpoint (an idle relay does not fsync twice a second).
    checkpointed: AtomicU64,
    /// Hears of each checkpoint (its time is the wait it puts on writers), once the
    /// store has said where to report.
    observer: std::sync::OnceLock<Arc<dyn crate::store::StoreObserver>>,
}

impl Shared {
    /// Whether writes were committed since the last checkpoint.
    fn dirty(&self) -> bool {
        self.commits.load(Ordering::Acquire) != self.checkpointed.load(Ordering::Acquire)
    }

    /// Commits `txn` without an fsync (visible, not yet durable), then says so to this
    /// thread's read scope and appends `ops`, its writes, to the redo log: every write
    /// outside a checkpoint ends here.
    fn commit(
        &self,
        txn: redb::WriteTransaction,
        writer: &redo::Writer<'_>,
        ops: &Ops,
    ) -> Result<(), StoreError> {
        txn.commit().map_err(err)?;
        self.commits.fetch_add(1, Ordering::AcqRel);
        reads::committed();
        if !ops.is_empty() {
            self.redo.append(writer, ops);
        }
        Ok(())
    }
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
    /// The periodic checkpoint's thread, stopped and joined when the database is
    /// dropped (before the last checkpoint).
    checkpointer: Option<crate::store::Ticker>,
}

/// One table of a [`RedbDb`].
#[derive(Clone)]
pub(crate) struct RedbTree {
    db: Arc<Shared>,
    def: Def,
    /// The table's name, as the redo log records it.
    name: &'static str,
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
        let redo = recover(&db, opts.path)?;
        let db = Arc::new(Shared {
            db,
            redo,
            dir: opts.path.to_owned(),
            checkpointed: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            observer: std::sync::OnceLock::new(),
        });
        let checkpointer = start_checkpointer(Arc::downgrade(&db), opts.flush);
        Ok(Self { db, file, checkpointer })
    }

    pub(super) fn open_tree(&self, name: &'static str) -> Result<RedbTree, StoreError> {
        let def = Def::new(name);
        let tree = RedbTree { db: self.db.clone(), def, name };
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

    /// The store's trees: every table but the redo log's checkpoint.
    pub(super) fn tree_names(&self) -> Result<Vec<String>, StoreError> {
        let txn = self.db.begin_read().map_err(err)?;
        let names = txn
            .list_tables()
            .map_err(err)?
            .map(|t| t.name().to_owned())
            .filter(|n| n != REDO_TABLE)
            .collect();
        Ok(names)
    }

    /// Makes every write so far durable: the redo log synced.
    pub(super) fn flush(&self) -> Result<(), StoreError> {
        self.db.redo.sync().map_err(log_err(&self.db.dir, "writing the redo log"))
    }

    /// Reports each checkpoint from now on to `observer` (the first one given).
    pub(super) fn observe(&self, observer: Arc<dyn crate::store::StoreObserver>) {
        let _ = self.db.observer.set(observer);
    }

    /// Makes every write so far durable in the database file itself, the log emptied:
    /// before the file is moved or copied (a migration's or a restore's copy).
    pub(super) fn checkpoint(&self) -> Result<(), StoreError> {
        checkpoint(&self.db).map(drop)
    }

    /// What a power cut would leave at this instant, copied into `to`: the database
    /// file as its last checkpoint wrote it and the redo log as synced (no writer
    /// runs meanwhile). For the crash tests (`conformance::Embedded::crash`).
    #[cfg(test)]
    pub(super) fn crash_image(&self, to: &Path) -> std::io::Result<()> {
        let _writer = self.db.redo.writer();
        std::fs::copy(&self.file, to.join(FILE_NAME))?;
        std::fs::copy(self.db.dir.join(redo::FILE_NAME), to.join(redo::FILE_NAME))?;
        Ok(())
    }

    /// The space the file and its redo log take on disk (their allocated blocks), not
    /// the file's apparent length: redb grows its file in steps and leaves holes, so
    /// the length says little about how near the disk is to full.
    pub(super) fn size_on_disk(&self) -> Result<u64, StoreError> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(&self.file)
            .map_err(|e| err(format!("reading the size of {}: {e}", self.file.display())))?;
        let log =
            self.db.redo.size_on_disk().map_err(log_err(&self.db.dir, "reading the size of"))?;
        Ok(meta.blocks().saturating_mul(512).saturating_add(log))
    }

    pub(super) fn transaction<T>(
        &self,
        trees: &[&Tree],
        body: impl Fn(&[TxTree<'_>]) -> TxResult<T>,
    ) -> Result<T, StoreError> {
        let writer = self.db.redo.writer();
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::None).map_err(err)?;
        let (result, ops) = {
            let tables = trees
                .iter()
                .map(|t| match t {
                    Tree::Redb(t) => txn
                        .open_table(t.def)
                        .map(|table| {
                            let name = t.name;
                            TxTree::Redb(RefCell::new(TxTable { table, name, ops: Ops::default() }))
                        })
                        .map_err(err),
                    Tree::Sled(_) => {
                        Err(StoreError::Task("a sled tree in a redb transaction".into()))
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            let result = body(&tables);
            let mut ops = Ops::default();
            for table in &tables {
                if let TxTree::Redb(t) = table {
                    ops.extend(&t.borrow().ops);
                }
            }
            (result, ops)
        };
        match result {
            Ok(value) => {
                self.db.commit(txn, &writer, &ops)?;
                Ok(value)
            }
            // Dropping the transaction aborts it.
            Err(TxError::Abort(e)) => Err(e),
            Err(TxError::Conflict) => Err(StoreError::Conflict("redb transaction".into())),
        }
    }
}

impl Drop for RedbDb {
    /// The checkpointer stopped first: the last checkpoint is the last handle's
    /// (`Shared`'s drop), whichever thread drops it.
    fn drop(&mut self) {
        drop(self.checkpointer.take());
    }
}

impl Drop for Shared {
    /// A last checkpoint before redb closes: a database closed cleanly leaves an empty
    /// log. It must come first: redb's close makes pending commits durable on its own,
    /// and a durable state past the checkpoint's record would have the log's records
    /// applied again over later writes (`redo/mod.rs`, invariant 2).
    fn drop(&mut self) {
        if self.dirty() {
            if let Err(e) = checkpoint(self) {
                tracing::warn!(error = %e, "redb's checkpoint at close failed: the next open \
                                            applies the redo log again");
            }
        }
    }
}
