//! Attempts' records riding the committer's groups: in the group's transaction,
//! durable when answered, and a rider's failure its own.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use super::Rider;
use crate::store::lifecycle::{AnswerClass, AttemptReport};
use crate::store::{
    Attempt, AttemptWrite, Claim, DeliveryQueue, DeliveryState, Dispatch, EventId, EventLog,
    EventStatus, Recorded, StoreError, Upkeep,
};

type Answer = oneshot::Receiver<Result<Recorded, StoreError>>;

/// A successful attempt on `claim`, as a rider.
fn delivered(claim: &Claim) -> (Rider, Answer) {
    let report = AttemptReport {
        attempt: Attempt {
            at_us: 2_000,
            duration_us: 100,
            status: Some(200),
            error: None,
            answer: None,
        },
        class: AnswerClass::Success,
        jitter: 0.0,
    };
    let (reply, answer) = oneshot::channel();
    let rider = Rider {
        attempts: vec![(claim.clone(), report)],
        policy: crate::config::RetryPolicy::default(),
        bodies_before_us: None,
        reply,
    };
    (rider, answer)
}

/// A store on `engine` whose committer dispatches what it stores to destination
/// `a`, with `n` events stored and their deliveries claimed.
async fn with_claims(
    engine: super::super::Engine,
    dir: &std::path::Path,
    n: u64,
) -> (super::super::EmbeddedStore, Vec<Claim>) {
    let store = super::super::testutil::open_on(engine, dir);
    assert!(store.dispatch_with_commits(Some(Arc::new(DispatchToA))));
    for at in 1..=n {
        let event = crate::store::fixtures::received("demo", "A", at * 1_000, "{}");
        store.append(event).await.unwrap();
    }
    let claims = store.claim_due("a", "test", 10_000, Duration::from_secs(60), 10).await.unwrap();
    assert_eq!(claims.len() as u64, n);
    (store, claims)
}

/// The dispatcher's rules as the tests lend them: every event to `a`.
struct DispatchToA;

impl crate::store::CommitDispatch for DispatchToA {
    fn dispatch(
        &self,
        pending: &[crate::store::PendingEvent],
        write: crate::store::DispatchWrite<'_>,
    ) -> Result<bool, StoreError> {
        let plans: Vec<_> = pending
            .iter()
            .map(|p| crate::store::DispatchPlan {
                dedup: None,
                ..crate::store::fixtures::plan(p.id, 0, &["a"])
            })
            .collect();
        write(&plans, 1_000)?;
        Ok(true)
    }
}

/// A record that rides a quiet group is written in the transaction that stores and
/// dispatches the group, and is durable by the time it is answered: what a power
/// cut leaves then holds the delivery delivered, and the new event dispatched. Its
/// claim is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_riding_a_quiet_group_is_in_its_write_and_durable_when_answered() {
    let (dir, image) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let engine = super::super::Engine::Redb;
    let (store, claims) = with_claims(engine, dir.path(), 1).await;
    let (rider, mut answer) = delivered(&claims[0]);
    let event = crate::store::fixtures::received("demo", "A", 5_000, "{}");
    let written = store.inner.append(std::slice::from_ref(&event), true, vec![rider]).unwrap();
    assert!(!written.waiting, "the group was dispatched in its write");
    let recorded = answer.try_recv().expect("answered when the write returned").unwrap();
    assert_eq!(
        recorded.writes,
        [AttemptWrite::Done(crate::store::lifecycle::AttemptVerdict::Success)]
    );
    assert!(!store.inner.claims.holds("a", claims[0].event, claims[0].token), "released");
    assert!(store.crash_image(image.path()).unwrap());
    let cut = super::super::testutil::open_on(engine, image.path());
    let first = cut.deliveries_of(claims[0].event).await.unwrap();
    assert_eq!(first[0].state, DeliveryState::Delivered, "the record is durable");
    let new = cut.event(written.ids[0]).await.unwrap().expect("the event is durable");
    assert_eq!(new.meta.status, EventStatus::Dispatched);
    cut.close().await.unwrap();
    store.close().await.unwrap();
}

/// A rider whose rules fail (its delivery's record is corrupt) is answered with its
/// error, and nothing it staged is written; the group and the other riders of the
/// same write are written as if it were not there. Riders also come alone (no
/// group), and a group that is not quiet carries them too. On both engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_riders_failure_is_its_own_and_riders_come_with_any_write() {
    for engine in [super::super::Engine::Redb, super::super::Engine::Sled] {
        let dir = tempfile::tempdir().unwrap();
        let (store, claims) = with_claims(engine, dir.path(), 5).await;
        let inner = &store.inner;
        let corrupt = &claims[1];
        inner
            .deliveries
            .insert(super::super::keys::delivery(corrupt.event, "a"), b"not a record")
            .unwrap();
        let (good, mut good_answer) = delivered(&claims[0]);
        // Its first attempt is sound, its second not: neither is written.
        let (mut bad, mut bad_answer) = delivered(&claims[4]);
        bad.attempts.extend(delivered(corrupt).0.attempts);
        let event = crate::store::fixtures::received("demo", "A", 9_000, "{}");
        let written = inner.append(std::slice::from_ref(&event), true, vec![good, bad]).unwrap();
        assert_eq!(written.ids.len(), 1, "{engine:?}: the group stored");
        let bad = bad_answer.try_recv().unwrap();
        assert!(matches!(bad, Err(StoreError::Corrupt { .. })), "{engine:?}: {bad:?}");
        assert!(good_answer.try_recv().unwrap().is_ok(), "{engine:?}");
        let fifth = store.deliveries_of(claims[4].event).await.unwrap();
        assert_eq!(fifth[0].state, DeliveryState::Pending, "{engine:?}: taken back");
        assert!(inner.claims.holds("a", claims[4].event, claims[4].token), "{engine:?}");
        let first = store.deliveries_of(claims[0].event).await.unwrap();
        assert_eq!(first[0].state, DeliveryState::Delivered, "{engine:?}");
        let new = store.event(written.ids[0]).await.unwrap().unwrap();
        assert_eq!(new.meta.status, EventStatus::Dispatched, "{engine:?}");

        // Alone: no group, and nothing appended.
        let (alone, mut alone_answer) = delivered(&claims[2]);
        let written = inner.append(&[], true, vec![alone]).unwrap();
        assert!(written.ids.is_empty());
        assert!(alone_answer.try_recv().unwrap().is_ok(), "{engine:?}");
        let third = store.deliveries_of(claims[2].event).await.unwrap();
        assert_eq!(third[0].state, DeliveryState::Delivered, "{engine:?}");

        // With a group that is not quiet: stored for the dispatcher.
        let (with_group, mut with_answer) = delivered(&claims[3]);
        let events: Vec<_> = (10..16u64)
            .map(|at| crate::store::fixtures::received("demo", "A", at * 1_000, "{}"))
            .collect();
        let written = inner.append(&events, false, vec![with_group]).unwrap();
        assert!(written.waiting, "left for the dispatcher");
        assert!(with_answer.try_recv().unwrap().is_ok(), "{engine:?}");
        let fourth = store.deliveries_of(claims[3].event).await.unwrap();
        assert_eq!(fourth[0].state, DeliveryState::Delivered, "{engine:?}");
        let pending: Vec<EventId> = store.pending(10).await.unwrap().iter().map(|p| p.id).collect();
        assert_eq!(pending, written.ids, "{engine:?}");
        store.close().await.unwrap();
    }
}
