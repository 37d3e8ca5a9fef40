//! redb's checkpoints and its recovery at open (`../redo/mod.rs` says the invariants):
//! what makes the log's records durable in the database file itself, empties the log,
//! and applies again, after a crash, what the file does not hold yet.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use redb::{Database, Durability, ReadableDatabase};

use super::super::redo::{self, RedoLog};
use super::{err, log_err, Def, Shared};
use crate::store::embedded::background_flush::Pacing;
use crate::store::StoreError;

/// The table where a checkpoint writes which log it covers and up to which record
/// (`redo/mod.rs`): the engine's own, never one of the store's trees.
pub(super) const REDO_TABLE: &str = "redo";
const REDO_KEY: &[u8] = b"checkpoint";
/// Records logged since the last checkpoint that make the next one due before its
/// period: writers wait while a checkpoint writes redb's pages, for a time about
/// proportional to them (under held ingest a 500 ms checkpoint took 8 ms median and
/// 31 ms at worst; with this trigger 6.5 and 10 ms), so a busy relay takes shorter,
/// more frequent checkpoints (BENCHMARKS.md, "The redo log").
const CHECKPOINT_BYTES: usize = 1 << 20;
/// How often the checkpointer looks at the log's volume.
const CHECKPOINT_LOOK: Duration = Duration::from_millis(50);

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

/// A checkpoint (`redo/mod.rs`, invariant 2): under the writer lock, a durable commit
/// recording the last record, then the log emptied. Returns how long it held the
/// writers.
pub(super) fn checkpoint(shared: &Shared) -> Result<Duration, StoreError> {
    let writer = shared.redo.writer();
    // Every commit holds the writer lock: the count is exact until it is released.
    let covers = shared.commits.load(Ordering::Acquire);
    let lsn = shared.redo.last(&writer);
    let began = std::time::Instant::now();
    let committed = durable_commit(&shared.db, shared.redo.id(), lsn);
    // Writers wait for it: its length is what a checkpoint adds to an ack's tail
    // (logged and counted by the observer: `internal_events::store::Checkpoint`).
    let took = began.elapsed();
    if let Some(observer) = shared.observer.get() {
        observer.checkpoint(took, committed.is_ok());
    }
    // Not checkpointed: the next one tries again (the log still holds it all).
    committed?;
    shared.checkpointed.store(covers, Ordering::Release);
    if let Err(e) = shared.redo.emptied(&writer) {
        tracing::warn!(error = %e, "shrinking redb's redo log after a checkpoint failed: it \
                                    keeps its size until a later checkpoint shrinks it");
    }
    Ok(took)
}

/// At open: the records of the log after the last checkpoint applied again
/// (`redo/mod.rs`, invariant 3), a checkpoint of them, and a new log.
pub(super) fn recover(db: &Database, dir: &Path) -> Result<RedoLog, StoreError> {
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

/// Checkpoints at most every `pacing`'s period while the database is open and written
/// to, and sooner once [`CHECKPOINT_BYTES`] of records were logged (`redo/mod.rs`), on a
/// thread the [`super::RedbDb`] owns: it stops with it. Each checkpoint's length moves
/// the period (`../../background_flush.rs`).
pub(super) fn start_checkpointer(
    db: Weak<Shared>,
    mut pacing: Pacing,
) -> Option<crate::store::Ticker> {
    let mut last = std::time::Instant::now();
    let look = pacing.shortest().min(CHECKPOINT_LOOK);
    let spawned = crate::store::Ticker::start("redb-checkpoint", look, move || {
        let Some(db) = db.upgrade() else { return ControlFlow::Break(()) };
        let due = last.elapsed() >= pacing.period() && db.dirty();
        if due || db.redo.since_checkpoint() >= CHECKPOINT_BYTES {
            last = std::time::Instant::now();
            match checkpoint(&db) {
                Ok(took) => pacing.checkpointed(took),
                Err(e) => tracing::warn!(error = %e, "redb's periodic checkpoint failed (the redo \
                                    log keeps every write meanwhile; the next one tries again)"),
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

#[cfg(test)]
mod tests {
    use super::super::RedbDb;
    use crate::store::embedded::background_flush::Pacing;
    use crate::store::embedded::engine::EngineOptions;

    /// Whether there is anything to checkpoint follows the commits: nothing after the
    /// open, something after a write, nothing after its checkpoint, and the count a
    /// checkpoint covers is the one under the writer lock (a write after it is new).
    #[test]
    fn only_commits_since_the_last_checkpoint_make_the_store_dirty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = RedbDb::open(&EngineOptions {
            path: dir.path(),
            cache_capacity_bytes: 1 << 20,
            compression: false,
            flush: Pacing::fixed(std::time::Duration::from_secs(3600)),
        })
        .expect("open redb");
        assert!(!db.db.dirty(), "nothing written since the open's checkpoint");
        let tree = db.open_tree("t").expect("tree");
        tree.insert(b"a", b"1").expect("insert");
        assert!(db.db.dirty());
        db.checkpoint().expect("checkpoint");
        assert!(!db.db.dirty(), "checkpointed");
        tree.insert(b"b", b"2").expect("insert");
        assert!(db.db.dirty(), "a write after the checkpoint");
        db.checkpoint().expect("checkpoint");
        assert!(!db.db.dirty());
    }
}
