//! What only the store can tell of `[storage]`, settled once the config's own checks
//! have passed: the engine an unset backend runs on (found from what `data_dir`
//! holds), what a memory limit means on it, and whether the PostgreSQL URL's
//! parameters make sense. The config checks syntax and names; the daemon's assembly
//! (and `hookrelay check-config`, `migrate`) calls [`settle`] after it.

use crate::config::{StorageBackend, StorageConfig, RELAY_RESERVE_BYTES};

/// Completes `storage` (an unset backend becomes the engine `data_dir` holds, and
/// `sled_found` says when that is an earlier release's sled store) and returns what is
/// wrong with it, every problem naming its key and what to do.
pub(crate) fn settle(storage: &mut StorageConfig) -> Vec<String> {
    let mut problems = Vec::new();
    if storage.backend.is_none() {
        match engine_in(&storage.data_dir) {
            Ok(found) => {
                let backend = found.unwrap_or(StorageBackend::Redb);
                storage.sled_found = backend == StorageBackend::Sled;
                storage.backend = Some(backend);
            }
            Err(problem) => problems.push(problem),
        }
    }
    if storage.backend() == StorageBackend::Postgres {
        if let Some(url) = &storage.postgres.resolved_url {
            problems.extend(postgres_url_problem(url.expose(), storage));
        }
    }
    if let Some(limit) = storage.memory_limit_bytes {
        let floor = RELAY_RESERVE_BYTES + 16 * 1024 * 1024;
        // On a sled store the backend was left to find, the limit is not kept, and
        // the notice at start says so: a new configuration on an old volume starts.
        if storage.backend() != StorageBackend::Redb && !storage.sled_found {
            problems.push(
                "storage.memory_limit_bytes: only backend = \"redb\" keeps to a memory \
                 limit (sled's memory grows with what it holds; PostgreSQL's is the \
                 database's): set backend = \"redb\" (and move the data with `hookrelay \
                 migrate --to redb`), or remove memory_limit_bytes"
                    .into(),
            );
        } else if limit < floor {
            problems.push(format!(
                "storage.memory_limit_bytes: {limit} is below the floor of {floor} (128 MiB: \
                 112 MiB for the relay itself, 16 MiB at least for the engine's cache)"
            ));
        }
    }
    problems
}

/// What is wrong with `url` as a PostgreSQL URL (libpq's TLS parameters included), if
/// anything; never quoting it (it holds a password).
fn postgres_url_problem(url: &str, config: &StorageConfig) -> Option<String> {
    super::postgres::url_problem(url, &super::tls_settings(config))
}

/// The embedded backend whose store `dir` holds, if any: what an unset
/// `storage.backend` runs on: the one its `CURRENT` file names (written by `hookrelay
/// migrate --to`), else the one whose files are there. A directory holding both
/// engines' stores and no `CURRENT` (a migration by a build before it) is a problem to
/// name, not a guess: the one left beside it may be the stale one.
pub(crate) fn engine_in(dir: &std::path::Path) -> Result<Option<StorageBackend>, String> {
    use super::embedded::engine::{current, files_of, Engine};
    // After a `migrate --to`, its CURRENT file names the store to run on.
    match current::current(dir).map_err(|e| e.to_string())? {
        Some(Engine::Sled) => return Ok(Some(StorageBackend::Sled)),
        Some(Engine::Redb) => return Ok(Some(StorageBackend::Redb)),
        None => {}
    }
    let (sled, redb) = (files_of(Engine::Sled, dir), files_of(Engine::Redb, dir));
    match (sled.is_empty(), redb.is_empty()) {
        (true, true) => Ok(None),
        (false, true) => Ok(Some(StorageBackend::Sled)),
        (true, false) => Ok(Some(StorageBackend::Redb)),
        (false, false) => Err(format!(
            "storage.backend: unset, and {} holds both a sled and a redb store (a copy \
             `hookrelay migrate --to` made beside its source): set backend to the one to run \
             on (\"redb\" after `migrate --to redb`, \"sled\" after `--to sled`), and once the \
             relay runs remove the other's files (sled: {}; redb: {})",
            dir.display(),
            super::names(&sled),
            super::names(&redb)
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// `[storage]` on `data` after `edit`, settled: the settings and the problems.
    fn settled(data: &Path, edit: impl FnOnce(&mut StorageConfig)) -> (StorageConfig, Vec<String>) {
        let mut storage = StorageConfig { data_dir: data.to_owned(), ..StorageConfig::default() };
        edit(&mut storage);
        let problems = settle(&mut storage);
        (storage, problems)
    }

    #[test]
    fn an_unset_backend_runs_on_the_store_the_data_directory_holds_and_redb_on_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let found = |s: &StorageConfig| (s.backend(), s.sled_found);
        // New (the directory not even there): redb.
        let (s, p) = settled(&data, |_| {});
        assert_eq!((found(&s), p.len()), ((StorageBackend::Redb, false), 0));
        // An earlier relay's sled store: kept, and said.
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("conf"), b"").unwrap();
        std::fs::write(data.join("db"), b"").unwrap();
        let (s, p) = settled(&data, |_| {});
        assert_eq!((found(&s), p.len()), ((StorageBackend::Sled, true), 0));
        let printed = toml::to_string(&s).unwrap();
        assert!(printed.contains("backend = \"sled\""), "printed as what runs: {printed}");
        // A memory limit there (a new configuration on an old volume): taken, not kept
        // (the notice at start says so), and sled's cache is its own setting.
        let limit = |s: &mut StorageConfig| s.memory_limit_bytes = Some(256 << 20);
        let (s, p) = settled(&data, limit);
        assert_eq!((found(&s), p.len()), ((StorageBackend::Sled, true), 0), "{p:?}");
        assert_eq!(s.engine_cache_bytes(), 64 << 20);
        // Named sled, a limit is refused, naming the way to redb.
        let (_, p) = settled(&data, |s| {
            limit(s);
            s.backend = Some(StorageBackend::Sled);
        });
        assert!(p.iter().any(|p| p.contains("migrate --to redb")), "{p:?}");
        // Below the floor on redb: refused, with the floor.
        let (_, p) = settled(&data, |s| {
            s.memory_limit_bytes = Some(64 << 20);
            s.backend = Some(StorageBackend::Redb);
        });
        assert!(p.iter().any(|p| p.contains("below the floor")), "{p:?}");
        // Both (a copy beside its source): named, not guessed.
        std::fs::write(data.join("hookrelay.redb"), b"").unwrap();
        let (_, p) = settled(&data, |_| {});
        assert!(p.iter().any(|p| p.contains("holds both a sled and a redb store")), "{p:?}");
        // Both, and the CURRENT file a migration writes: the one it names.
        std::fs::write(data.join("CURRENT"), "redb\n").unwrap();
        assert_eq!(settled(&data, |_| {}).0.backend(), StorageBackend::Redb);
        std::fs::remove_file(data.join("CURRENT")).unwrap();
        // Set, it wins over what the directory holds (the engine refuses a mismatch at
        // open).
        let (s, p) = settled(&data, |s| s.backend = Some(StorageBackend::Redb));
        assert_eq!((found(&s), p.len()), ((StorageBackend::Redb, false), 0));
        // The redb store alone: redb.
        for f in ["conf", "db"] {
            std::fs::remove_file(data.join(f)).unwrap();
        }
        assert_eq!(settled(&data, |_| {}).0.backend(), StorageBackend::Redb);
    }
}
