//! Group fsync: concurrent writers that need durability share one [`Db::flush`] (sled:
//! its flush and an `fdatasync` of its log; redb: an append and `fdatasync` of its redo
//! log).
//!
//! A writer that needs its write durable asks for a flush that *starts* after its
//! write. While one flush runs, every writer arriving waits; when it ends, one of them
//! starts the next flush for all of them. Under load a flush covers many writes; alone,
//! a writer flushes at once. Callers are on the blocking pool, never on a runtime
//! thread.
//!
//! At a gentle rate nothing overlaps: each callback's ack flushes, and so would its
//! attempt record a millisecond or two later, two `fdatasync`s per callback. Most
//! records ride the next group's write instead (`ride.rs`); a writer that writes on
//! its own but can afford to wait a little (a `linger` given to [`GroupFlush::flush`]:
//! an ordered delivery's record) waits, as PostgreSQL's `commit_delay` does, for the
//! next flush somebody else starts, if the flushes that do not linger (the acks) have
//! been coming often enough that one is expected within the linger (`store::cadence`);
//! otherwise it flushes at once. Its write is durable when it returns either way: only
//! who starts the flush changes.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::engine::Db;
use super::EmbeddedState;
use crate::lock::lock;
use crate::store::cadence::{Cadence, RECORD_LINGER};
use crate::store::StoreError;

/// How the embedded store's writes wait for durability, all through its one
/// [`GroupFlush`].
impl EmbeddedState {
    /// Waits for a shared fsync that starts after this call, whatever the durability
    /// setting.
    pub(super) fn flush_now(&self) -> Result<(), StoreError> {
        self.flushed(None)
    }

    /// Waits until everything written so far is durable, if the store is `durable`.
    pub(super) fn durable(&self) -> Result<(), StoreError> {
        if self.durable {
            self.flushed(None)?;
        }
        Ok(())
    }

    /// [`Self::durable`] for a write that may wait up to [`RECORD_LINGER`] to share a
    /// flush an ack is expected to start: an attempt record.
    pub(super) fn durable_lingering(&self) -> Result<(), StoreError> {
        if self.durable {
            self.flushed(Some(RECORD_LINGER))?;
        }
        Ok(())
    }

    fn flushed(&self, linger: Option<Duration>) -> Result<(), StoreError> {
        self.flusher
            .flush(&self.db, linger)
            .map_err(|message| StoreError::Backend { backend: self.db.engine().name(), message })
    }
}

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
    /// When the writers that do not linger (the acks' groups) ask for a flush: when
    /// the next is expected.
    eager: Cadence,
}

/// See the module docs.
#[derive(Default)]
pub(super) struct GroupFlush {
    state: Mutex<State>,
    ended: Condvar,
}

impl GroupFlush {
    /// Returns once a flush of `db` that started after this call has ended, with its
    /// result. With a `linger`, first waits up to that long for somebody else to start
    /// the flush, when one that does not linger is expected within it (see the module
    /// docs): the write is as durable when this returns either way.
    fn flush(&self, db: &Db, linger: Option<Duration>) -> Result<(), String> {
        let mut s = lock(&self.state);
        // The first flush to start from now on covers our write.
        let need = s.started;
        let now = Instant::now();
        // Lingering: until then, no flush is started for us, but one somebody else
        // starts is waited for (its end wakes us, not its start: a wake-up fewer
        // beside the flush).
        let linger_until = match linger {
            None => {
                s.eager.noted(now);
                None
            }
            Some(linger) => s.eager.linger_until(now, linger),
        };
        loop {
            if s.ended > need {
                return if s.ok_below > need {
                    Ok(())
                } else {
                    Err(s.last_error.clone().unwrap_or_else(|| "flush failed".into()))
                };
            }
            if !s.running {
                let left = linger_until.map(|d| d.saturating_duration_since(Instant::now()));
                if let Some(left) = left.filter(|l| !l.is_zero()) {
                    s = self
                        .ended
                        .wait_timeout(s, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0;
                    continue;
                }
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

    use crate::store::embedded::engine::{Engine, EngineOptions};

    /// A database of `engine` in `dir`, flushed only when asked.
    fn open(engine: Engine, dir: &std::path::Path) -> Arc<Db> {
        let opts = EngineOptions {
            path: dir,
            cache_capacity_bytes: 1 << 20,
            compression: false,
            flush: crate::store::embedded::background_flush::Pacing::fixed(
                std::time::Duration::from_secs(60),
            ),
        };
        Arc::new(Db::open(engine, &opts).unwrap())
    }

    #[test]
    fn concurrent_writers_share_flushes() {
        for engine in [Engine::Sled, Engine::Redb] {
            let dir = tempfile::tempdir().unwrap();
            let db = open(engine, dir.path());
            let tree = db.open_tree("t").unwrap();
            let group = Arc::new(GroupFlush::default());
            let threads: Vec<_> = (0..16u32)
                .map(|i| {
                    let (db, tree, group) = (db.clone(), tree.clone(), group.clone());
                    std::thread::spawn(move || {
                        for j in 0..20u32 {
                            tree.insert((i * 100 + j).to_be_bytes(), vec![0u8; 64]).unwrap();
                            group.flush(&db, None).unwrap();
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

    /// The gentle rate: an ack flushes every 4 ms, and a record is written 1 ms after
    /// each ack's flush. Lingering, each record shares the next ack's flush: about one
    /// flush per ack, where flushing at once makes two.
    #[test]
    fn a_lingering_writer_shares_the_next_ack_flush() {
        const ACKS: u32 = 40;
        let dir = tempfile::tempdir().unwrap();
        let db = open(Engine::Redb, dir.path());
        let tree = db.open_tree("t").unwrap();
        let group = Arc::new(GroupFlush::default());
        let (flushed, acked) = std::sync::mpsc::channel::<()>();
        let acker = {
            let (db, tree, group) = (db.clone(), tree.clone(), group.clone());
            std::thread::spawn(move || {
                for i in 0..ACKS {
                    tree.insert(i.to_be_bytes(), vec![1u8; 64]).unwrap();
                    group.flush(&db, None).unwrap();
                    let _ = flushed.send(());
                    std::thread::sleep(Duration::from_millis(4));
                }
            })
        };
        let mut records = 0u32;
        while acked.recv().is_ok() {
            std::thread::sleep(Duration::from_millis(1));
            tree.insert((1000 + records).to_be_bytes(), vec![2u8; 64]).unwrap();
            group.flush(&db, Some(Duration::from_millis(20))).unwrap();
            records += 1;
        }
        acker.join().unwrap();
        let flushes = lock(&group.state).started;
        assert_eq!(records, ACKS);
        assert!(
            flushes <= u64::from(ACKS) * 5 / 4,
            "{ACKS} acks and {records} records took {flushes} flushes (sharing: about {ACKS})"
        );
        assert_eq!(lock(&group.state).ended, flushes, "a flush did not end");
    }

    /// With no acks coming (none yet, or none for a while), a lingering writer does not
    /// wait: it flushes at once.
    #[test]
    fn a_lingering_writer_alone_flushes_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(Engine::Redb, dir.path());
        let tree = db.open_tree("t").unwrap();
        let group = GroupFlush::default();
        let linger = Duration::from_secs(2);
        let took = |n: u32| {
            tree.insert(n.to_be_bytes(), vec![0u8; 64]).unwrap();
            let started = Instant::now();
            group.flush(&db, Some(linger)).unwrap();
            started.elapsed()
        };
        assert!(took(0) < linger / 2, "lingered with no ack ever seen");
        // Acks every 10 ms, then none: after two intervals without one, no linger.
        for n in 1..6u32 {
            tree.insert(n.to_be_bytes(), vec![0u8; 64]).unwrap();
            group.flush(&db, None).unwrap();
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(took(10) < linger / 2, "lingered after the acks stopped");
        assert_eq!(lock(&group.state).started, 7);
    }
}
