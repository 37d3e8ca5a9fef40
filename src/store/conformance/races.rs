//! The contract's rules with their writers racing, as a relay runs them: appends,
//! dispatch and the workers' claims and records of one destination's resources, all at
//! once on several threads. The model test drives one operation at a time, so it cannot
//! see a rule that read before another writer's commit and wrote back what that commit
//! changed (the redb read scope once did: a delivery sent twice under load).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::*;

/// Events appended, in all.
const EVENTS: usize = 600;
/// Resources they are about: each has `EVENTS / RESOURCES` updates in a row.
const RESOURCES: usize = 6;
/// Workers per destination, each claiming a few at a time.
const WORKERS: usize = 3;
/// The bound on the whole run: far above its usual second or two.
const WITHIN: Duration = Duration::from_secs(30);

/// What the sink answers for the `i`-th event: every fifth is refused once and then
/// taken (a retry), every seventh is refused for good (dead: its resource's turn passes
/// on all the same), the rest taken at once.
fn answers(i: usize) -> &'static [AnswerClass] {
    if i % 7 == 3 {
        &[AnswerClass::Permanent]
    } else if i % 5 == 2 {
        &[AnswerClass::Retry { retry_after: None }, AnswerClass::Success]
    } else {
        &[AnswerClass::Success]
    }
}

/// Retries due within milliseconds, so that a retried head holds its resource briefly.
fn quick_retries() -> RetryPolicy {
    retrying_every(Duration::from_millis(5))
}

/// One attempt as a worker saw it: which event (its index, from its body), of which
/// destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    i: usize,
    destination: &'static str,
}

/// A committer that dispatches what it stores (`Dispatch::dispatch_with_commits`, the
/// embedded store) beside the dispatcher: it declines every third group, which leaves
/// a backlog to the dispatcher, so both paths take turns on each resource's queue
/// while the workers claim and record.
struct RacingCommitter {
    planner: crate::store::Planner,
    now: Box<dyn Fn() -> u64 + Send + Sync>,
    dispatched: Arc<AtomicUsize>,
    offered: AtomicUsize,
    /// Events it dispatched itself.
    took: AtomicUsize,
}

impl crate::store::CommitDispatch for RacingCommitter {
    fn dispatch(
        &self,
        pending: &[PendingEvent],
        write: crate::store::DispatchWrite<'_>,
    ) -> Result<bool, crate::store::StoreError> {
        if self.offered.fetch_add(1, Ordering::SeqCst) % 3 == 2 {
            return Ok(false);
        }
        let verdicts = write(&(self.planner)(pending), (self.now)())?;
        let taken = verdicts.iter().filter(|v| !matches!(v, DispatchVerdict::Gone)).count();
        self.dispatched.fetch_add(taken, Ordering::SeqCst);
        self.took.fetch_add(taken, Ordering::SeqCst);
        Ok(true)
    }
}

/// The index the appender wrote into the claimed event's body.
fn index_of(claim: &crate::store::Claim) -> usize {
    let body = claim.body.as_ref().expect("a claimed event has its body");
    let body: serde_json::Value = serde_json::from_slice(body).expect("the body as appended");
    body["i"].as_u64().expect("the body's index") as usize
}

/// An ordered destination `o` (per resource) and an unordered one `free`, fed by one
/// appender and one dispatcher (and, where the store's committer dispatches what it
/// stored, that committer too: [`RacingCommitter`]) while `WORKERS` workers of each
/// claim and record. Every
/// attempt must be recorded (never stale, never a lost claim: nobody else holds one),
/// every delivery attempted exactly as many times as its answers say, each resource's
/// attempts at `o` in the order of its events, and everything final within [`WITHIN`].
pub(super) async fn appends_dispatch_and_attempts_race_on_one_resource(h: &mut dyn Harness) {
    let store = h.open().await;
    let start = Instant::now();
    let now = move || 1_000 * S + start.elapsed().as_micros() as u64;
    let appended = Arc::new(AtomicBool::new(false));
    // Each event its own dedup key; its resource key its resource's name (the store
    // sits below dispatch, whose rule it may not call: any distinct keys do).
    let planner: crate::store::Planner = Arc::new(|pending: &[PendingEvent]| {
        pending
            .iter()
            .map(|p| {
                let resource = p.meta.resource.as_deref().expect("every event has a resource");
                let mut key = [0u8; 16];
                key[..resource.len().min(16)]
                    .copy_from_slice(&resource.as_bytes()[..resource.len().min(16)]);
                DispatchPlan {
                    latest: Vec::new(),
                    filtered: Vec::new(),
                    id: p.id,
                    dedup: Some(own_key(p.id)),
                    destinations: vec!["o".into(), "free".into()],
                    ordered: vec!["o".into()],
                    resource: Some(key),
                }
            })
            .collect()
    });
    let dispatched = Arc::new(AtomicUsize::new(0));
    let committer = RacingCommitter {
        planner: planner.clone(),
        now: Box::new(now),
        dispatched: dispatched.clone(),
        offered: AtomicUsize::new(0),
        took: AtomicUsize::new(0),
    };
    let committer = Arc::new(committer);
    let committer_dispatches = store.dispatch_with_commits(Some(committer.clone()));
    // The appender starts once the committer dispatches (where it does), and the
    // dispatcher once `ALONE` events are appended: the committer meets the first ones
    // alone (it declines the third, which leaves a backlog to the dispatcher), so that
    // it takes part whatever the threads' timing.
    const ALONE: usize = 30;
    let appends = Arc::new(AtomicUsize::new(0));
    let appender = {
        let (store, appended, appends) = (store.clone(), appended.clone(), appends.clone());
        tokio::spawn(async move {
            for i in 0..EVENTS {
                let body = format!("{{\"i\":{i}}}");
                let event = about(
                    received("demo", "ActionUpdated", now(), &body),
                    &format!("actions/{}", i % RESOURCES),
                );
                store.append(event).await.unwrap();
                appends.fetch_add(1, Ordering::SeqCst);
                if i % 16 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            appended.store(true, Ordering::SeqCst);
        })
    };
    let dispatcher = {
        let (store, appended, dispatched) = (store.clone(), appended.clone(), dispatched.clone());
        tokio::spawn(async move {
            while appends.load(Ordering::SeqCst) < ALONE {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            loop {
                let done = appended.load(Ordering::SeqCst);
                let (pending, _, verdicts) =
                    store.dispatch_next(8, planner.clone(), now()).await.unwrap();
                // Gone: taken by nobody this time (on PostgreSQL a row locked by another
                // transaction is skipped); the next pass reads it again.
                let taken = verdicts.iter().filter(|v| !matches!(v, DispatchVerdict::Gone)).count();
                dispatched.fetch_add(taken, Ordering::SeqCst);
                if done && pending.is_empty() {
                    return;
                }
                if pending.is_empty() {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    // The attempts every worker made, in the order they claimed them.
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let finals = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = ["o", "free"]
        .into_iter()
        .flat_map(|destination| (0..WORKERS).map(move |w| (destination, w)))
        .map(|(destination, w)| {
            let (store, seen, finals) = (store.clone(), seen.clone(), finals.clone());
            tokio::spawn(async move {
                let owner = format!("{destination}-{w}");
                while finals.load(Ordering::SeqCst) < 2 * EVENTS {
                    let claims =
                        store.claim_due(destination, &owner, now(), LEASE, 3).await.unwrap();
                    if claims.is_empty() {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        continue;
                    }
                    let mut reports = Vec::new();
                    for claim in claims {
                        let i = index_of(&claim);
                        let n = {
                            let mut seen = seen.lock().unwrap();
                            seen.push(Seen { i, destination });
                            seen.iter().filter(|s| **s == Seen { i, destination }).count()
                        };
                        let classes = answers(i);
                        let class = *classes.get(n - 1).unwrap_or_else(|| {
                            panic!("{destination}: event {i} attempted {n} times: {classes:?}")
                        });
                        reports.push((claim, report(class, now())));
                    }
                    let recorded =
                        store.record_attempts(reports, &quick_retries(), None).await.unwrap();
                    for write in recorded.writes {
                        match write {
                            AttemptWrite::Done(AttemptVerdict::Retry) => {}
                            AttemptWrite::Done(_) => {
                                finals.fetch_add(1, Ordering::SeqCst);
                            }
                            other => panic!("{destination}: an attempt not recorded: {other:?}"),
                        }
                    }
                }
            })
        })
        .collect();
    let all = async {
        appender.await.unwrap();
        dispatcher.await.unwrap();
        for w in workers {
            w.await.unwrap();
        }
    };
    if tokio::time::timeout(WITHIN, all).await.is_err() {
        panic!(
            "not final within {WITHIN:?}: {} of {} deliveries, {} of {EVENTS} events \
             dispatched; queues: o {:?}, free {:?}",
            finals.load(Ordering::SeqCst),
            2 * EVENTS,
            dispatched.load(Ordering::SeqCst),
            store.queue_stats("o").await,
            store.queue_stats("free").await,
        );
    }
    store.dispatch_with_commits(None);
    if committer_dispatches {
        // Both paths took part (else the race was not run).
        let (offered, took) =
            (committer.offered.load(Ordering::SeqCst), committer.took.load(Ordering::SeqCst));
        assert!(offered >= 3 && took > 0, "the committer took {took} in {offered} batches");
    }
    let seen = seen.lock().unwrap().clone();
    // Each event dispatched once: never twice, none left in the inbox.
    assert_eq!(dispatched.load(Ordering::SeqCst), EVENTS, "events dispatched");
    for destination in ["o", "free"] {
        // Each delivery attempted exactly as its answers say, and left as they say.
        let mut dead = 0;
        for i in 0..EVENTS {
            let n = seen.iter().filter(|s| **s == Seen { i, destination }).count();
            assert_eq!(n, answers(i).len(), "{destination}: attempts of event {i}");
            dead += usize::from(answers(i) == [AnswerClass::Permanent]);
        }
        let q = store.queue_stats(destination).await.unwrap();
        assert_eq!(
            (q.pending, q.held, q.retrying, q.dead),
            (0, 0, 0, dead as u64),
            "{destination}: the queue at the end"
        );
    }
    // At `o`, each resource's attempts in its events' order (a retried head is tried
    // again before its successor).
    for r in 0..RESOURCES {
        let order: Vec<usize> = seen
            .iter()
            .filter(|s| s.destination == "o" && s.i % RESOURCES == r)
            .map(|s| s.i)
            .collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "resource {r}: attempts at the ordered destination");
    }
    store.close().await.unwrap();
}
