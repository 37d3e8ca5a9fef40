//! [`Db`]'s operations: the open, its trees, one transaction over several, the durable
//! flush, snapshots and checkpoints, each a match over the two engines.

use super::*;

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
