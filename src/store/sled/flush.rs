//! Group fsync: concurrent writers that need durability share one `Db::flush` and one
//! `fdatasync` of sled's log file.
//!
//! Why both: on Linux, sled 0.34's `Db::flush` writes its log with `pwrite` and ends
//! with `sync_file_range(WAIT_BEFORE | WRITE | WAIT_AFTER)`, not `fsync`; only its
//! background flusher calls `sync_all`, every `flush_interval`. `sync_file_range`
//! writes no metadata (the log's growing size and its new blocks) and does not flush
//! the device's cache, so a power cut could lose writes `Db::flush` had returned for:
//! `tests/integration/power_loss.rs` lost 170 of 312 acknowledged callbacks at its first cut.
//! The `fdatasync` after it commits them.
//!
//! A writer that needs its write durable asks for a flush that *starts* after its
//! write. While one flush runs, every writer arriving waits; when it ends, one of them
//! starts the next flush for all of them. Under load a flush covers many writes; alone,
//! a writer flushes at once. Callers are on the blocking pool, never on a runtime
//! thread.

use std::sync::{Condvar, Mutex};

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
    /// sled's log file (`{data_dir}/db`), fsynced after each `Db::flush`.
    log: Option<std::fs::File>,
}

impl GroupFlush {
    /// Flushes for `db`, whose log file is `log`.
    pub(super) fn new(log: std::fs::File) -> Self {
        Self { log: Some(log), ..Self::default() }
    }

    /// Returns once a flush that started after this call has ended, with its result.
    pub(super) fn flush(&self, db: &sled::Db) -> Result<(), String> {
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
                let result = db.flush().map(|_| ()).map_err(|e| e.to_string()).and_then(|()| {
                    self.log.as_ref().map_or(Ok(()), |log| {
                        log.sync_data().map_err(|e| format!("fdatasync of sled's log: {e}"))
                    })
                });
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
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(dir.path()).open().unwrap();
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
        assert!(flushes < 320, "320 durable writes took {flushes} flushes");
        assert!(flushes > 0);
    }
}
