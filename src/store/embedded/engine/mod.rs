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
mod db;
mod redb_kv;
mod redo;
mod sled_kv;
mod tree;

use std::ops::Deref;
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

#[cfg(test)]
mod tests;
