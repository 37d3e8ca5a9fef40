//! Free-space admission: while the data directory's filesystem has less free space
//! than the configured floor, the relay makes no write of its own choosing, before the
//! store ever sees ENOSPC. A write that fails half-way on a full disk is where stores
//! lose or wedge data (sled does both), and on sled every write, a delete included,
//! appends to the log before any space comes back. Below the floor:
//! - callbacks are refused (their connections are closed, never answered: the
//!   upstream retries);
//! - dispatch, new delivery attempts, the dedup purge and retention wait;
//! - what is already in flight finishes: a group being committed, attempts being
//!   recorded (a few KiB, which is what the floor is for), and the final flush of a
//!   shutdown, so SIGTERM still exits 0.
//!
//! Once space is back above the floor everything resumes by itself.
//!
//! A poll alone is jumped by a fast fill (8 clients posting 16 KiB callbacks emptied a
//! 64 MiB tmpfs between two looks, issue 40), so writes are also **admitted against a
//! budget** ([`Budget`], pure): each measurement grants half the room above the floor;
//! a writer takes its bytes times the engine's measured write amplification out of it
//! before it writes; when the budget runs out the writer measures again before
//! writing. Half, each time: however the engine's growth lags or leads what was
//! admitted, a write is never admitted past the floor unless the engine writes more
//! than twice the amplification measured so far.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::internal_events::{InternalEvent, StorageCrossed};
use crate::metrics::Metrics;
use crate::shutdown::Stop;

mod budget;

pub(crate) use budget::Budget;

/// How often free space is measured...
const INTERVAL: Duration = Duration::from_secs(1);
/// ...and how often once it is within twice the floor, where a burst of callbacks
/// could cross it between two looks.
const CLOSE_INTERVAL: Duration = Duration::from_millis(100);

/// How often a writer held below the floor looks again.
pub(crate) const HOLD_POLL: Duration = Duration::from_millis(200);

/// The floor and the last measurement.
pub(crate) struct Space {
    path: PathBuf,
    min_free_bytes: u64,
    min_free_percent: f64,
    free: AtomicU64,
    total: AtomicU64,
    below: AtomicBool,
    /// False for a store on another machine (PostgreSQL): nothing to measure here.
    local: bool,
    /// What writers may take before the next measurement.
    budget: std::sync::Mutex<Budget>,
    /// Where crossing the floor is told (`StorageCrossed`).
    metrics: Arc<Metrics>,
}

/// Free and total bytes of the filesystem holding `path`, as an unprivileged process
/// sees them (`f_bavail`: root's reserve does not count).
fn statvfs(path: &Path) -> std::io::Result<(u64, u64)> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: `c` is a valid NUL-terminated path and `st` a writable statvfs.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

/// Bytes as MiB with one decimal, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

impl Space {
    /// The free-space watch of `path`'s filesystem, its floor the larger of
    /// `min_free_bytes` and `min_free_percent`, telling `metrics` when it crosses it.
    pub(crate) fn new(
        path: &Path,
        min_free_bytes: u64,
        min_free_percent: f64,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            path: path.to_path_buf(),
            min_free_bytes,
            min_free_percent,
            free: AtomicU64::new(u64::MAX),
            total: AtomicU64::new(0),
            below: AtomicBool::new(false),
            local: true,
            budget: std::sync::Mutex::new(Budget::default()),
            metrics,
        }
    }

    /// Admits a write of `bytes` (before the engine's amplification): true when it
    /// fits the budget, measuring again (on the blocking pool) when the budget ran out.
    /// False below the floor: the writer must not write. Always true for a store that
    /// is not on this machine.
    pub(crate) async fn admit(self: &Arc<Self>, bytes: u64) -> bool {
        if self.unguarded() {
            return true;
        }
        if crate::lock::lock(&self.budget).take(bytes) {
            return true;
        }
        let s = self.clone();
        match tokio::task::spawn_blocking(move || s.check()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                unmeasured(&self.metrics, &e);
                return false;
            }
            Err(e) => {
                unmeasured(&self.metrics, &e);
                return false;
            }
        }
        !self.below_floor() && crate::lock::lock(&self.budget).take(bytes)
    }

    /// [`Space::admit`] without measuring: false when the budget has run out (or below
    /// the floor), for a writer that cannot wait and has another way (the committer's
    /// dispatch leaves the events to the dispatcher, which measures).
    pub(crate) fn try_admit(&self, bytes: u64) -> bool {
        self.unguarded() || (!self.below_floor() && crate::lock::lock(&self.budget).take(bytes))
    }

    /// No admission at all: the store is elsewhere, or no floor is configured
    /// (`min_free_bytes` and `min_free_percent` 0).
    fn unguarded(&self) -> bool {
        !self.local || (self.min_free_bytes == 0 && self.min_free_percent <= 0.0)
    }

    /// No admission: the store is not on this machine's disks (its server guards its
    /// own space).
    pub(crate) fn remote(metrics: Arc<Metrics>) -> Self {
        Self { local: false, ..Self::new(Path::new("."), 0, 0.0, metrics) }
    }

    /// Whether there is a local filesystem to watch.
    pub(crate) fn is_local(&self) -> bool {
        self.local
    }

    /// The floor: the larger of `min_free_bytes` and `min_free_percent` of the size.
    /// `min_free_bytes` counts for at most a quarter of the filesystem, so that the
    /// default floor (256 MiB) still leaves a small volume usable instead of refusing
    /// every callback.
    pub(crate) fn floor(&self) -> u64 {
        let total = self.total.load(Ordering::Relaxed);
        let percent = (total as f64 * self.min_free_percent / 100.0) as u64;
        self.min_free_bytes.min(total / 4).max(percent)
    }

    /// How long until the next look: sooner when free space is near the floor.
    fn next_look(&self) -> Duration {
        let free = self.free.load(Ordering::Relaxed);
        if free < self.floor().saturating_mul(2) {
            CLOSE_INTERVAL
        } else {
            INTERVAL
        }
    }

    /// Measures again; logs when the relay crosses the floor either way.
    pub(crate) fn check(&self) -> std::io::Result<()> {
        if !self.local {
            return Ok(());
        }
        let (free, total) = statvfs(&self.path)?;
        self.free.store(free, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        let margin = {
            let mut budget = crate::lock::lock(&self.budget);
            budget.measured(free, self.floor());
            // No floor, no margin: the writes go to the disk's last byte, as asked.
            if self.floor() == 0 {
                0
            } else {
                budget.margin()
            }
        };
        let below = free < self.floor().saturating_add(margin);
        if self.below.swap(below, Ordering::SeqCst) != below {
            let data_dir = self.path.display().to_string();
            StorageCrossed { data_dir: &data_dir, below, free, floor: self.floor() }
                .emit(&self.metrics);
        }
        Ok(())
    }

    /// Free bytes as last measured (`None` before the first look, or for a remote
    /// store).
    pub(crate) fn free(&self) -> Option<u64> {
        let free = self.free.load(Ordering::Relaxed);
        (self.local && free != u64::MAX).then_some(free)
    }

    /// Whether new callbacks are refused.
    pub(crate) fn below_floor(&self) -> bool {
        self.below.load(Ordering::SeqCst)
    }

    /// What `/readyz` says while below the floor.
    pub(crate) fn describe(&self) -> String {
        format!(
            "free space on the data directory's filesystem ({} of {}) is below the floor of {} \
             (storage.min_free_bytes / storage.min_free_percent): callbacks are refused and deliveries held until space is freed",
            mib(self.free.load(Ordering::Relaxed)),
            mib(self.total.load(Ordering::Relaxed)),
            mib(self.floor()),
        )
    }

    fn report(&self, metrics: &Metrics) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.store.storage_free.set(gauge(self.free.load(Ordering::Relaxed)));
        metrics.store.storage_floor.set(gauge(self.floor()));
    }
}

/// The free space could not be measured: writes that needed a measure wait (the
/// floor is kept as if reached), and the relay says why.
fn unmeasured(metrics: &Metrics, error: &dyn std::fmt::Display) {
    crate::internal_events::taxonomy::degraded(
        metrics,
        crate::internal_events::taxonomy::Stage::Store,
        crate::internal_events::taxonomy::ErrorType::Storage,
        "cannot measure free space of the data directory; writes that need room wait for \
         the next measure",
        error,
    );
}

/// Measures every second (every 100 ms near the floor) until `stop`, on the blocking
/// pool: `statvfs` can block on a sick filesystem.
pub(crate) async fn watch(space: Arc<Space>, metrics: Arc<Metrics>, mut stop: Stop) {
    loop {
        let s = space.clone();
        match tokio::task::spawn_blocking(move || s.check()).await {
            Ok(Ok(())) => space.report(&metrics),
            Ok(Err(e)) => unmeasured(&metrics, &e),
            Err(e) => unmeasured(&metrics, &e),
        }
        tokio::select! {
            _ = tokio::time::sleep(space.next_look()) => {}
            _ = stop.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new().unwrap())
    }

    #[test]
    fn the_floor_is_the_larger_of_bytes_and_percent_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (free, total) = statvfs(dir.path()).unwrap();
        assert!(total > 0 && free <= total);
        let space = Space::new(dir.path(), 1, 0.0, metrics());
        space.check().unwrap();
        assert!(!space.below_floor());
        assert_eq!(space.floor(), 1);
        let percent = Space::new(dir.path(), 1, 50.0, metrics());
        percent.check().unwrap();
        assert_eq!(percent.floor(), total / 2);
        // A byte floor above the filesystem's size counts as a quarter of it.
        let capped = Space::new(dir.path(), u64::MAX, 0.0, metrics());
        capped.check().unwrap();
        assert_eq!(capped.floor(), total / 4);
        assert_eq!(capped.below_floor(), free < total / 4);
        let full = Space::new(dir.path(), 0, 100.0, metrics());
        full.check().unwrap();
        assert!(full.below_floor());
        assert_eq!(full.next_look(), CLOSE_INTERVAL);
        assert_eq!(Space::new(dir.path(), 1, 0.0, metrics()).next_look(), INTERVAL);
        assert!(full.describe().contains("below the floor"), "{}", full.describe());
        assert!(statvfs(Path::new("/no/such/dir")).is_err());
    }

    /// Admission without measuring (the committer's dispatch): always with no floor,
    /// never before a measurement has granted a budget nor below the floor, and only
    /// within the budget a measurement granted.
    #[test]
    fn admission_without_measuring_takes_from_the_budget_only() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Space::new(dir.path(), 0, 0.0, metrics()).try_admit(u64::MAX / 64));
        let guarded = Space::new(dir.path(), 1, 0.0, metrics());
        assert!(!guarded.try_admit(1), "admitted before any measurement");
        guarded.check().unwrap();
        assert!(guarded.try_admit(1024), "refused within the budget a measurement granted");
        assert!(!guarded.try_admit(u64::MAX / 64), "admitted past the budget");
        let full = Space::new(dir.path(), 0, 100.0, metrics());
        full.check().unwrap();
        assert!(!full.try_admit(1), "admitted below the floor");
    }
}
