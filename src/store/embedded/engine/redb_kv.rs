//! redb 4 under the embedded backend: one file (`{data_dir}/hookrelay.redb`), a table
//! per tree, bytes to bytes, with its redo log beside it (`redo.rs`).
//!
//! Every write commits without an fsync (`Durability::None`: visible to readers, not
//! yet durable) and appends its writes to the redo log; [`RedbDb::flush`] makes them
//! durable with one append and `fdatasync` of the log, shared by concurrent writers
//! (`../flush.rs`). A thread checkpoints every `flush_interval`, or sooner once
//! [`CHECKPOINT_BYTES`] were logged (a durable commit, which makes every earlier one
//! durable with it, then the log emptied): it bounds the log and what a crash replays,
//! and is what makes writes durable in the `buffered` mode.
//! Durable commits save the allocator state ("quick repair"): after a crash the file
//! opens in milliseconds, where a full repair walks the whole file (8 s at a million
//! events, measured); then the log's records after the checkpoint are applied again.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Bound;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
    TableHandle,
};

use super::redo::{self, Ops, RedoLog};
use super::Visit;
use super::{Bytes, EngineOptions, Iter, Tree, TxError, TxResult, TxTree};
use crate::store::StoreError;

/// The database file in `storage.data_dir`.
pub(crate) const FILE_NAME: &str = "hookrelay.redb";
/// The table where a checkpoint writes which log it covers and up to which record
/// (`redo.rs`): the engine's own, never one of the store's trees.
const REDO_TABLE: &str = "redo";
const REDO_KEY: &[u8] = b"checkpoint";
/// Records logged since the last checkpoint that make the next one due before its
/// period: writers wait while a checkpoint writes redb's pages, for a time about
/// proportional to them (under held ingest a 500 ms checkpoint took 8 ms median and
/// 31 ms at worst; with this trigger 6.5 and 10 ms), so a busy relay takes shorter,
/// more frequent checkpoints (BENCHMARKS.md, "The redo log").
const CHECKPOINT_BYTES: usize = 1 << 20;
/// How often the checkpointer looks at the log's volume.
const CHECKPOINT_LOOK: Duration = Duration::from_millis(50);

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
    /// Set by every non-durable commit, cleared by a checkpoint: the periodic
    /// checkpoint commits only when there is something new (an idle relay does not
    /// fsync twice a second).
    dirty: AtomicBool,
    /// Hears of each checkpoint (its time is the wait it puts on writers), once the
    /// store has said where to report.
    observer: std::sync::OnceLock<Arc<dyn crate::store::StoreObserver>>,
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
            dirty: AtomicBool::new(false),
            observer: std::sync::OnceLock::new(),
        });
        let checkpointer = start_checkpointer(Arc::downgrade(&db), opts.flush_interval);
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
        checkpoint(&self.db)
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
                self.db.dirty.store(true, Ordering::Release);
                txn.commit().map_err(err)?;
                if !ops.is_empty() {
                    self.db.redo.append(&writer, &ops);
                }
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
    /// applied again over later writes (`redo.rs`, invariant 2).
    fn drop(&mut self) {
        if self.dirty.load(Ordering::Acquire) {
            if let Err(e) = checkpoint(self) {
                tracing::warn!(error = %e, "redb's checkpoint at close failed: the next open \
                                            applies the redo log again");
            }
        }
    }
}

/// The log's id and the last record a checkpoint covers, if one was taken.
fn read_checkpoint(db: &Database) -> Result<Option<(u64, u64)>, StoreError> {
    let txn = db.begin_read().map_err(err)?;
    let table = match txn.open_table(Def::new(REDO_TABLE)) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let Some(value) = table.get(REDO_KEY).map_err(err)? else { return Ok(None) };
    let value = value.value();
    if value.len() != 16 {
        return Err(err(format!(
            "the redo log's checkpoint is {} bytes, not 16: the file is damaged",
            value.len()
        )));
    }
    let (id, lsn) = value.split_at(8);
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
    Ok(Some((word(id), word(lsn))))
}

/// A durable commit of everything committed so far, saving the allocator state, that
/// records the log `id` covered up to record `lsn`.
fn durable_commit(db: &Database, id: u64, lsn: u64) -> Result<(), StoreError> {
    let mut txn = db.begin_write().map_err(err)?;
    txn.set_durability(Durability::Immediate).map_err(err)?;
    txn.set_quick_repair(true);
    {
        let mut table = txn.open_table(Def::new(REDO_TABLE)).map_err(err)?;
        let mut value = [0u8; 16];
        value[..8].copy_from_slice(&id.to_le_bytes());
        value[8..].copy_from_slice(&lsn.to_le_bytes());
        table.insert(REDO_KEY, value.as_slice()).map_err(err)?;
    }
    txn.commit().map_err(err)
}

/// A checkpoint (`redo.rs`, invariant 2): under the writer lock, a durable commit
/// recording the last record, then the log emptied.
fn checkpoint(shared: &Shared) -> Result<(), StoreError> {
    let writer = shared.redo.writer();
    // Cleared first: a commit after this point sets it again for the next checkpoint.
    shared.dirty.store(false, Ordering::Release);
    let lsn = shared.redo.last(&writer);
    let began = std::time::Instant::now();
    let committed = durable_commit(&shared.db, shared.redo.id(), lsn);
    // Writers wait for it: its length is what a checkpoint adds to an ack's tail.
    let took = began.elapsed();
    tracing::debug!(took_us = took.as_micros() as u64, lsn, "redb checkpoint");
    if let Some(observer) = shared.observer.get() {
        observer.checkpoint(took, committed.is_ok());
    }
    if let Err(e) = committed {
        // Not checkpointed: the next one tries again (the log still holds it all).
        shared.dirty.store(true, Ordering::Release);
        return Err(e);
    }
    if let Err(e) = shared.redo.emptied(&writer) {
        tracing::warn!(error = %e, "emptying redb's redo log after a checkpoint failed: it \
                                    grows until a later checkpoint empties it");
    }
    Ok(())
}

/// At open: the records of the log after the last checkpoint applied again
/// (`redo.rs`, invariant 3), a checkpoint of them, and a new log.
fn recover(db: &Database, dir: &Path) -> Result<RedoLog, StoreError> {
    let path = dir.join(redo::FILE_NAME);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(log_err(dir, "reading the redo log")(e)),
    };
    if let Some(bytes) = &bytes {
        match (read_checkpoint(db)?, bytes.len()) {
            (Some((id, after)), _) => {
                match redo::read(bytes, id, after) {
                    redo::Read::Records { records, torn } => {
                        let applied = replay(db, &records)?;
                        if applied > 0 || torn > 0 {
                            tracing::warn!(records = records.len(), writes = applied, torn_bytes = torn,
                            "redb's redo log applied again after an unclean stop (a torn end is a \
                             write the stop cut short, never acknowledged)");
                        }
                    }
                    redo::Read::Foreign => tracing::warn!(path = %path.display(),
                    "a redo log that is not this database's was set aside (a store copied or \
                     restored into this directory): nothing of it applies"),
                }
            }
            (None, len) if len > 16 => tracing::warn!(path = %path.display(),
                "a redo log beside a database that never took a checkpoint was set aside"),
            (None, _) => {}
        }
    }
    let id = fastrand::u64(1..);
    durable_commit(db, id, 0)?;
    RedoLog::create(dir, id).map_err(log_err(dir, "creating the redo log"))
}

/// Applies `records`' writes in order in one transaction; returns how many writes.
fn replay(db: &Database, records: &[redo::Record<'_>]) -> Result<usize, StoreError> {
    if records.is_empty() {
        return Ok(0);
    }
    // Table names live as long as the process (a handful: the store's trees).
    let mut names: HashMap<&str, &'static str> = HashMap::new();
    let mut txn = db.begin_write().map_err(err)?;
    txn.set_durability(Durability::None).map_err(err)?;
    let mut applied = 0;
    for record in records {
        let ops = redo::ops(record.payload).map_err(|reason| {
            err(format!("record {} of the redo log does not parse: {reason}", record.lsn))
        })?;
        for op in ops {
            let (redo::Op::Insert { table, .. } | redo::Op::Remove { table, .. }) = op;
            let name =
                *names.entry(table).or_insert_with(|| Box::leak(table.to_owned().into_boxed_str()));
            let mut t = txn.open_table(Def::new(name)).map_err(err)?;
            match op {
                redo::Op::Insert { key, value, .. } => {
                    t.insert(key, value).map_err(err)?;
                }
                redo::Op::Remove { key, .. } => {
                    t.remove(key).map_err(err)?;
                }
            }
            applied += 1;
        }
    }
    txn.commit().map_err(err)?;
    Ok(applied)
}

/// Checkpoints at most every `interval` while the database is open and written to,
/// and sooner once [`CHECKPOINT_BYTES`] of records were logged (`redo.rs`), on a thread
/// the [`RedbDb`] owns: it stops with it.
fn start_checkpointer(db: Weak<Shared>, interval: Duration) -> Option<crate::store::Ticker> {
    let mut last = std::time::Instant::now();
    let look = interval.min(CHECKPOINT_LOOK);
    let spawned = crate::store::Ticker::start("redb-checkpoint", look, move || {
        let Some(db) = db.upgrade() else { return ControlFlow::Break(()) };
        let due = last.elapsed() >= interval && db.dirty.load(Ordering::Acquire);
        if due || db.redo.since_checkpoint() >= CHECKPOINT_BYTES {
            last = std::time::Instant::now();
            if let Err(e) = checkpoint(&db) {
                tracing::warn!(error = %e, "redb's periodic checkpoint failed (the redo log keeps \
                                            every write meanwhile; the next one tries again)");
            }
        }
        ControlFlow::Continue(())
    });
    match spawned {
        Ok(ticker) => Some(ticker),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start redb's checkpoint thread: the redo log is \
                                        emptied only when the database closes");
            None
        }
    }
}

impl RedbTree {
    fn read(&self) -> Result<redb::ReadOnlyTable<&'static [u8], &'static [u8]>, StoreError> {
        self.db.begin_read().map_err(err)?.open_table(self.def).map_err(err)
    }

    /// One non-durable write transaction on this table, its writes appended to the
    /// redo log.
    fn write<T>(
        &self,
        f: impl FnOnce(&mut TxTable<'_>) -> Result<T, redb::StorageError>,
    ) -> Result<T, StoreError> {
        let writer = self.db.redo.writer();
        let mut txn = self.db.begin_write().map_err(err)?;
        txn.set_durability(Durability::None).map_err(err)?;
        let (out, ops) = {
            let table = txn.open_table(self.def).map_err(err)?;
            let mut table = TxTable { table, name: self.name, ops: Ops::default() };
            (f(&mut table).map_err(err)?, table.ops)
        };
        self.db.dirty.store(true, Ordering::Release);
        txn.commit().map_err(err)?;
        if !ops.is_empty() {
            self.db.redo.append(&writer, &ops);
        }
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
        self.write(|t| t.insert(key, value))
    }

    pub(super) fn remove(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        self.write(|t| t.remove(key))
    }

    pub(super) fn apply_batch(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        self.write(|t| {
            for (k, v) in &ops {
                t.insert(k, v)?;
            }
            Ok(())
        })
    }

    /// Removes every key of `ops`, then writes each with its new value, in one
    /// transaction ([`super::Tree::apply_shrinking`]).
    pub(super) fn apply_shrinking(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        self.write(|t| {
            for (k, _) in &ops {
                t.remove(k)?;
            }
            for (k, v) in &ops {
                t.insert(k, v)?;
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
    Ok(t.table.get(key).map_err(abort)?.map(|v| Bytes::Owned(v.value().to_vec())))
}

pub(super) fn tx_insert(t: &mut TxTable<'_>, key: &[u8], value: &[u8]) -> TxResult<Option<Bytes>> {
    t.insert(key, value).map_err(abort)
}

pub(super) fn tx_remove(t: &mut TxTable<'_>, key: &[u8]) -> TxResult<Option<Bytes>> {
    t.remove(key).map_err(abort)
}
