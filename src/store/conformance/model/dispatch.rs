//! Dispatch in the model: the plans of pending events, the deliveries they make, and
//! two stores dispatching the same events at once.

use super::*;

/// The plans of the `pending` events whose position (mod 8) has no bit in `skip`: a
/// dedup key per occurrence (a window longer than any test: the first of an
/// occurrence wins), the routes drawn at append, `b` ordered by the event's resource
/// (left out when `with_ordered` is false).
pub(super) fn plans(
    pending: &[PendingEvent],
    m: &Model,
    routes: &BTreeMap<EventId, u8>,
    skip: u8,
    with_ordered: bool,
) -> Vec<DispatchPlan> {
    pending
        .iter()
        .enumerate()
        .filter(|(i, _)| skip & (1 << (i % 8)) == 0)
        .map(|(_, p)| {
            let occurrence = m.occurrence[&p.id];
            let destinations: Vec<String> = route(routes[&p.id])
                .into_iter()
                .filter(|d| with_ordered || (d != ORDERED && d != LATEST))
                .collect();
            DispatchPlan {
                filtered: destinations
                    .iter()
                    .filter(|d| filtered_out(occurrence, d))
                    .map(|d| crate::store::FilteredOut {
                        destination: d.clone(),
                        reason: "the model's filter".into(),
                        error: false,
                    })
                    .collect(),
                id: p.id,
                dedup: Some(DedupKey { hash: [occurrence; 16], window_us: u64::MAX / 4 }),
                ordered: destinations
                    .iter()
                    .filter(|d| *d == ORDERED || *d == LATEST)
                    .cloned()
                    .collect(),
                latest: destinations.iter().filter(|d| *d == LATEST).cloned().collect(),
                destinations,
                resource: with_ordered.then_some([100 + resource_index(occurrence); 16]),
            }
        })
        .collect()
}

/// Whether the model's filter keeps occurrence `occurrence` from `dest`: some of each
/// destination's, the ordered one's included.
fn filtered_out(occurrence: u8, dest: &str) -> bool {
    match dest {
        ORDERED => occurrence % 5 == 2,
        _ => occurrence % 4 == 1,
    }
}

/// A new delivery of `plan` to `dest` at `now`: due now, or `filtered` (never
/// scheduled, never in a resource's queue).
pub(super) fn dispatched(plan: &DispatchPlan, dest: &str, now: u64) -> Delivery {
    if plan.filtered.iter().any(|f| f.destination == dest) {
        Delivery { state: DeliveryState::Filtered, due: None, round: 0 }
    } else {
        Delivery { state: DeliveryState::Pending, due: Some(now), round: 0 }
    }
}

/// [`Op::RaceDispatch`].
pub(super) async fn race_dispatch(
    a: &SharedStore,
    b: &SharedStore,
    m: &mut Model,
    routes: &BTreeMap<EventId, u8>,
    skip: u8,
) {
    let pending = a.pending(1000).await.unwrap();
    let plans = plans(&pending, m, routes, skip, false);
    let (x, y) = tokio::join!(a.dispatch(plans.clone(), m.now), b.dispatch(plans.clone(), m.now));
    let (x, y) = (x.unwrap(), y.unwrap());
    // The originals this race decided: the one event of each occurrence not a copy.
    let mut decided: BTreeMap<u8, EventId> = BTreeMap::new();
    let mut taken = Vec::new();
    for ((plan, x), y) in plans.iter().zip(x).zip(y) {
        let outcome = match (x, y) {
            (DispatchVerdict::Gone, o) | (o, DispatchVerdict::Gone) => o,
            (x, y) => panic!("{} dispatched twice: {x:?} and {y:?}", plan.id),
        };
        assert_ne!(outcome, DispatchVerdict::Gone, "{} dispatched by neither", plan.id);
        let occurrence = m.occurrence[&plan.id];
        if !matches!(outcome, DispatchVerdict::Duplicate { .. }) {
            assert!(!m.originals.contains_key(&occurrence), "{} is a copy", plan.id);
            assert!(decided.insert(occurrence, plan.id).is_none(), "two originals of {occurrence}");
        }
        taken.push((plan, outcome));
    }
    for (plan, outcome) in taken {
        let occurrence = m.occurrence[&plan.id];
        let status = match outcome {
            DispatchVerdict::Duplicate { original } => {
                let want = m.originals.get(&occurrence).or(decided.get(&occurrence));
                assert_eq!(Some(&original), want, "{}'s original", plan.id);
                EventStatus::Duplicate
            }
            DispatchVerdict::Unrouted => {
                assert!(plan.destinations.is_empty());
                EventStatus::Unrouted
            }
            DispatchVerdict::Dispatched { deliveries: n, .. } => {
                assert_eq!(n, plan.destinations.len());
                for d in &plan.destinations {
                    m.deliveries.insert((plan.id, d.clone()), dispatched(plan, d, m.now));
                }
                EventStatus::Dispatched
            }
            DispatchVerdict::Gone => unreachable!("checked above"),
        };
        m.events.insert(plan.id, status);
    }
    m.originals.extend(decided);
}

/// How many resources the events are about.
pub(super) const RESOURCES: u8 = 3;

/// The resource an occurrence's events are about (several occurrences share one).
pub(super) fn resource_of(occurrence: u8) -> String {
    format!("actions/{}", resource_index(occurrence))
}

/// Which of the [`RESOURCES`] an occurrence is about.
pub(super) fn resource_index(occurrence: u8) -> u8 {
    occurrence % RESOURCES
}
