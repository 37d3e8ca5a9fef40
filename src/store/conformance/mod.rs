//! The store contract, checked the same way on every backend: the scenarios below and
//! a model-based test (random operation sequences against a small reference model, as
//! vector checks its disk buffer) run against `memory`, `sled` and `postgres` alike. A new backend
//! adds one [`Harness`] and one line per test at the bottom.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::embedded::CountPace;
pub(crate) use super::fixtures::{plan, received};
use super::lifecycle::{AnswerClass, AttemptReport, AttemptVerdict};
use super::memory::MemoryStore;
use super::{
    Attempt, AttemptWrite, DeadLetterFilter, DedupKey, DeliveryState, DispatchPlan,
    DispatchVerdict, EventFilter, EventId, EventStatus, NewEvent, PendingEvent, QueueStats,
    SharedStore,
};
use crate::config::RetryPolicy;

const S: u64 = 1_000_000;
const LEASE: Duration = Duration::from_secs(60);

/// Opens a backend, and reopens it as after a restart of its process.
#[async_trait]
pub(crate) trait Harness: Send {
    async fn open(&mut self) -> SharedStore;
    /// The same data in a new process: the caller has dropped every handle.
    async fn reopen(&mut self) -> SharedStore;
    /// A second store on the same data, open at the same time (a second relay on
    /// one database), for backends that have one; `None` for a store one process
    /// owns.
    async fn second(&mut self) -> Option<SharedStore> {
        None
    }
    /// The store after a power cut: what its durable writes left, in a new process.
    /// The handles are dropped first. By default a reopen: a backend whose every
    /// commit is durable (PostgreSQL) loses nothing, and one whose loss this cannot
    /// provoke in-process (sled: `tests/integration/power_loss.rs` cuts its power
    /// through a FUSE filesystem) is reopened.
    async fn crash(&mut self) -> SharedStore {
        self.reopen().await
    }
    /// Whether the backend keeps its data on disk (its size is then more than zero).
    fn on_disk(&self) -> bool {
        true
    }
}

pub(crate) struct Memory(Option<MemoryStore>);

#[async_trait]
impl Harness for Memory {
    async fn open(&mut self) -> SharedStore {
        let store = MemoryStore::lossy();
        self.0 = Some(store.clone());
        Arc::new(store)
    }
    async fn reopen(&mut self) -> SharedStore {
        Arc::new(self.0.as_ref().expect("opened").restart())
    }
    /// Loses every write since the last durable one, as the contract allows.
    async fn crash(&mut self) -> SharedStore {
        let store = self.0.as_ref().expect("opened").crash();
        self.0 = Some(store.clone());
        Arc::new(store)
    }
    fn on_disk(&self) -> bool {
        false
    }
}

/// The embedded backend on one of its engines, in a temp dir; reopening opens the same
/// directory again (a restart of the relay), its queue count behind the open going at
/// the pace given. It keeps a handle of the open store, for a crash to copy what a power
/// cut would leave (redb: the checkpointed file and the synced redo log) while the store
/// is still open.
pub(crate) struct Embedded {
    dir: tempfile::TempDir,
    engine: super::embedded::engine::Engine,
    pace: CountPace,
    open: Option<super::embedded::EmbeddedStore>,
}

impl Embedded {
    fn new(engine: super::embedded::engine::Engine) -> Self {
        Self::paced(engine, CountPace::SERVICE)
    }

    fn paced(engine: super::embedded::engine::Engine, pace: CountPace) -> Self {
        Self { dir: tempfile::tempdir().expect("temp dir"), engine, pace, open: None }
    }

    /// The count behind each open slowed to one index entry or inbox record per 2 ms: a
    /// reopen with events undispatched or deliveries queued leaves it counting while
    /// the next operations run.
    fn counting_slowly(engine: super::embedded::engine::Engine) -> Self {
        Self::paced(engine, CountPace { chunk: 1, pause: Duration::from_millis(2) })
    }
}

#[async_trait]
impl Harness for Embedded {
    async fn open(&mut self) -> SharedStore {
        let (dir, engine, pace) = (self.dir.path().to_path_buf(), self.engine, self.pace);
        let store = tokio::task::spawn_blocking(move || {
            super::embedded::testutil::open_paced(engine, &dir, pace)
        })
        .await
        .unwrap();
        self.open = Some(store.clone());
        Arc::new(store)
    }
    async fn reopen(&mut self) -> SharedStore {
        // The last handle: the store closes as a stopped relay's does.
        self.open = None;
        self.open().await
    }
    /// redb: the store reopened on a copy of what a power cut would leave at this
    /// instant, taken while it is still open; sled: a reopen (see the trait).
    async fn crash(&mut self) -> SharedStore {
        let Some(store) = self.open.take() else { return self.open().await };
        let image = tempfile::tempdir().expect("temp dir");
        let path = image.path().to_path_buf();
        let copied = tokio::task::spawn_blocking(move || store.crash_image(&path))
            .await
            .unwrap()
            .expect("copy the crash image");
        if copied {
            self.dir = image;
        }
        self.open().await
    }
}

/// A fresh database on the test process's PostgreSQL server; reopening connects a new
/// store (a new relay process) to the same database.
pub(crate) struct Postgres(Option<String>);

impl Postgres {
    fn new() -> Self {
        Self(None)
    }

    pub(crate) async fn connect(url: &str) -> super::postgres::PostgresStore {
        super::fixtures::postgres(url).await
    }
}

#[async_trait]
impl Harness for Postgres {
    async fn open(&mut self) -> SharedStore {
        let url = tokio::task::spawn_blocking(|| {
            let server = super::postgres::test_server::shared();
            server.database(&super::postgres::test_server::unique_database("conformance"))
        })
        .await
        .expect("PostgreSQL test server");
        self.0 = Some(url.clone());
        Arc::new(Self::connect(&url).await)
    }
    async fn reopen(&mut self) -> SharedStore {
        let url = self.0.clone().expect("opened");
        Arc::new(Self::connect(&url).await)
    }
    async fn second(&mut self) -> Option<SharedStore> {
        Some(self.reopen().await)
    }
}

/// The inbox's number, which a store counted before the check (a short inbox is
/// counted at open): fails if it says it is still counting.
pub(crate) async fn inbox_len(store: &SharedStore) -> u64 {
    let inbox = store.inbox().await.unwrap();
    assert!(!inbox.counting, "a short inbox still counted after the open: {inbox:?}");
    inbox.events
}

fn rejected(at_us: u64) -> NewEvent {
    let mut e = received("demo", "TaskCreated", at_us, "");
    e.meta.status = EventStatus::Rejected;
    e.meta.reason = Some("too large".into());
    e.body = None;
    e
}

fn report(class: AnswerClass, at_us: u64) -> AttemptReport {
    AttemptReport {
        attempt: Attempt {
            at_us,
            duration_us: 1_000,
            status: Some(500),
            error: None,
            answer: Some(format!("answer at {at_us}")),
        },
        class,
        jitter: 0.0,
    }
}

/// One second between attempts, dead after the third of a round.
fn policy() -> RetryPolicy {
    retrying_every(Duration::from_secs(1))
}

/// `every` between attempts, dead after the third of a round.
fn retrying_every(every: Duration) -> RetryPolicy {
    RetryPolicy {
        initial_backoff: every,
        max_backoff: every,
        max_attempts: 3,
        ..RetryPolicy::default()
    }
}

/// A dedup key of `id`'s own: no other event is a copy of it.
fn own_key(id: EventId) -> DedupKey {
    let mut hash = [0u8; 16];
    hash[..8].copy_from_slice(&id.raw().to_be_bytes());
    DedupKey { hash, window_us: 600 * S }
}

/// Appends `events` one after the other; returns their ids.
async fn append_all(store: &SharedStore, events: Vec<NewEvent>) -> Vec<EventId> {
    let mut ids = Vec::new();
    for e in events {
        ids.push(store.append(e).await.unwrap());
    }
    ids
}

/// Records one attempt.
async fn record(store: &SharedStore, claim: &super::Claim, report: AttemptReport) -> AttemptWrite {
    let mut r =
        store.record_attempts(vec![(claim.clone(), report)], &policy(), None).await.unwrap();
    assert_eq!((r.writes.len(), r.bodies_dropped), (1, 0));
    r.writes.remove(0)
}

async fn states(store: &SharedStore, id: EventId) -> BTreeMap<String, DeliveryState> {
    store.deliveries_of(id).await.unwrap().into_iter().map(|d| (d.destination, d.state)).collect()
}

/// `event` about `resource` (the ingress sets it from the body's `data`).
fn about(mut event: NewEvent, resource: &str) -> NewEvent {
    event.meta.resource = Some(resource.into());
    event
}

// ---- the scenarios, one file per trait of the contract, on every backend

macro_rules! conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn ids_listing_bodies_and_reopen() {
                super::event_log::ids_listing_bodies_and_reopen(&mut $make).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_appends_get_unique_ids() {
                super::event_log::concurrent_appends_get_unique_ids(&mut $make).await;
            }
            #[tokio::test]
            async fn ids_after_pruning_the_newest_and_a_restart_are_dispatched() {
                super::dispatch::ids_after_pruning_the_newest_and_a_restart_are_dispatched(
                    &mut $make,
                )
                .await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn counts_survive_concurrent_append_and_dispatch() {
                super::dispatch::counts_survive_concurrent_append_and_dispatch(&mut $make).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn appends_dispatch_and_attempts_race_on_one_resource() {
                super::races::appends_dispatch_and_attempts_race_on_one_resource(&mut $make)
                    .await;
            }
            #[tokio::test]
            async fn dispatch_dedups_routes_and_schedules() {
                super::dispatch::dispatch_dedups_routes_and_schedules(&mut $make).await;
            }
            #[tokio::test]
            async fn filtered_deliveries_are_kept_never_attempted_and_replayable() {
                super::dispatch::filtered_deliveries_are_kept_never_attempted_and_replayable(
                    &mut $make,
                )
                .await;
            }
            #[tokio::test]
            async fn claims_nobody_holds_are_given_back() {
                super::delivery_queue::claims_nobody_holds_are_given_back(&mut $make).await;
            }
            #[tokio::test]
            async fn claims_are_leased_and_checked() {
                super::delivery_queue::claims_are_leased_and_checked(&mut $make).await;
            }
            #[tokio::test]
            async fn an_earlier_due_delivery_is_still_claimed() {
                super::delivery_queue::an_earlier_due_delivery_is_still_claimed(&mut $make).await;
            }
            #[tokio::test]
            async fn attempts_are_recorded_in_batches() {
                super::delivery_queue::attempts_are_recorded_in_batches(&mut $make).await;
            }
            #[tokio::test]
            async fn attempts_retry_die_replay_and_discard() {
                super::delivery_queue::attempts_retry_die_replay_and_discard(&mut $make).await;
            }
            #[tokio::test]
            async fn open_destinations_are_listed() {
                super::delivery_queue::open_destinations_are_listed(&mut $make).await;
            }
            #[tokio::test]
            async fn latest_only() {
                super::delivery_queue::latest_only(&mut $make).await;
            }
            #[tokio::test]
            async fn per_resource_order() {
                super::delivery_queue::per_resource_order(&mut $make).await;
            }
            #[tokio::test]
            async fn events_are_found_by_resource() {
                super::event_log::events_are_found_by_resource(&mut $make).await;
            }
            #[tokio::test]
            async fn events_are_listed_within_a_time_window() {
                super::event_log::events_are_listed_within_a_time_window(&mut $make).await;
            }
            #[tokio::test]
            async fn prune_keeps_what_is_not_finished() {
                super::event_log::prune_keeps_what_is_not_finished(&mut $make).await;
            }
            #[tokio::test]
            async fn an_event_settled_past_its_bodys_retention_loses_it_as_it_is_recorded() {
                super::event_log::an_event_settled_past_its_bodys_retention_loses_it_as_it_is_recorded(&mut $make)
                    .await;
            }
            #[tokio::test]
            async fn bodies_of_settled_events_go_and_their_records_stay() {
                super::event_log::bodies_of_settled_events_go_and_their_records_stay(&mut $make)
                    .await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn prune_and_replay_race_leaves_no_orphan() {
                super::event_log::prune_and_replay_race_leaves_no_orphan(&mut $make).await;
            }
            #[tokio::test]
            async fn pauses_are_durable() {
                super::delivery_queue::pauses_are_durable(&mut $make).await;
            }
            #[tokio::test]
            async fn upstream_state_is_durable_and_scanned_by_prefix() {
                super::shared_state::upstream_state_is_durable_and_scanned_by_prefix(&mut $make)
                    .await;
            }
            #[tokio::test]
            async fn the_journal_keeps_every_change_newest_first() {
                super::journal::the_journal_keeps_every_change_newest_first(&mut $make).await;
            }
            #[tokio::test]
            async fn an_admins_change_is_journalled_with_it() {
                super::journal::an_admins_change_is_journalled_with_it(&mut $make).await;
            }
            #[tokio::test]
            async fn a_sole_relay_leads_and_is_the_whole_fleet() {
                super::coordination::a_sole_relay_leads_and_is_the_whole_fleet(&mut $make).await;
            }
            #[tokio::test]
            async fn it_answers_reports_its_size_and_closes_durably() {
                super::upkeep::it_answers_reports_its_size_and_closes_durably(&mut $make).await;
            }
            #[tokio::test]
            async fn every_callback_is_accounted_for() {
                super::audit::every_callback_is_accounted_for(&mut $make).await;
            }
            #[tokio::test]
            async fn the_ledger_keeps_hours_for_their_retention_and_one_row_for_unknown_names() {
                super::audit::the_ledger_keeps_hours_for_their_retention_and_one_row_for_unknown_names(
                    &mut $make,
                )
                .await;
            }
            #[test]
            fn model() {
                super::model::check(|| Box::new($make));
            }
        }
    };
}

conformance!(memory, Memory(None));
conformance!(sled, Embedded::new(crate::store::embedded::engine::Engine::Sled));
conformance!(redb, Embedded::new(crate::store::embedded::engine::Engine::Redb));
conformance!(postgres, Postgres::new());

/// The model test again on each embedded engine, with the count of the inbox and the
/// queues behind each reopen slowed down so that the operations after a reopen race
/// with it: its counts, read while it counts, never exceed the model's; once it is
/// done they are the model's exactly (and the audit, which waits for the inbox's,
/// balances).
mod counted_behind_the_open {
    use super::Embedded;
    use crate::store::embedded::engine::Engine;

    use std::sync::atomic::Ordering;

    /// The model test on `engine`, counting slowly, and that it raced with a count.
    fn check(engine: Engine) {
        super::model::check(|| Box::new(Embedded::counting_slowly(engine)));
        assert!(
            super::model::SEEN_COUNTING.load(Ordering::Relaxed) > 0,
            "no check raced with a queue count"
        );
        assert!(
            super::model::SEEN_INBOX_COUNTING.load(Ordering::Relaxed) > 0,
            "no check raced with an inbox count"
        );
    }

    #[test]
    fn model_on_sled() {
        check(Engine::Sled);
    }

    #[test]
    fn model_on_redb() {
        check(Engine::Redb);
    }
}

mod audit;
mod coordination;
mod delivery_queue;
mod dispatch;
mod event_log;
mod journal;
mod model;
mod races;
mod shared_state;
mod upkeep;
