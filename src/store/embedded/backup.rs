//! A backup of the running embedded store (`store/backup.rs` is its format), and the
//! restore of one into a data directory that holds no store.
//!
//! The backup is one snapshot: redb's read transaction sees every tree as of one
//! commit while writes go on; sled takes none across trees, so writes wait while it is
//! read (`Health::exclusive`: ingest pauses for its length, never failing). The restore
//! is built beside the data and switched to in one rename, as `copy.rs` does for a
//! migration: a restore cut short leaves no half store to start on.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::engine::current::{self, finish_switch, staging, switch_to};
use super::engine::{files_of, Batch, Db, Engine, EngineOptions};
use super::{EmbeddedState, SCHEMA_VERSION, TREES};
use crate::store::backup::{self, BackupError, Header, Summary, Writer};
use crate::store::StoreError;

/// The oldest layout a backup may hold to be restored: its trees are written as they
/// are (its `meta` says which layout), and the relay's first open upgrades them, as it
/// upgrades a data directory of that layout (version 2: the dedup index, `dedup.rs`).
const OLDEST_RESTORED: u32 = 2;

/// Entries written per batch at a restore: bounded memory whatever the backup holds.
const BATCH: usize = 2048;

fn io(e: std::io::Error) -> StoreError {
    StoreError::Backend { backend: "backup", message: format!("writing the backup: {e}") }
}

impl EmbeddedState {
    /// Writes a backup of every tree to `out`; returns (entries, bytes, SHA-256 hex).
    /// Blocking.
    pub(super) fn backup(
        &self,
        mut out: Box<dyn Write + Send>,
    ) -> Result<(u64, u64, String), StoreError> {
        let header = Header {
            schema: SCHEMA_VERSION,
            engine: self.db.engine().name().to_owned(),
            created_at_us: crate::clock::now_us(),
            trees: TREES.iter().map(|t| (*t).to_owned()).collect(),
        };
        let mut take = || {
            let mut w = Writer::start(&mut out, &header).map_err(io)?;
            self.db.snapshot(&TREES, &mut |tree, k, v| {
                // TREES is a short list: its index fits.
                w.entry(tree as u16, k, v).map_err(io)
            })?;
            w.finish().map_err(io)
        };
        if self.db.snapshots_alone() {
            take()
        } else {
            self.health.exclusive(take)
        }
    }
}

/// What a restore did, to print.
#[derive(Debug)]
pub(crate) struct Restored {
    pub(crate) summary: Summary,
    pub(crate) engine: Engine,
    pub(crate) dir: PathBuf,
}

fn refuse(message: String) -> StoreError {
    StoreError::Config(message)
}

fn damaged(e: BackupError) -> StoreError {
    refuse(e.to_string())
}

/// Restores the backup at `from` into `dir` (which must hold no store) on `engine`.
/// The file is checked whole before anything is written. Blocking.
pub(crate) fn restore(
    from: &Path,
    dir: &Path,
    engine: Engine,
    cache_capacity_bytes: u64,
    compression: bool,
) -> Result<Restored, StoreError> {
    let open = || {
        std::fs::File::open(from)
            .map_err(|e| refuse(format!("cannot read the backup {}: {e}", from.display())))
    };
    let summary = backup::verify(open()?).map_err(damaged)?;
    if !(OLDEST_RESTORED..=SCHEMA_VERSION).contains(&summary.header.schema) {
        return Err(refuse(format!(
            "the backup is of store layout version {}, this build restores versions \
             {OLDEST_RESTORED} to {SCHEMA_VERSION}: restore it with the hookrelay that took it, \
             start that on it once, then upgrade",
            summary.header.schema
        )));
    }
    if let Some(unknown) = summary.header.trees.iter().find(|t| !TREES.contains(&t.as_str())) {
        return Err(refuse(format!(
            "the backup holds a tree this build does not know ({unknown}): is it from a newer \
             hookrelay?"
        )));
    }
    finish_switch(dir)?;
    let existing: Vec<PathBuf> =
        [Engine::Redb, Engine::Sled].into_iter().flat_map(|e| files_of(e, dir)).collect();
    if !existing.is_empty() || current::current(dir)?.is_some() {
        return Err(refuse(format!(
            "{} holds a store already ({}): a restore goes into an empty data directory; stop \
             the relay and move the directory away (keep it until the restored store runs), \
             or give storage.data_dir another",
            dir.display(),
            existing
                .first()
                .map_or_else(|| current::CURRENT.to_owned(), |p| p.display().to_string())
        )));
    }
    let staging = staging(dir, engine);
    if staging.exists() {
        // What an interrupted restore left: never read, started again.
        std::fs::remove_dir_all(&staging).map_err(|e| {
            refuse(format!("removing the unfinished restore {}: {e}", staging.display()))
        })?;
    }
    {
        let opts = EngineOptions {
            path: &staging,
            cache_capacity_bytes,
            compression,
            flush: super::background_flush::Pacing::fixed(Duration::from_secs(1)),
        };
        let target = Db::open(engine, &opts)?;
        let trees: Vec<_> =
            TREES.iter().map(|name| target.open_tree(name)).collect::<Result<_, _>>()?;
        let mut batches: Vec<(Batch, usize)> = TREES.iter().map(|_| Default::default()).collect();
        let mut failed = None;
        let read = backup::read(open()?, |name, k, v| {
            let i = TREES.iter().position(|t| *t == name).unwrap_or_default();
            let (batch, n) = &mut batches[i];
            batch.insert(k, v);
            *n += 1;
            if *n >= BATCH {
                if let Err(e) = trees[i].apply_batch(std::mem::take(batch)) {
                    failed = Some(e);
                    return Err(BackupError::Damaged("the restore's write failed".into()));
                }
                *n = 0;
            }
            Ok(())
        });
        if let Some(e) = failed {
            return Err(e);
        }
        let read = read.map_err(damaged)?;
        if read.sha256 != summary.sha256 {
            return Err(refuse(
                "the backup changed while it was restored: restore it again".into(),
            ));
        }
        for (tree, (batch, _)) in trees.iter().zip(batches) {
            tree.apply_batch(batch)?;
        }
        // In the database's own files: they are what the switch moves.
        target.checkpoint()?;
    }
    switch_to(dir, engine)?;
    Ok(Restored { summary, engine, dir: dir.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::super::EmbeddedStore;
    use super::*;
    use crate::store::fixtures::{plan, received};
    use crate::store::{Dispatch, EventFilter, EventLog, Upkeep};

    /// A `Write` into a shared buffer (the backup takes its writer whole).
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Every event's id, status and destinations, newest first.
    async fn events(store: &EmbeddedStore) -> Vec<String> {
        let page =
            store.list_events(EventFilter { limit: 1000, ..Default::default() }).await.unwrap();
        page.iter()
            .map(|e| format!("{} {:?} {:?}", e.id, e.meta.status, e.meta.destinations))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_restores_onto_either_engine_and_writes_meanwhile_are_not_in_it() {
        for (from, to) in [
            (Engine::Redb, Engine::Redb),
            (Engine::Redb, Engine::Sled),
            (Engine::Sled, Engine::Redb),
            (Engine::Sled, Engine::Sled),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let store = super::super::testutil::open_on(from, &dir.path().join("data"));
            let mut ids = Vec::new();
            for n in 0..20u64 {
                let body = format!("{{\"n\":{n}}}");
                ids.push(
                    store
                        .append(received("demo", "ActionCreated", 1_000_000 + n, &body))
                        .await
                        .unwrap(),
                );
            }
            store.dispatch(vec![plan(ids[0], 1, &["crm"])], 2_000_000).await.unwrap();
            let before = events(&store).await;
            let out = Shared::default();
            // Writes go on while it is taken: each is wholly in it or wholly not.
            let writer = {
                let store = store.clone();
                tokio::spawn(async move {
                    for n in 0..50u64 {
                        let body = format!("{{\"late\":{n}}}");
                        store
                            .append(received("demo", "ActionCreated", 3_000_000 + n, &body))
                            .await
                            .unwrap();
                    }
                })
            };
            let (entries, _, sha256) = store.backup(Box::new(out.clone())).await.unwrap();
            writer.await.unwrap();
            let file = dir.path().join("store.backup");
            std::fs::write(&file, out.0.lock().unwrap().as_slice()).unwrap();
            let summary = backup::verify(std::fs::File::open(&file).unwrap()).unwrap();
            assert_eq!((summary.entries, summary.sha256.clone()), (entries, sha256));
            assert_eq!(summary.header.engine, from.name());
            store.close().await.unwrap();
            drop(store);

            let target = dir.path().join("restored");
            let done = restore(&file, &target, to, 1 << 20, false).unwrap();
            assert_eq!(done.engine, to);
            let restored = super::super::testutil::open_on(to, &target);
            let after = events(&restored).await;
            assert!(
                after.len() >= before.len() && after.len() <= before.len() + 50,
                "{from:?}→{to:?}"
            );
            let missing: Vec<&String> = before.iter().filter(|e| !after.contains(e)).collect();
            assert!(missing.is_empty(), "{from:?}→{to:?}: the events before it: {missing:?}");
            // Restoring into a directory that holds a store is refused, naming it.
            let again = restore(&file, &target, to, 1 << 20, false).unwrap_err().to_string();
            assert!(again.contains("holds a store already"), "{again}");
            restored.close().await.unwrap();
        }
    }

    /// A backup of layout 2 (taken by the build before the dedup index was filed by
    /// expiry) restores, and the first open upgrades it: its dedup keys still hold.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_backup_of_layout_2_restores_and_is_upgraded_at_open() {
        use crate::store::backup::{Header, Writer};
        use crate::store::lifecycle::DedupEntry;
        let dir = tempfile::tempdir().unwrap();
        let header = Header {
            schema: 2,
            engine: "redb".into(),
            created_at_us: 0,
            trees: TREES.iter().map(|t| (*t).to_owned()).collect(),
        };
        let tree = |name: &str| TREES.iter().position(|t| *t == name).unwrap() as u16;
        let until_us = crate::clock::now_us() + 600_000_000;
        let entry = DedupEntry { original: crate::store::EventId::new(42), until_us };
        let out = Shared::default();
        let mut w = Writer::start(out.clone(), &header).unwrap();
        w.entry(tree(super::super::META), super::super::SCHEMA_KEY, b"2").unwrap();
        w.entry(tree(super::super::DEDUP), &[7; 16], &super::super::keys::encode_dedup(&entry))
            .unwrap();
        w.finish().unwrap();
        let file = dir.path().join("v2.backup");
        std::fs::write(&file, out.0.lock().unwrap().as_slice()).unwrap();
        let target = dir.path().join("data");
        restore(&file, &target, Engine::Redb, 1 << 20, false).unwrap();
        let store = super::super::testutil::open_on(Engine::Redb, &target);
        assert_eq!(store.inner.dedup_entry(&[7; 16]).unwrap(), Some(entry));
        let schema = store.inner.meta.get(super::super::SCHEMA_KEY).unwrap();
        assert_eq!(schema.as_deref(), Some(SCHEMA_VERSION.to_string().as_bytes()));
        store.close().await.unwrap();
    }

    #[test]
    fn a_damaged_backup_restores_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bad.backup");
        std::fs::write(&file, b"HOOKRELAY-BACKUP 1\n{\"schema\":2,\"engine\":\"redb\",\"created_at_us\":0,\"trees\":[]}\n\x01").unwrap();
        let target = dir.path().join("data");
        let e = restore(&file, &target, Engine::Redb, 1 << 20, false).unwrap_err().to_string();
        assert!(e.contains("ends early"), "{e}");
        assert!(files_of(Engine::Redb, &target).is_empty());
    }
}
