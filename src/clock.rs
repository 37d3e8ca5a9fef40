//! The relay's clock: the one time every stored decision is made on (receive times,
//! due times, claims and their leases, dedup windows, retention).
//!
//! Two things go wrong with the machine's wall clock as it is:
//! - **it steps**: an NTP correction or an operator's `date -s` moves it by seconds or
//!   hours; a backward step would hold every retry scheduled before it for that long,
//!   and a forward one would expire every claim at once;
//! - **relays disagree**: in a fleet, a claim taken on one relay's clock is judged
//!   expired on another's; with more than a lease of skew, a delivery still in flight
//!   is taken over and sent twice at once.
//!
//! So the clock is the wall clock read once, at start, advanced by the monotonic clock
//! (which never steps), plus an offset: in a fleet, the offset to the store's clock
//! (the database's), measured at every heartbeat ([`observe_store`]). Every relay of a
//! fleet then reads the database's clock, give or take half a round trip, whatever its
//! machine's clock says; a relay alone reads its own start-time wall clock, steps
//! ignored until it restarts.
//!
//! Times shown to people and sent to consumers (the `webhook-timestamp` header, a
//! `Retry-After` date) stay on the machine's wall clock: they are compared with other
//! machines' wall clocks, not with stored decisions.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A duration in whole microseconds, saturating: the unit of every stored time. The
/// one conversion (a `Duration` holds more than a `u64` of µs).
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Microseconds since the epoch, saturating (a clock before 1970 reads as 0).
pub(crate) fn unix_micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, micros)
}

/// The wall clock at the first reading, and the monotonic instant it was read at.
fn anchor() -> &'static (u64, Instant) {
    static ANCHOR: OnceLock<(u64, Instant)> = OnceLock::new();
    ANCHOR.get_or_init(|| (unix_micros(SystemTime::now()), Instant::now()))
}

/// The relay's clock: the anchored clock plus the offset to the store's.
pub(crate) struct Clock {
    /// µs to add to the anchored clock to read the store's clock (0 without a fleet).
    offset_us: AtomicI64,
    /// The machine's wall clock minus the store's, in µs, at the last reading
    /// ([`UNMEASURED`] before one): what a consumer checking `webhook-timestamp`
    /// against its own clock sees of this machine's.
    wall_skew_us: AtomicI64,
}

/// [`Clock::wall_skew_us`] before the store's clock was read.
const UNMEASURED: i64 = i64::MIN;

/// The process's clock: one relay, one store, one clock.
static CLOCK: Clock =
    Clock { offset_us: AtomicI64::new(0), wall_skew_us: AtomicI64::new(UNMEASURED) };

/// How far this machine's wall clock may be from the database's before the relay says
/// it is not ready. Stored decisions take the database's clock whatever the machine's
/// says, but the `webhook-timestamp` a consumer checks, the times people read and the
/// ids a relay proposes before its first heartbeat take the machine's: a relay off
/// by more than this is a clock to fix (NTP), not one to serve with. The database
/// caps an id proposed beyond its own clock by as much (`postgres/mod.rs`).
pub(crate) const MAX_SKEW: Duration = Duration::from_secs(2);

/// Round trips longer than this say too little about when the store read its clock.
const MAX_RTT: Duration = Duration::from_millis(500);

/// The anchored clock alone, in µs since the epoch: also what to pass to
/// [`observe_store`] as the time a call was sent.
pub(crate) fn local_us() -> u64 {
    let (wall, at) = anchor();
    wall.saturating_add(micros(at.elapsed()))
}

impl Clock {
    fn now_us(&self) -> u64 {
        local_us().saturating_add_signed(self.offset_us.load(Ordering::Relaxed))
    }

    fn observe(&self, store_us: u64, sent: u64, rtt: Duration, wall_now: u64) -> i64 {
        if rtt <= MAX_RTT {
            let half = u64::try_from(rtt.as_micros() / 2).unwrap_or(0);
            let midpoint = sent.saturating_add(half);
            self.offset_us.store(offset(store_us, midpoint), Ordering::Relaxed);
            // The machine's clock when the store read its own: half a round trip ago.
            let wall_midpoint = wall_now.saturating_sub(half);
            self.wall_skew_us.store(offset(wall_midpoint, store_us), Ordering::Relaxed);
        }
        self.offset_us.load(Ordering::Relaxed)
    }
}

/// Now, in µs since the epoch, on the relay's clock.
pub(crate) fn now_us() -> u64 {
    CLOCK.now_us()
}

/// Now, on the relay's clock.
pub(crate) fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(now_us())
}

/// A reading of the store's clock, `store_us`, taken by a call sent at `sent` (read
/// from [`local_us`]) and answered `rtt` later: from now on the relay reads the
/// store's clock. A reading from a slow round trip is ignored (the last offset stays).
/// Returns the offset now used, in µs.
pub(crate) fn observe_store(store_us: u64, sent: u64, rtt: Duration) -> i64 {
    CLOCK.observe(store_us, sent, rtt, unix_micros(SystemTime::now()))
}

/// This machine's wall clock minus the store's at the last reading (positive: the
/// machine is ahead), or `None` before the store's clock was read (no fleet).
pub(crate) fn wall_skew() -> Option<SignedSkew> {
    skew_of(CLOCK.wall_skew_us.load(Ordering::Relaxed))
}

/// A skew in µs, positive when the machine is ahead of the store.
pub(crate) type SignedSkew = i64;

fn skew_of(raw: i64) -> Option<SignedSkew> {
    (raw != UNMEASURED).then_some(raw)
}

/// Why the relay should not serve with a clock `skew_us` (µs) off from the store's,
/// if it is more than [`MAX_SKEW`] off: what `/readyz` says.
pub(crate) fn skew_problem(skew_us: SignedSkew) -> Option<String> {
    let off = Duration::from_micros(skew_us.unsigned_abs());
    (off > MAX_SKEW).then(|| {
        format!(
            "this machine's clock is {:.1} s {} the database's (more than {} s): consumers \
             checking webhook-timestamp and the fleet's ids need one time; fix time \
             synchronisation (chrony, systemd-timesyncd) and the relay turns ready by itself",
            off.as_secs_f64(),
            if skew_us > 0 { "ahead of" } else { "behind" },
            MAX_SKEW.as_secs()
        )
    })
}

/// `a - b` in µs, saturated.
fn offset(a: u64, b: u64) -> i64 {
    if a >= b {
        i64::try_from(a - b).unwrap_or(i64::MAX)
    } else {
        i64::try_from(b - a).map_or(i64::MIN, |d| -d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_never_steps_back_alone_and_follows_the_store_once_read() {
        let clock =
            Clock { offset_us: AtomicI64::new(0), wall_skew_us: AtomicI64::new(UNMEASURED) };
        assert_eq!(skew_of(clock.wall_skew_us.load(Ordering::Relaxed)), None);
        let a = clock.now_us();
        std::thread::sleep(Duration::from_millis(5));
        let b = clock.now_us();
        assert!(b >= a + 5_000, "{a} {b}");
        // A store an hour ahead, read over a 2 ms round trip: the relay reads its clock.
        let sent = local_us();
        let store = sent + 3_600_000_000 + 1_000;
        let off = clock.observe(store, sent, Duration::from_millis(2), sent + 2_000);
        let skew = |c: &Clock| skew_of(c.wall_skew_us.load(Ordering::Relaxed));
        assert_eq!(skew(&clock), Some(-3_600_000_000), "the machine is an hour behind");
        assert_eq!(off, 3_600_000_000);
        let c = clock.now_us();
        assert!(c >= store - 1_000 && c < store + 1_000_000, "{c} vs {store}");
        // A slow round trip says little: ignored.
        assert_eq!(clock.observe(0, local_us(), Duration::from_secs(3), 0), off);
        assert_eq!(skew(&clock), Some(-3_600_000_000), "a slow reading moves neither");
        // A store behind the machine: negative offsets work too.
        let sent = local_us();
        assert_eq!(clock.observe(sent - 10_000_000, sent, Duration::ZERO, sent), -10_000_000);
        assert_eq!(skew(&clock), Some(10_000_000), "the machine is 10 s ahead");
        assert!(clock.now_us() < local_us());
        assert_eq!(offset(1, 3), -2);
        assert_eq!(offset(u64::MAX, 0), i64::MAX);
    }
}

#[cfg(test)]
mod skew {
    use super::*;

    #[test]
    fn a_clock_off_by_more_than_the_bound_says_which_way_and_what_to_do() {
        let bound = micros(MAX_SKEW) as i64;
        for fine in [0, 1, -1, bound, -bound] {
            assert_eq!(skew_problem(fine), None, "{fine}");
        }
        let ahead = skew_problem(bound + 1).unwrap();
        assert!(ahead.contains("ahead of the database") && ahead.contains("chrony"), "{ahead}");
        let behind = skew_problem(-3_600_000_000).unwrap();
        assert!(behind.contains("3600.0 s behind"), "{behind}");
        assert!(skew_problem(i64::MIN + 1).is_some(), "no overflow");
    }
}

#[cfg(test)]
mod one_clock {
    /// What is stored takes the relay's clock, never the machine's: operational events
    /// and `HookGap` events (their receive time, and so their id) once took the wall
    /// clock, so one relay with a skewed clock pushed the fleet's ids ahead (issue 40).
    #[test]
    fn stored_events_are_timed_on_the_relays_clock() {
        for file in [
            "src/operational.rs",
            "src/upstream/reconcile/gaps.rs",
            "src/upstream/reconcile/mod.rs",
            "src/ingress/callback.rs",
        ] {
            let text = std::fs::read_to_string(file).unwrap();
            let code: String = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            let stored = code.matches("SystemTime::now()").count();
            // The reconciler's status line (`last_reconcile`) is shown to people only.
            let allowed = usize::from(file == "src/upstream/reconcile/mod.rs");
            assert!(stored <= allowed, "{file}: {stored} readings of the machine's clock");
        }
    }
}
