//! Group fsync: concurrent writers that need durability share one [`Db::flush`] (sled:
//! its flush and an `fdatasync` of its log; redb: an append and `fdatasync` of its redo
//! log).
//!
//! A writer that needs its write durable asks for a flush that *starts* after its
//! write. While one flush runs, every writer arriving waits; when it ends, one of them
//! starts the next flush for all of them. Under load a flush covers many writes; alone,
//! a writer flushes at once. Callers are on the blocking pool, never on a runtime
//! thread.

use std::sync::{Condvar, Mutex};

use super::engine::Db;
use crate::lock::lock;

#[derive(Default)]
struct State {
    /// Flushes started so far (the next one gets this number).
    started: u64,
    /// Every flush numbered below this has ended.
    ended: u64,
    running: bool,
    /// The highest-numbered flush that succeeded, plus one.
    ok_below: u64,
    last_error: Option<String>,
}

/// See the module docs.
#[derive(Default)]
pub(super) struct GroupFlush {
    state: Mutex<State>,
    ended: Condvar,
}

impl GroupFlush {
    /// Returns once a flush of `db` that started after this call has ended, with its
    /// result.
    pub(super) fn flush(&self, db: &Db) -> Result<(), String> {
        let mut s = lock(&self.state);
        // The first flush to start from now on covers our write.
        let need = s.started;
        loop {
            if s.ended > need {
                return if s.ok_below > need {
                    Ok(())
                } else {
                    Err(s.last_error.clone().unwrap_or_else(|| "flush failed".into()))
                };
            }
            if !s.running {
                let number = s.started;
                s.started += 1;
                s.running = true;
                drop(s);
                let result = db.flush().map_err(|e| e.to_string());
                s = lock(&self.state);
                s.running = false;
                s.ended = number + 1;
                match result {
                    Ok(()) => s.ok_below = number + 1,
                    Err(e) => s.last_error = Some(e),
                }
                self.ended.notify_all();
                continue;
            }
            s = self.ended.wait(s).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn concurrent_writers_share_flushes() {
        use crate::store::embedded::engine::{Engine, EngineOptions};
        for engine in [Engine::Sled, Engine::Redb] {
            let dir = tempfile::tempdir().unwrap();
            let opts = EngineOptions {
                path: dir.path(),
                cache_capacity_bytes: 1 << 20,
                compression: false,
                flush: crate::store::embedded::background_flush::Pacing::fixed(
                    std::time::Duration::from_secs(60),
                ),
            };
            let db = Arc::new(Db::open(engine, &opts).unwrap());
            let tree = db.open_tree("t").unwrap();
            let group = Arc::new(GroupFlush::default());
            let threads: Vec<_> = (0..16u32)
                .map(|i| {
                    let (db, tree, group) = (db.clone(), tree.clone(), group.clone());
                    std::thread::spawn(move || {
                        for j in 0..20u32 {
                            tree.insert((i * 100 + j).to_be_bytes(), vec![0u8; 64]).unwrap();
                            group.flush(&db).unwrap();
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            let flushes = lock(&group.state).started;
            assert!(flushes < 320, "{engine:?}: 320 durable writes took {flushes} flushes");
            assert!(flushes > 0);
        }
    }
}
