//! This relay's share of each destination's limits when several relays share a store.
//!
//! `max_concurrency` and `rate_limit` are promises to the consumer, so they hold for
//! the whole fleet: every relay announces itself in the store every
//! [`HEARTBEAT`] ([`crate::store::Store::heartbeat`]) and learns how many relays are
//! live and its rank among them; it then uses `max_concurrency / N` (the remainder
//! going to the first ranks, so the shares add up to exactly the limit) and
//! `rate_limit / N`. A relay that joins delivers nothing until the others have seen
//! it (one heartbeat), unless it finds itself alone: a relay reads the fleet only
//! once its announcement is stored, so of two joining at once one sees the other,
//! no other relay holds a share then, and none that joins after it takes one before
//! this relay has seen it. A relay holding a share keeps one (smaller) as others
//! join: they count it from their first heartbeat. A relay that dies is counted for [`LIVE_FOR`],
//! so its share is left unused for that long rather than given out twice. A store
//! that one process owns has no fleet: the whole limit is this relay's.

use crate::internal_events::{FleetCounted, InternalEvent};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::SharedStore;

/// How often a relay announces itself and reads the fleet.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long a relay counts as live after its last announcement.
pub(crate) const LIVE_FOR: Duration = Duration::from_secs(10);
/// A relay whose heartbeat has not worked for this long (counted from when the last
/// one that did was sent) starts no attempt until it works again. Shorter than
/// [`LIVE_FOR`]: once the others stop counting a silent relay, they take over its
/// claims after its attempts' own bound ([`crate::store::owner_silence`], given this), and by then
/// it has sent nothing for that long.
pub(crate) const FENCE: Duration = Duration::from_secs(5);

/// This relay's place in the fleet, read by the delivery workers.
pub(crate) struct FleetShare {
    rank: AtomicUsize,
    size: AtomicUsize,
    /// False until the other relays have seen this one: until then it takes no share.
    active: AtomicBool,
    /// When the last heartbeat that worked was sent, in ms after `since` (`None`: a
    /// relay alone, never fenced).
    fresh: Option<(Instant, AtomicU64)>,
}

impl FleetShare {
    /// The whole fleet: one relay, active.
    pub(crate) fn single() -> Self {
        Self {
            rank: AtomicUsize::new(0),
            size: AtomicUsize::new(1),
            active: AtomicBool::new(true),
            fresh: None,
        }
    }

    /// A member of a fleet not yet seen by the others.
    fn joining() -> Self {
        Self {
            rank: AtomicUsize::new(0),
            size: AtomicUsize::new(1),
            active: AtomicBool::new(false),
            fresh: Some((Instant::now(), AtomicU64::new(0))),
        }
    }

    /// Notes that a heartbeat sent at `sent` worked.
    fn heard(&self, sent: Instant) {
        if let Some((since, at)) = &self.fresh {
            let ms = u64::try_from(sent.saturating_duration_since(*since).as_millis());
            at.fetch_max(ms.unwrap_or(u64::MAX), Ordering::SeqCst);
        }
    }

    /// Whether the relay may start no attempt: its heartbeat has not worked for
    /// [`FENCE`].
    fn fenced(&self) -> bool {
        self.fenced_at(Instant::now())
    }

    fn fenced_at(&self, now: Instant) -> bool {
        self.fresh.as_ref().is_some_and(|(since, at)| {
            let last = *since + Duration::from_millis(at.load(Ordering::SeqCst));
            now.saturating_duration_since(last) >= FENCE
        })
    }

    fn set(&self, rank: usize, size: usize, active: bool) {
        self.rank.store(rank, Ordering::SeqCst);
        self.size.store(size.max(1), Ordering::SeqCst);
        self.active.store(active, Ordering::SeqCst);
    }

    /// This relay's part of a destination's `max_concurrency`.
    pub(crate) fn concurrency(&self, max: usize) -> usize {
        if !self.active.load(Ordering::SeqCst) || self.fenced() {
            return 0;
        }
        split(max, self.rank.load(Ordering::SeqCst), self.size.load(Ordering::SeqCst))
    }

    /// This relay's part of a destination's `rate_limit` (requests per second).
    pub(crate) fn rate(&self, rate: f64) -> f64 {
        rate / self.size.load(Ordering::SeqCst).max(1) as f64
    }
}

/// Rank `rank`'s part of `total` split over `size` relays: the parts differ by at most
/// one and add up to `total` (a relay may get 0 when there are more relays than units).
pub(crate) fn split(total: usize, rank: usize, size: usize) -> usize {
    let size = size.max(1);
    total / size + usize::from(rank < total % size)
}

/// Starts following the fleet for `owner`: returns the share the workers read, kept
/// current by a task until `stop`; `None` (and no task) for a store without a fleet.
pub(crate) async fn follow(
    store: SharedStore,
    owner: String,
    metrics: Arc<Metrics>,
    stop: Stop,
) -> (Arc<FleetShare>, Option<tokio::task::JoinHandle<()>>) {
    let sent = Instant::now();
    match beat(&store, &owner).await {
        Ok(None) => (Arc::new(FleetShare::single()), None),
        first => {
            let share = Arc::new(FleetShare::joining());
            if let Ok(Some(fleet)) = &first {
                share.heard(sent);
                share.set(fleet.rank, fleet.size, settled(fleet.size, false, false));
            }
            let task = tokio::spawn(run(store, owner, share.clone(), metrics, stop));
            (share, Some(task))
        }
    }
}

/// Whether a relay in a fleet of `size` (itself included) may take its share: once
/// the others have seen it (`seen`), or at once when there are no others. A fleet
/// that finds one relay at its first heartbeat skips the join's wait (2.5 s of no
/// deliveries on every start of a lone relay; issue 44's fleet bench). A relay that
/// holds a share (`holding`) keeps one when others join: they read the fleet after
/// announcing themselves and count it from their first heartbeat, so its part and
/// theirs add up to the limit. (Without this, a relay that started alone dropped to
/// nothing when a second one joined within its first 2.5 s, and with the joiner not
/// yet settled the whole fleet delivered nothing: the fleet bench's stall of ~1 s.)
fn settled(size: usize, seen: bool, holding: bool) -> bool {
    holding || seen || size <= 1
}

/// One heartbeat; the store's clock it reads sets the relay's ([`crate::clock`]).
async fn beat(
    store: &SharedStore,
    owner: &str,
) -> Result<Option<crate::store::Fleet>, crate::store::StoreError> {
    let (sent, at) = (crate::clock::local_us(), Instant::now());
    let answer = store.heartbeat(owner, LIVE_FOR).await;
    if let Ok(Some(fleet)) = &answer {
        crate::clock::observe_store(fleet.store_us, sent, at.elapsed());
    }
    answer
}

/// Announces this relay every [`HEARTBEAT`] and updates `share`.
async fn run(
    store: SharedStore,
    owner: String,
    share: Arc<FleetShare>,
    metrics: Arc<Metrics>,
    mut stop: Stop,
) {
    // The others read the fleet every HEARTBEAT: after one (and a margin), they count
    // this relay, and its share cannot add to theirs beyond the limit.
    let mut since = Instant::now();
    let settle = HEARTBEAT + HEARTBEAT / 4;
    let mut failing = false;
    let mut last_ok = Instant::now();
    loop {
        let sent = Instant::now();
        // A heartbeat that hangs must not keep the fence open: given up on in time.
        let answer = match tokio::time::timeout(FENCE, beat(&store, &owner)).await {
            Ok(answer) => answer,
            Err(_) => Err(crate::store::StoreError::Backend {
                backend: "fleet",
                message: format!("no answer to the heartbeat within {FENCE:?}"),
            }),
        };
        match answer {
            Ok(Some(fleet)) => {
                let mut holding = share.active.load(Ordering::SeqCst);
                if last_ok.elapsed() >= LIVE_FOR {
                    // The others stopped counting this relay meanwhile: it joins again.
                    since = Instant::now();
                    holding = false;
                }
                last_ok = Instant::now();
                share.heard(sent);
                let seen = since.elapsed() >= settle;
                share.set(fleet.rank, fleet.size, settled(fleet.size, seen, holding));
                FleetCounted { relays: fleet.size, recovered: failing }.emit(&metrics);
                failing = false;
            }
            Ok(None) => return,
            Err(e) => {
                // Keep the last share: the limits stay divided as they were; after
                // FENCE without a heartbeat, the relay starts no attempt.
                if !failing {
                    let what = format!(
                        "fleet heartbeat failed; this relay keeps its last share of the \
                         destinations' limits, and starts no attempt once it has had no \
                         heartbeat for {FENCE:?} (the others then take its deliveries over)"
                    );
                    crate::internal_events::taxonomy::degraded(
                        &metrics,
                        crate::internal_events::taxonomy::Stage::Store,
                        crate::internal_events::taxonomy::ErrorType::Unreachable,
                        &what,
                        &e,
                    );
                    failing = true;
                }
            }
        }
        let wait = if share.active.load(Ordering::SeqCst) {
            HEARTBEAT
        } else {
            // Settle as soon as possible.
            settle.saturating_sub(since.elapsed()).clamp(Duration::from_millis(50), HEARTBEAT)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_limit_and_differ_by_at_most_one() {
        for total in 0..40 {
            for size in 1..12 {
                let parts: Vec<usize> = (0..size).map(|rank| split(total, rank, size)).collect();
                assert_eq!(parts.iter().sum::<usize>(), total, "{total} over {size}");
                let (min, max) = (parts.iter().min().unwrap(), parts.iter().max().unwrap());
                assert!(max - min <= 1, "{parts:?}");
            }
        }
        assert_eq!(split(5, 0, 0), 5, "no fleet is a fleet of one");
    }

    #[test]
    fn a_joining_relay_takes_nothing_until_settled() {
        let share = FleetShare::joining();
        share.set(1, 2, false);
        assert_eq!(share.concurrency(8), 0);
        share.set(1, 2, true);
        assert_eq!(share.concurrency(8), 4);
        assert_eq!(share.concurrency(3), 1);
        assert!((share.rate(10.0) - 5.0).abs() < 1e-9);
        assert_eq!(FleetShare::single().concurrency(8), 8);
    }

    #[test]
    fn a_relay_alone_need_not_wait_to_be_seen() {
        assert!(settled(1, false, false), "alone: nobody else holds a share");
        assert!(!settled(2, false, false), "the others may not have seen it yet");
        assert!(settled(2, true, false));
        let share = FleetShare::joining();
        share.set(0, 1, settled(1, false, false));
        assert_eq!(share.concurrency(8), 8);
    }

    #[test]
    fn a_relay_holding_a_share_keeps_one_when_others_join() {
        assert!(settled(2, false, true), "the joiners count it from their first heartbeat");
        assert!(settled(5, false, true));
        let share = FleetShare::joining();
        share.set(0, 1, settled(1, false, false));
        share.set(0, 2, settled(2, false, share.active.load(Ordering::SeqCst)));
        assert_eq!(share.concurrency(8), 4, "its part, not nothing");
    }

    /// Two relays started together on one PostgreSQL: from the start, the fleet never
    /// has no relay taking a share, and the shares never add up to more than the
    /// limit (each relay's view read every 20 ms for 4 s, past both settling).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_relays_starting_together_never_leave_the_fleet_without_a_share() {
        let url = tokio::task::spawn_blocking(|| {
            let server = crate::store::postgres::test_server::shared();
            server.database(&crate::store::postgres::test_server::unique_database("join"))
        })
        .await
        .unwrap();
        let a: SharedStore = Arc::new(crate::store::fixtures::postgres(&url).await);
        let b: SharedStore = Arc::new(crate::store::fixtures::postgres(&url).await);
        let metrics = Arc::new(Metrics::new().unwrap());
        let (trigger, stop) = crate::shutdown::StopTrigger::new();
        let (first, ta) = follow(a, "a".into(), metrics.clone(), stop.clone()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (second, tb) = follow(b, "b".into(), metrics, stop.clone()).await;
        let mut seen = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(4) {
            let parts = (first.concurrency(32), second.concurrency(32));
            assert!(parts.0 + parts.1 <= 32, "over the limit: {parts:?}");
            assert!(parts.0 + parts.1 > 0, "no relay takes a share after {:?}", started.elapsed());
            seen.push(parts);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(seen.last(), Some(&(16, 16)), "both settled at the end");
        trigger.stop();
        for t in [ta, tb].into_iter().flatten() {
            t.await.unwrap();
        }
    }

    #[test]
    fn a_relay_whose_heartbeat_stopped_working_starts_nothing() {
        let share = FleetShare::joining();
        share.set(0, 1, true);
        let (since, _) = share.fresh.as_ref().map(|(s, a)| (*s, a)).unwrap();
        let sent = since + Duration::from_secs(1);
        share.heard(sent);
        assert!(!share.fenced_at(sent + FENCE - Duration::from_millis(1)));
        assert!(share.fenced_at(sent + FENCE), "no heartbeat for FENCE: fenced");
        // A later heartbeat lifts it; an older one does not move it back.
        share.heard(sent + FENCE);
        share.heard(sent);
        assert!(!share.fenced_at(sent + FENCE + Duration::from_secs(1)));
        assert!(!FleetShare::single().fenced_at(Instant::now() + FENCE * 10), "alone: never");
        assert_eq!(FleetShare::single().concurrency(8), 8);
    }
}
