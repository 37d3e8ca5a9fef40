//! sled 0.34 under the embedded backend: its trees as they are, its log fsynced after
//! each flush.

use std::fs::File;
use std::ops::Bound;

use super::Visit;
use super::{Bytes, EngineOptions, Iter, Tree, TxError, TxResult, TxTree};
use crate::store::StoreError;

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Backend { backend: "sled", message: e.to_string() }
    }
}

/// zstd level of sled's log: the fastest; JSON bodies and records already shrink
/// about 3x at it (BENCHMARKS.md, footprint).
const COMPRESSION_LEVEL: i32 = 1;

/// An open sled database and its log file.
pub(crate) struct SledDb {
    db: sled::Db,
    /// sled's log (`{data_dir}/db`), fsynced after each `Db::flush`: on Linux, sled
    /// 0.34's `Db::flush` ends with `sync_file_range`, not `fsync`, which writes no
    /// metadata (the log's growing size and new blocks) and does not flush the device's
    /// cache: `tests/integration/power_loss.rs` lost 170 of 312 acknowledged callbacks
    /// at its first cut without it.
    log: File,
}

impl SledDb {
    pub(super) fn open(opts: &EngineOptions<'_>) -> Result<Self, StoreError> {
        remove_unfinished_snapshots(opts.path)?;
        let flush_ms = u64::try_from(opts.flush.period().as_millis()).unwrap_or(u64::MAX).max(1);
        let db = sled::Config::new()
            .path(opts.path)
            .cache_capacity(opts.cache_capacity_bytes)
            .flush_every_ms(Some(flush_ms))
            .mode(sled::Mode::HighThroughput)
            .use_compression(compression_of(opts.path, opts.compression))
            .compression_factor(COMPRESSION_LEVEL)
            .open()
            .map_err(|e| locked(opts.path, e))?;
        let log_path = opts.path.join("db");
        let log = std::fs::OpenOptions::new().write(true).open(&log_path).map_err(|e| {
            StoreError::Backend {
                backend: "sled",
                message: format!("opening sled's log {} to fsync it: {e}", log_path.display()),
            }
        })?;
        Ok(Self { db, log })
    }

    pub(super) fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        self.log.sync_data().map_err(|e| StoreError::Backend {
            backend: "sled",
            message: format!("fdatasync of sled's log: {e}"),
        })
    }

    pub(super) fn open_tree(&self, name: &str) -> Result<SledTree, StoreError> {
        Ok(SledTree(self.db.open_tree(name)?))
    }

    /// Every entry of the trees `names` that exist, tree by tree (sled takes no
    /// snapshot across trees: the caller keeps writes out meanwhile).
    pub(super) fn snapshot(
        &self,
        names: &[&'static str],
        visit: &mut Visit<'_>,
    ) -> Result<(), StoreError> {
        let existing = self.tree_names();
        for (i, name) in names.iter().enumerate() {
            if !existing.iter().any(|n| n == name) {
                continue;
            }
            for item in self.db.open_tree(name)?.iter() {
                let (k, v) = item?;
                visit(i, &k, &v)?;
            }
        }
        Ok(())
    }

    /// The trees' names, sled's own default tree left out.
    pub(super) fn tree_names(&self) -> Vec<String> {
        self.db
            .tree_names()
            .iter()
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .filter(|n| n != "__sled__default")
            .collect()
    }

    pub(super) fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk()?)
    }

    /// Drops the tree `name`; whether it was there.
    pub(super) fn drop_tree(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.db.drop_tree(name)?)
    }
}

/// A sled tree behind the engine layer's [`Tree`]: the backend never sees sled's type.
#[derive(Clone)]
pub(crate) struct SledTree(sled::Tree);

/// A value or key sled read: its shared buffer as it is, behind [`Bytes`].
pub(crate) struct SledBytes(sled::IVec);

impl std::ops::Deref for SledBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// A sled tree inside a transaction, behind [`TxTree`].
pub(crate) struct SledTx(sled::transaction::TransactionalTree);

fn bytes(v: sled::IVec) -> Bytes {
    Bytes::Sled(SledBytes(v))
}

impl SledTree {
    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.0.get(key)?.map(bytes))
    }

    pub(super) fn contains_key(&self, key: &[u8]) -> Result<bool, StoreError> {
        Ok(self.0.contains_key(key)?)
    }

    pub(super) fn insert(&self, key: &[u8], value: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.0.insert(key, value)?.map(bytes))
    }

    pub(super) fn remove(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        Ok(self.0.remove(key)?.map(bytes))
    }

    /// Every write of `ops`, all or none.
    pub(super) fn apply_batch(&self, ops: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        let mut b = sled::Batch::default();
        for (k, v) in ops {
            b.insert(k, v);
        }
        Ok(self.0.apply_batch(b)?)
    }

    pub(super) fn range(&self, range: (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Iter {
        Box::new(self.0.range(range).map(|item| {
            let (k, v) = item?;
            Ok((bytes(k), bytes(v)))
        }))
    }

    /// How many entries (sled walks the tree).
    pub(super) fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

impl SledTx {
    pub(super) fn get(&self, key: &[u8]) -> TxResult<Option<Bytes>> {
        Ok(self.0.get(key).map_err(tx_error)?.map(bytes))
    }

    pub(super) fn insert(&self, key: &[u8], value: &[u8]) -> TxResult<Option<Bytes>> {
        Ok(self.0.insert(key, value).map_err(tx_error)?.map(bytes))
    }

    pub(super) fn remove(&self, key: &[u8]) -> TxResult<Option<Bytes>> {
        Ok(self.0.remove(key).map_err(tx_error)?.map(bytes))
    }
}

/// Removes the snapshot files sled began and never finished (`snap.<lsn>.generating`).
///
/// sled 0.34 writes a snapshot to `snap.<lsn>.generating`, fsyncs it and renames it to
/// `snap.<lsn>`; a snapshot not renamed was never relied on (its log is all there).
/// But when it lists snapshots at open it skips only `.in___motion`, not
/// `.generating`: an empty one, left by a snapshot cut short on a full disk, is read as
/// the newest snapshot and fails every open with "Read corrupted data" (issue 40: a
/// permanent crash loop, every acknowledged callback out of reach). Removed before
/// sled opens, each with a log line.
fn remove_unfinished_snapshots(dir: &std::path::Path) -> Result<(), StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(StoreError::Backend {
                backend: "sled",
                message: format!("listing {} for unfinished snapshots: {e}", dir.display()),
            })
        }
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            let path = entry.path();
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            std::fs::remove_file(&path).map_err(|e| StoreError::Backend {
                backend: "sled",
                message: format!(
                    "removing the unfinished snapshot {} (sled cannot open beside it): {e}",
                    path.display()
                ),
            })?;
            tracing::warn!(file = %path.display(), bytes = size,
                "removed an unfinished sled snapshot (cut short by a crash or a full disk): sled would read it as corrupt; its log holds everything");
        }
    }
    Ok(())
}

/// sled's error when another process holds the database, said plainly.
fn locked(path: &std::path::Path, e: sled::Error) -> StoreError {
    let message = e.to_string();
    if message.contains("could not acquire lock") {
        StoreError::Backend {
            backend: "sled",
            message: format!(
                "{} is in use by another process (is another hookrelay serving this \
                 storage.data_dir?): stop it, or give this relay a data_dir of its own",
                path.display()
            ),
        }
    } else {
        e.into()
    }
}

/// Whether to open the database at `path` compressed. sled refuses to open a database
/// with another setting than it was created with, and says so in its `conf` file
/// (`use_compression: true`): an existing database keeps its own, with a note when it
/// differs from the configuration; a new one follows `wanted`.
fn compression_of(path: &std::path::Path, wanted: bool) -> bool {
    let Ok(conf) = std::fs::read(path.join("conf")) else { return wanted };
    let conf = String::from_utf8_lossy(&conf);
    let existing = conf
        .lines()
        .find_map(|line| line.strip_prefix("use_compression: "))
        .map(|v| v.trim() == "true");
    match existing {
        Some(existing) if existing != wanted => {
            tracing::warn!(
                data_dir = %path.display(),
                compressed = existing,
                "storage.compression differs from what this data directory was created with; \
                 sled keeps its original setting (to change it, start the relay on a new \
                 storage.data_dir once this one is drained)"
            );
            existing
        }
        Some(existing) => existing,
        None => wanted,
    }
}

/// A sled operation's error inside a transaction, as the engine layer says it: a
/// conflict to run the body again on, or a storage error to abort with.
fn tx_error(e: sled::transaction::UnabortableTransactionError) -> TxError {
    match e {
        sled::transaction::UnabortableTransactionError::Conflict => TxError::Conflict,
        sled::transaction::UnabortableTransactionError::Storage(e) => TxError::Abort(e.into()),
    }
}

/// One sled transaction over `trees` (all of one database).
pub(super) fn transaction<T>(
    trees: &[&Tree],
    body: impl Fn(&[TxTree<'_>]) -> TxResult<T>,
) -> Result<T, StoreError> {
    use sled::transaction::TransactionError;
    use sled::Transactional;
    let sled_trees: Vec<&sled::Tree> = trees
        .iter()
        .map(|t| match t {
            Tree::Sled(t) => Ok(&t.0),
            Tree::Redb(_) => Err(StoreError::Task("a redb tree in a sled transaction".into())),
        })
        .collect::<Result<_, _>>()?;
    use sled::transaction::ConflictableTransactionError as Txe;
    sled_trees
        .as_slice()
        .transaction(|views| {
            let views: Vec<TxTree<'_>> =
                views.iter().cloned().map(|v| TxTree::Sled(SledTx(v))).collect();
            body(&views).map_err(|e| match e {
                TxError::Abort(e) => Txe::Abort(e),
                TxError::Conflict => Txe::Conflict,
            })
        })
        .map_err(|e| match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e) => e.into(),
        })
}

/// Whether sled alone (no clean-up of ours first) opens the database in `path`.
#[cfg(test)]
pub(super) fn opens_as_is(path: &std::path::Path) -> bool {
    sled::Config::new().path(path).use_compression(true).open().is_ok()
}
