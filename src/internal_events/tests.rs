//! Every event against the registry: each one's families exist, and are exactly those
//! its samples touch; every family of the registry is touched by an event or is a
//! state gauge (listed below, with who sets it).

use std::collections::BTreeSet;
use std::time::Duration;

use super::store::{Checkpoint, CommitGroup, EventStored, StoreFailed};
use super::*;
use crate::account::AccountId;
use crate::metrics::Metrics;
use crate::store::lifecycle::AttemptVerdict;
use crate::store::{DispatchPlan, DispatchVerdict, EventId, EventMeta, PendingEvent};

/// Families set from state by the task that reads it, not by an occurrence.
const STATE_GAUGES: &[(&str, &str)] = &[
    ("hookrelay_build_info", "set once at start"),
    ("hookrelay_store_size_bytes", "admin/health.rs refresh"),
    ("hookrelay_storage_free_bytes", "space/mod.rs watch"),
    ("hookrelay_storage_floor_bytes", "space/mod.rs watch"),
    ("hookrelay_inbox_events", "admin/health.rs refresh"),
    ("hookrelay_queue_depth", "admin/health.rs refresh"),
    ("hookrelay_queue_oldest_age_seconds", "admin/health.rs refresh"),
    ("hookrelay_destination_paused", "admin/health.rs refresh"),
    ("hookrelay_upstream_hooks", "upstream/gauges.rs, from each pass's listing"),
    ("hookrelay_upstream_hook_triggered_total", "upstream/gauges.rs, the upstream's counts"),
    ("hookrelay_upstream_hook_last_triggered_timestamp_seconds", "upstream/gauges.rs"),
    ("hookrelay_upstream_callbacks_missing", "upstream/gauges.rs, counts compared"),
    ("hookrelay_store_reachable", "daemon/ at start (and StoreProbed)"),
    ("hookrelay_fleet_relays", "daemon/mod.rs at start (and FleetCounted)"),
];

/// The family of one exposition line (`name{labels} value`), histogram suffixes off.
fn family(line: &str, families: &BTreeSet<String>) -> String {
    let name = line.split(['{', ' ']).next().unwrap_or_default();
    for suffix in ["_bucket", "_sum", "_count", ""] {
        if let Some(base) = name.strip_suffix(suffix) {
            if families.contains(base) {
                return base.to_owned();
            }
        }
    }
    panic!("{line:?} is of no registered family")
}

/// The families whose samples `emit` changed, on a fresh registry.
fn touched(emit: impl FnOnce(&Metrics)) -> BTreeSet<String> {
    let m = Metrics::new().unwrap();
    let families: BTreeSet<String> = m.family_names().into_iter().collect();
    m.relay.ready.set(-1); // no event sets it so: setting it ready or not ready both show
    let before: BTreeSet<String> = m.render().lines().map(str::to_owned).collect();
    emit(&m);
    let after: BTreeSet<String> = m.render().lines().map(str::to_owned).collect();
    after
        .symmetric_difference(&before)
        .filter(|l| !l.starts_with('#'))
        .map(|l| family(l, &families))
        .collect()
}

/// Runs `f`, returning what it returned and the most severe level it logged at.
fn logging<T>(f: impl FnOnce() -> T) -> (T, Option<tracing::Level>) {
    use tracing_subscriber::layer::SubscriberExt;
    /// Keeps the most severe level of the events it sees.
    struct Worst(std::sync::Arc<std::sync::Mutex<Option<tracing::Level>>>);
    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Worst {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let level = *event.metadata().level();
            let mut worst = self.0.lock().unwrap();
            // In `tracing`, the more severe level is the smaller.
            if worst.is_none_or(|w| level < w) {
                *worst = Some(level);
            }
        }
    }
    let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
    let subscriber = tracing_subscriber::registry().with(Worst(seen.clone()));
    let out = tracing::subscriber::with_default(subscriber, f);
    let worst = *seen.lock().unwrap();
    (out, worst)
}

/// Emits each sample of `E` and checks its declared families, and that a sample
/// logging an error counts it in the taxonomy.
fn check<E: InternalEvent>(samples: Vec<E>, seen: &mut BTreeSet<String>) {
    let name = std::any::type_name::<E>();
    let registered: BTreeSet<String> = Metrics::new().unwrap().family_names().into_iter().collect();
    let declared: BTreeSet<String> = E::FAMILIES.iter().map(|f| (*f).to_owned()).collect();
    for f in &declared {
        assert!(registered.contains(f), "{name} declares {f}, which is not registered");
    }
    let mut union = BTreeSet::new();
    for sample in samples {
        let (families, worst) = logging(|| touched(|m| sample.emit(m)));
        // The taxonomy's rule: an error the relay logs is an error it counts.
        if worst == Some(tracing::Level::ERROR) {
            assert!(
                families.contains(taxonomy::ERRORS),
                "{name} logs an error and counts none in {}: {families:?}",
                taxonomy::ERRORS
            );
        }
        union.extend(families);
    }
    assert_eq!(union, declared, "{name}: the families its samples touch");
    seen.extend(union);
}

fn meta() -> EventMeta {
    crate::store::fixtures::received("demo", "ActionCreated", 1_000_000, "{}").meta
}

#[test]
fn every_event_touches_the_families_it_declares_and_every_family_is_accounted_for() {
    let mut seen = BTreeSet::new();
    let s = &mut seen;
    let took = Duration::from_millis(3);
    let err: &dyn std::fmt::Display = &"boom";
    let id = EventId::new(7);
    let from = Some(std::net::IpAddr::from([127, 0, 0, 1]));
    check(
        vec![
            ConsoleSignIn { result: SignIn::Ok, from },
            ConsoleSignIn { result: SignIn::WrongToken, from: None },
            ConsoleSignIn { result: SignIn::Throttled, from },
        ],
        s,
    );
    check(
        vec![
            CallbackStored { id, source: "demo", event: "A", rejected: false, took },
            CallbackStored { id, source: "demo", event: "A", rejected: true, took },
        ],
        s,
    );
    let changes =
        crate::config::reload::Changes { added: vec!["crm".into()], ..Default::default() };
    check(vec![ConfigInForce { fingerprint: 0xabc }], s);
    check(
        vec![
            ConfigReloaded {
                by: "SIGHUP",
                result: Reload::Reloaded { changes: &changes, fingerprint: 1 },
            },
            ConfigReloaded { by: "admin", result: Reload::Unchanged },
            ConfigReloaded { by: "admin", result: Reload::Refused("storage.data_dir changed") },
            ConfigReloaded { by: "SIGHUP", result: Reload::Invalid("no such file") },
        ],
        s,
    );
    check(vec![CallbackRefused { source: "unknown", peer: None, logged: Some(0), took }], s);
    check(
        vec![
            CallbackClosed { source: "demo", why: Closed::NoSpace, took },
            CallbackClosed { source: "demo", why: Closed::BodyTimeout(took), took },
            CallbackClosed { source: "demo", why: Closed::Incomplete(err), took },
        ],
        s,
    );
    check(vec![CallbackNotStored { source: "demo", event: "A", error: err, took }], s);

    let pending = PendingEvent { id, meta: meta(), body: bytes::Bytes::new() };
    let plan = DispatchPlan {
        latest: Vec::new(),
        filtered: vec![crate::store::FilteredOut {
            destination: "erp".into(),
            reason: "the filter gave false".into(),
            error: false,
        }],
        id,
        dedup: None,
        destinations: vec!["crm".into(), "erp".into()],
        ordered: Vec::new(),
        resource: None,
    };
    let outcomes = [
        DispatchVerdict::Dispatched { deliveries: 2, superseded: vec!["erp".into()] },
        DispatchVerdict::Duplicate { original: EventId::new(1) },
        DispatchVerdict::Unrouted,
        DispatchVerdict::Gone,
    ];
    let samples =
        outcomes.iter().map(|outcome| EventDispatched { event: &pending, plan: &plan, outcome });
    check(samples.collect(), s);
    check(
        vec![
            DispatchLead::Taken,
            DispatchLead::Lost,
            DispatchLead::Elsewhere,
            DispatchLead::Unknown(err),
        ],
        s,
    );
    check(vec![DedupKeysCounted(3)], s);
    check(vec![DedupKeysPurged(512), DedupKeysPurged(0)], s);

    let m = meta();
    check(vec![AttemptFinished { destination: "crm", took }], s);
    check(
        vec![
            AdminTokenRefused { throttled: false, from },
            AdminTokenRefused { throttled: true, from: None },
        ],
        s,
    );
    {
        use crate::wrong_tokens::Refused;
        let wait = std::time::Duration::from_secs(3);
        check(
            vec![
                PullTokenRefused { result: Refused::Wrong, unknown_destination: false, from },
                PullTokenRefused { result: Refused::Wrong, unknown_destination: true, from },
                PullTokenRefused {
                    result: Refused::Throttled(wait),
                    unknown_destination: false,
                    from: None,
                },
            ],
            s,
        );
    }
    check(
        vec![
            PostgresTls { sslmode: "prefer", verified: false },
            PostgresTls { sslmode: "verify-full", verified: true },
        ],
        s,
    );
    let stopped = |disabled| ShapeRunStopped {
        destination: "crm",
        role: "filter",
        cause: StopCause::Overran,
        reason: "the program ran longer than 2s",
        disabled,
    };
    check(vec![stopped(false), stopped(true)], s);
    check(
        vec![TransformFailed {
            event: id,
            destination: "crm",
            reason: "the transform gave no output",
        }],
        s,
    );
    let recorded = |verdict| AttemptRecorded {
        event: id,
        meta: Some(&m),
        destination: "crm",
        attempt: 1,
        status: Some(500),
        error: None,
        verdict,
    };
    check(
        vec![
            recorded(AttemptVerdict::Success),
            recorded(AttemptVerdict::Dead),
            recorded(AttemptVerdict::Retry),
        ],
        s,
    );
    check(
        vec![
            CircuitChanged { destination: "crm", open: true },
            CircuitChanged { destination: "crm", open: false },
        ],
        s,
    );
    let stalled = |restart| DestinationStalled {
        destination: "crm",
        idle: took,
        circuit: &"closed",
        in_flight: 0,
        share: 4,
        free: 4,
        restart,
    };
    check(vec![stalled(true), stalled(false)], s);
    check(vec![DestinationRecovered { destination: "crm" }], s);
    check(vec![DestinationGone { destination: "crm" }], s);
    check(
        vec![RemovedDestinationFound {
            destination: "old",
            pending: 1,
            retrying: 2,
            held: 0,
            grace: Duration::from_secs(60),
        }],
        s,
    );
    check(vec![RemovedDestinationRetired { destination: "old", dead: 3 }], s);

    check(
        vec![CommitGroup { size: 3, took, ok: true }, CommitGroup { size: 1, took, ok: false }],
        s,
    );
    check(vec![Checkpoint { took, ok: true }, Checkpoint { took, ok: false }], s);
    check(vec![EventStored(&m)], s);
    check(vec![StoreFailed { reason: "the disk is full" }], s);
    check(
        vec![
            StoreProbed::Reachable,
            StoreProbed::Back,
            StoreProbed::Lost("x"),
            StoreProbed::StillLost,
        ],
        s,
    );
    check(
        vec![
            ClockChecked { skew_us: 3_000_000, problem: Some("off"), was_off: false },
            ClockChecked { skew_us: -1_000, problem: None, was_off: true },
        ],
        s,
    );
    let imbalance = vec!["demo/E: received 2 but ...".to_owned()];
    let failed = crate::store::StoreError::Injected("down");
    check(
        vec![
            AuditChecked::Read(&imbalance),
            AuditChecked::Read(&[]),
            AuditChecked::Failed(&failed),
        ],
        s,
    );
    check(vec![TaskDied { kind: "dispatcher", name: "dispatcher", why: "it panicked" }], s);
    check(vec![EventsPruned(2), EventsPruned(0)], s);
    check(vec![BodiesPruned(2), BodiesPruned(0)], s);
    check(vec![FleetCounted { relays: 2, recovered: true }], s);
    check(vec![RelayReady { sources: 1 }], s);
    check(vec![ShuttingDown { reason: "SIGTERM", grace: took }], s);
    check(vec![SpansExported { spans: 3, recovered: true }], s);
    check(vec![SpanExportFailed { spans: 3, why: "HTTP 503", logged: true }], s);
    check(vec![SpanDropped], s);

    let account = AccountId { source: "demo".into(), account: "alice".into() };
    let a = &account;
    check(vec![UpstreamRequest { account: a, method: "GET", outcome: "ok" }], s);
    check(vec![TokenRefreshed { account: a, failed: None }], s);
    check(vec![TokenRefreshed { account: a, failed: Some(err) }], s);
    check(
        vec![HookTransition { account: a, event: "ActionCreated", from: "none", to: "Active" }],
        s,
    );
    let old = ["h1".to_owned()];
    check(
        vec![HookRecreated {
            account: a,
            event: "ActionCreated",
            old: &old,
            new: "h2",
            window_start: None,
        }],
        s,
    );
    let errors = ["listing failed".to_owned()];
    check(
        vec![
            AccountReconciled { account: a, took, hooks: 3, changes: 1, errors: &[] },
            AccountReconciled { account: a, took, hooks: 0, changes: 0, errors: &errors },
        ],
        s,
    );
    check(vec![ReconcilerStoreFailed { what: "cannot read", account: Some(a), error: err }], s);
    check(vec![StoredGapUnreadable { key: "gap/x", error: err }], s);
    check(
        vec![
            taxonomy::StepFailed {
                stage: taxonomy::Stage::Dispatch,
                error_type: taxonomy::ErrorType::Storage,
                what: "dispatch failed; retrying in 1 s",
                error: err,
                worked_around: false,
            },
            taxonomy::StepFailed {
                stage: taxonomy::Stage::Retention,
                error_type: taxonomy::ErrorType::Storage,
                what: "pruning failed; trying again next pass",
                error: err,
                worked_around: false,
            },
        ],
        s,
    );
    check(
        vec![taxonomy::StepFailed {
            stage: taxonomy::Stage::Admin,
            error_type: taxonomy::ErrorType::Storage,
            what: "cannot read the store size for /metrics; the last one is shown",
            error: err,
            worked_around: true,
        }],
        s,
    );

    let registered: BTreeSet<String> = Metrics::new().unwrap().family_names().into_iter().collect();
    for family in &registered {
        assert!(
            seen.contains(family) || STATE_GAUGES.iter().any(|(f, _)| f == family),
            "{family}: no event touches it, and it is not listed as a state gauge"
        );
    }
    for (family, _) in STATE_GAUGES {
        assert!(registered.contains(*family), "{family} is listed but not registered");
    }
}
