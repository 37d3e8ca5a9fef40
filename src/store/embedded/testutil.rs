//! Opening the embedded store in tests: one set of options, a retry while a store
//! dropped just before still holds its file lock.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{CountPace, EmbeddedOptions, EmbeddedStore, Engine};
use crate::store::StoreError;

/// Opens the sled store in `dir`.
pub(crate) fn open(dir: &Path) -> EmbeddedStore {
    open_on(Engine::Sled, dir)
}

/// The tests' options: a small cache, durable, quick to give up on a stuck write.
pub(crate) fn options(engine: Engine, dir: &Path) -> EmbeddedOptions {
    EmbeddedOptions {
        engine,
        path: dir.to_path_buf(),
        cache_capacity_bytes: 1 << 20,
        compression: true,
        flush_interval: Duration::from_millis(500),
        durable: true,
        commit_max_batch: 64,
        write_timeout: Duration::from_secs(30),
        observer: Arc::new(crate::store::NoObserver),
        count_pace: CountPace::SERVICE,
    }
}

/// Opens the store in `dir` on `engine`. A store dropped just before may still be
/// held by the engine's flusher thread for a moment (its file lock): retry briefly.
pub(crate) fn open_on(engine: Engine, dir: &Path) -> EmbeddedStore {
    open_paced(engine, dir, CountPace::SERVICE)
}

/// [`open_on`], with the queue count behind the open going at `pace`.
pub(crate) fn open_paced(engine: Engine, dir: &Path, pace: CountPace) -> EmbeddedStore {
    let opts = EmbeddedOptions { count_pace: pace, ..options(engine, dir) };
    retry_open(&opts).unwrap_or_else(|e| panic!("cannot open the test store: {e}"))
}

/// Opens the store in `dir` on `engine`, retrying for up to 10 s only while the file
/// lock is still held by a store dropped just before (sled releases it from its
/// flusher thread); any other error is returned at once, for tests that expect one.
pub(crate) fn try_open_on(engine: Engine, dir: &Path) -> Result<EmbeddedStore, StoreError> {
    retry_open(&options(engine, dir))
}

/// Opens with `opts`, retrying while a store dropped just before holds the file lock.
fn retry_open(opts: &EmbeddedOptions) -> Result<EmbeddedStore, StoreError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match EmbeddedStore::open(opts) {
            Err(e)
                if e.to_string().contains("in use by another process")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            result => return result,
        }
    }
}

/// The bare engine database in `dir` (no layout of the store's own), to write what an
/// older build left there.
pub(crate) fn engine_db(engine: Engine, dir: &Path) -> super::engine::Db {
    let opts = super::engine::EngineOptions {
        path: dir,
        cache_capacity_bytes: 1 << 20,
        compression: true,
        flush: super::background_flush::Pacing::fixed(Duration::from_millis(500)),
    };
    super::engine::Db::open(engine, &opts).expect("open the engine's database")
}
