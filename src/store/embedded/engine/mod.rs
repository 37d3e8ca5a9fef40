//! The key-value engines under the embedded backend: one layout of named trees
//! (`../keys.rs`, `../codec.rs`), two engines to keep it in.
//!
//! - **redb** (`redb_kv.rs`), the default for a new data directory: a copy-on-write
//!   B-tree in one file, whose memory is its page cache (`storage.cache_capacity_bytes`)
//!   whatever it holds, and which opens in milliseconds after a crash (it saves its
//!   allocator state with every durable commit, "quick repair").
//! - **sled** (`sled_kv.rs`), the default of earlier releases, kept where a data
//!   directory holds it: a log-structured engine, fast to ack, whose memory and restart
//!   time grow with what it holds (BENCHMARKS.md, "Capacity").
//!
//! The embedded backend's code sees only what is here: [`Db`] (open a tree, one
//! transaction over several, a durable flush), [`Tree`] (ordered bytes to bytes) and
//! [`TxTree`] (a tree inside a transaction). Enums, not a trait: two engines, one
//! match each, and no generic parameter through every file of the backend.
//!
//! Writes outside a transaction are atomic one by one; nothing is durable until
//! [`Db::flush`] returns (sled: its log fsynced; redb: its redo log fsynced,
//! `redo/mod.rs`).

pub(crate) mod current;
mod redb_kv;
mod redo;
mod sled_kv;

use std::ops::{Bound, Deref, RangeBounds};
use std::path::Path;

pub(crate) use self::redb_kv::read_scope;
pub(crate) use self::redb_kv::FILE_NAME as REDB_FILE;
use crate::store::StoreError;

/// Which engine holds the trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    Sled,
    Redb,
}

impl Engine {
    /// The engine's name, as in `storage.backend` and in its errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Sled => "sled",
            Engine::Redb => "redb",
        }
    }
}

/// How to open an engine.
pub(crate) struct EngineOptions<'a> {
    pub(crate) path: &'a Path,
    pub(crate) cache_capacity_bytes: u64,
    /// sled only: zstd-compress a new database.
    pub(crate) compression: bool,
    /// How often the engine makes its writes durable on its own (`buffered` mode), or
    /// checkpoints (redb; `../background_flush.rs`).
    pub(crate) flush: super::background_flush::Pacing,
}

/// A value (or key) read from a tree: sled's shared buffer as it is, or bytes copied
/// out of redb's page.
pub(crate) enum Bytes {
    Sled(sled_kv::SledBytes),
    Owned(Vec<u8>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Sled(v) => v,
            Bytes::Owned(v) => v,
        }
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", crate::store::hex(self))
    }
}

/// One entry of a scan.
pub(crate) type Entry = Result<(Bytes, Bytes), StoreError>;
/// A scan, in key order either way.
pub(crate) type Iter = Box<dyn DoubleEndedIterator<Item = Entry>>;
/// Why a transaction's body stopped: the engine layer's own type, so that neither the
/// backend nor the redb path sees sled's.
#[derive(Debug)]
pub(crate) enum TxError {
    /// Stop, write nothing, and return this error.
    Abort(StoreError),
    /// Another transaction wrote what this one read: run the body again (sled only;
    /// redb has one writer at a time).
    Conflict,
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Abort(e)
    }
}

/// What a transaction's body returns.
pub(crate) type TxResult<T> = Result<T, TxError>;

/// Writes applied together by [`Tree::apply_batch`].
#[derive(Default)]
pub(crate) struct Batch {
    ops: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Batch {
    /// A batch of these keys and values, taken as they are (no copy).
    pub(crate) fn of(ops: Vec<(Vec<u8>, Vec<u8>)>) -> Self {
        Self { ops }
    }

    pub(crate) fn insert(&mut self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
        self.ops.push((key.as_ref().to_vec(), value.as_ref().to_vec()));
    }
}

/// An open database.
pub(crate) enum Db {
    Sled(sled_kv::SledDb),
    Redb(redb_kv::RedbDb),
}

/// One named tree of a [`Db`]: ordered bytes to bytes. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Tree {
    Sled(sled_kv::SledTree),
    Redb(redb_kv::RedbTree),
}

/// A tree inside a transaction (see [`Db::transaction`]): it sees its own writes.
// A few per transaction, in one `Vec`: boxing redb's table (with the writes it records
// for the redo log) would cost an allocation each.
#[allow(clippy::large_enum_variant)]
pub(crate) enum TxTree<'t> {
    Sled(sled_kv::SledTx),
    Redb(std::cell::RefCell<redb_kv::TxTable<'t>>),
}

/// What a snapshot hands each entry to: the tree's index among those asked, the key,
/// the value.
pub(crate) type Visit<'a> = dyn FnMut(usize, &[u8], &[u8]) -> Result<(), StoreError> + 'a;

impl Db {
    /// Opens (or creates) the engine's database at `opts.path`.
    /// Refuses a directory that holds the other engine's store and none of this one's:
    /// a relay whose `storage.backend` changed must not start empty beside its data.
    /// A switch between engines a crash cut short is finished first, and a directory
    /// whose `CURRENT` file names the other engine is refused (`current.rs`).
    pub(crate) fn open(engine: Engine, opts: &EngineOptions<'_>) -> Result<Self, StoreError> {
        current::finish_switch(opts.path)?;
        current::check_open(opts.path, engine)?;
        let other = match engine {
            Engine::Sled => Engine::Redb,
            Engine::Redb => Engine::Sled,
        };
        if files_of(engine, opts.path).is_empty() && !files_of(other, opts.path).is_empty() {
            return Err(StoreError::Config(format!(
                "{dir} holds a {other} store and storage.backend is {engine}: set \
                 storage.backend = \"{other}\" to run on it, or move it to {engine} first \
                 with `hookrelay migrate --to {engine}` (the relay stopped, storage.backend \
                 still \"{other}\")",
                dir = opts.path.display(),
                other = other.name(),
                engine = engine.name(),
            )));
        }
        match engine {
            Engine::Sled => Ok(Db::Sled(sled_kv::SledDb::open(opts)?)),
            Engine::Redb => Ok(Db::Redb(redb_kv::RedbDb::open(opts)?)),
        }
    }

    pub(crate) fn engine(&self) -> Engine {
        match self {
            Db::Sled(_) => Engine::Sled,
            Db::Redb(_) => Engine::Redb,
        }
    }

    /// The tree `name`, created empty if it is not there.
    pub(crate) fn open_tree(&self, name: &'static str) -> Result<Tree, StoreError> {
        match self {
            Db::Sled(db) => Ok(Tree::Sled(db.open_tree(name)?)),
            Db::Redb(db) => Ok(Tree::Redb(db.open_tree(name)?)),
        }
    }

    /// Every entry of the trees `names` that exist (`visit` gets the tree's index in
    /// `names`): one snapshot on redb (a read transaction); tree by tree on sled, whose
    /// caller keeps writes out meanwhile (`Health::exclusive`). Blocking.
    pub(crate) fn snapshot(
        &self,
        names: &[&'static str],
        visit: &mut Visit<'_>,
    ) -> Result<(), StoreError> {
        match self {
            Db::Sled(db) => db.snapshot(names, visit),
            Db::Redb(db) => db.snapshot(names, visit),
        }
    }

    /// Whether a snapshot of it ([`Self::snapshot`]) is one whatever is written
    /// meanwhile (redb), or needs writes kept out (sled).
    pub(crate) fn snapshots_alone(&self) -> bool {
        matches!(self, Db::Redb(_))
    }

    /// The names of the trees that exist.
    pub(crate) fn tree_names(&self) -> Result<Vec<String>, StoreError> {
        match self {
            Db::Sled(db) => Ok(db.tree_names()),
            Db::Redb(db) => db.tree_names(),
        }
    }

    /// Makes every write so far durable. Blocking; callers share it (`flush.rs`).
    pub(crate) fn flush(&self) -> Result<(), StoreError> {
        match self {
            Db::Sled(db) => db.flush(),
            Db::Redb(db) => db.flush(),
        }
    }

    /// Reports each of the engine's checkpoints to `observer` (redb; sled has none of
    /// its own to report).
    pub(crate) fn observe(&self, observer: std::sync::Arc<dyn crate::store::StoreObserver>) {
        match self {
            Db::Sled(_) => {}
            Db::Redb(db) => db.observe(observer),
        }
    }

    /// Makes every write so far durable in the database's own files (redb: a
    /// checkpoint, its redo log emptied; sled: a flush), before they are moved or
    /// copied. Blocking.
    pub(crate) fn checkpoint(&self) -> Result<(), StoreError> {
        match self {
            Db::Sled(db) => db.flush(),
            Db::Redb(db) => db.checkpoint(),
        }
    }

    /// What a power cut would leave now, copied into `to`, or `false` for an engine
    /// whose loss this cannot provoke in-process (sled: `tests/integration/power_loss.rs`
    /// cuts its power through a FUSE filesystem).
    #[cfg(test)]
    pub(crate) fn crash_image(&self, to: &Path) -> std::io::Result<bool> {
        match self {
            Db::Sled(_) => Ok(false),
            Db::Redb(db) => db.crash_image(to).map(|()| true),
        }
    }

    /// Bytes the database takes on disk.
    pub(crate) fn size_on_disk(&self) -> Result<u64, StoreError> {
        match self {
            Db::Sled(db) => db.size_on_disk(),
            Db::Redb(db) => db.size_on_disk(),
        }
    }

    /// Drops the tree `name`; whether it was there. Only sled ever held the trees an
    /// old layout leaves (`../migrate.rs`): on redb, nothing to drop.
    pub(crate) fn drop_tree(&self, name: &str) -> Result<bool, StoreError> {
        match self {
            Db::Sled(db) if db.tree_names().iter().any(|n| n == name) => db.drop_tree(name),
            Db::Sled(_) | Db::Redb(_) => Ok(false),
        }
    }

    /// Runs `body` over `trees` as one atomic write. sled may run it more than once (on
    /// a conflict), so it must only write through the [`TxTree`]s it is given, which
    /// come in the order of `trees`. An abort ([`TxError::Abort`]) writes nothing and
    /// returns its error.
    pub(crate) fn transaction<T>(
        &self,
        trees: &[&Tree],
        body: impl Fn(&[TxTree<'_>]) -> TxResult<T>,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sled(_) => sled_kv::transaction(trees, body),
            Db::Redb(db) => db.transaction(trees, body),
        }
    }
}

impl Tree {
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, StoreError> {
        match self {
            Tree::Sled(t) => t.get(key.as_ref()),
            Tree::Redb(t) => t.get(key.as_ref()),
        }
    }

    pub(crate) fn contains_key(&self, key: impl AsRef<[u8]>) -> Result<bool, StoreError> {
        match self {
            Tree::Sled(t) => t.contains_key(key.as_ref()),
            Tree::Redb(t) => t.contains_key(key.as_ref()),
        }
    }

    /// Sets `key` to `value`; returns what it held.
    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Bytes>, StoreError> {
        match self {
            Tree::Sled(t) => t.insert(key.as_ref(), value.as_ref()),
            Tree::Redb(t) => t.insert(key.as_ref(), value.as_ref()),
        }
    }

    /// Removes `key`; returns what it held.
    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> Result<Option<Bytes>, StoreError> {
        match self {
            Tree::Sled(t) => t.remove(key.as_ref()),
            Tree::Redb(t) => t.remove(key.as_ref()),
        }
    }

    /// Applies every write of `batch`, all or none.
    pub(crate) fn apply_batch(&self, batch: Batch) -> Result<(), StoreError> {
        match self {
            Tree::Sled(t) => t.apply_batch(batch.ops),
            Tree::Redb(t) => t.apply_batch(batch.ops),
        }
    }

    /// Replaces the values of `batch`'s keys with smaller ones, all or none, so that
    /// the space they gave up is freed. redb keeps a B-tree page whose values shrank
    /// as large as it was (a leaf is only merged with its neighbours when it loses
    /// keys): the keys are removed first, which frees the leaves they emptied, then
    /// written again, packed into as few pages as their new size needs. sled logs
    /// the new values and reclaims the old ones as it compacts its log.
    pub(crate) fn apply_shrinking(&self, batch: Batch) -> Result<(), StoreError> {
        match self {
            Tree::Sled(_) => self.apply_batch(batch),
            Tree::Redb(t) => t.apply_shrinking(batch.ops),
        }
    }

    /// The entries with keys in `range`.
    pub(crate) fn range<K: AsRef<[u8]>, R: RangeBounds<K>>(&self, range: R) -> Iter {
        let bound = |b: Bound<&K>| match b {
            Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let range = (bound(range.start_bound()), bound(range.end_bound()));
        match self {
            Tree::Sled(t) => t.range(range),
            Tree::Redb(t) => t.range(range),
        }
    }

    /// Every entry.
    pub(crate) fn iter(&self) -> Iter {
        self.range::<&[u8], _>(..)
    }

    /// The entries whose keys start with `prefix`.
    pub(crate) fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Iter {
        let prefix = prefix.as_ref();
        match successor(prefix) {
            Some(end) => self.range(prefix.to_vec()..end),
            None => self.range(prefix.to_vec()..),
        }
    }

    /// The entry with the largest key.
    pub(crate) fn last(&self) -> Result<Option<(Bytes, Bytes)>, StoreError> {
        self.iter().next_back().transpose()
    }

    /// How many entries: sled walks the tree, redb keeps the count.
    pub(crate) fn len(&self) -> Result<u64, StoreError> {
        match self {
            Tree::Sled(t) => Ok(t.len()),
            Tree::Redb(t) => t.len(),
        }
    }
}

impl TxTree<'_> {
    pub(crate) fn get(&self, key: impl AsRef<[u8]>) -> TxResult<Option<Bytes>> {
        match self {
            TxTree::Sled(t) => t.get(key.as_ref()),
            TxTree::Redb(t) => redb_kv::tx_get(&t.borrow(), key.as_ref()),
        }
    }

    pub(crate) fn insert(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> TxResult<Option<Bytes>> {
        match self {
            TxTree::Sled(t) => t.insert(key.as_ref(), value.as_ref()),
            TxTree::Redb(t) => {
                redb_kv::tx_insert(&mut t.borrow_mut(), key.as_ref(), value.as_ref())
            }
        }
    }

    pub(crate) fn remove(&self, key: impl AsRef<[u8]>) -> TxResult<Option<Bytes>> {
        match self {
            TxTree::Sled(t) => t.remove(key.as_ref()),
            TxTree::Redb(t) => redb_kv::tx_remove(&mut t.borrow_mut(), key.as_ref()),
        }
    }
}

/// The files of `engine`'s database in `dir` (those that exist).
pub(crate) fn files_of(engine: Engine, dir: &Path) -> Vec<std::path::PathBuf> {
    let names: &[&str] = match engine {
        Engine::Redb => &[REDB_FILE],
        Engine::Sled => &["conf", "db", "blobs"],
    };
    let mut files: Vec<_> = names.iter().map(|n| dir.join(n)).filter(|p| p.exists()).collect();
    if engine == Engine::Sled {
        // sled's snapshots: `snap.{hex}`.
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with("snap.") {
                    files.push(entry.path());
                }
            }
        }
    }
    files
}

/// The smallest key greater than every key starting with `prefix`, if there is one
/// (none when the prefix is empty or all `0xff`).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests;
