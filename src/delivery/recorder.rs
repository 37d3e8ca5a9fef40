//! Group record: the attempts of one destination that finish together are recorded by
//! one store call (one lock, one transaction, one fsync), as the committer groups
//! callbacks. Each attempt waits for its own outcome; under light load a group is one
//! attempt, under heavy load groups grow by themselves.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::clock::micros;
use crate::config::RetryPolicy;
use crate::internal_events::taxonomy::{degraded, ErrorType, Stage};
use crate::internal_events::{BodiesDroppedAtSettlement, InternalEvent};
use crate::metrics::Metrics;
use crate::store::lifecycle::AttemptReport;
use crate::store::{AttemptWrite, Claim, Recorded, SharedStore};

/// Most attempts one store call records.
const MAX_GROUP: usize = 256;
/// First wait before recording a group again after the store failed to, doubled up
/// to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Records `attempts`, again and again while the store fails and their claims still
/// hold: the attempts were made, and a delivery whose outcome is not recorded stays
/// claimed by this relay until its lease runs out (75 s by default). Seen when a relay
/// frozen for 15 s came back: every write in flight had outlived
/// `storage.write_timeout`, and the deliveries it had just made waited a whole lease.
/// A store that failed for good is not retried. An event an attempt settles loses its
/// body there if `retention.delivered_bodies` (`delivered_bodies`) has passed since it
/// came: the retention pass went past it while it was still owed.
async fn record_while_held(
    store: &SharedStore,
    attempts: Vec<(Claim, AttemptReport)>,
    policy: &RetryPolicy,
    delivered_bodies: Option<Duration>,
    metrics: &Metrics,
) -> Result<Recorded, crate::store::StoreError> {
    let held_until = attempts.iter().map(|(c, _)| c.expires_us).min().unwrap_or(0);
    let mut wait = RETRY_FIRST;
    loop {
        let bodies_before_us = delivered_bodies.map(crate::retention::cutoff_us);
        match store.record_attempts(attempts.clone(), policy, bodies_before_us).await {
            Err(e)
                if !matches!(e, crate::store::StoreError::Failed(_))
                    && crate::clock::now_us().saturating_add(micros(wait)) < held_until =>
            {
                let what = format!(
                    "recording {} attempts failed; trying again in {wait:?} while their claims hold",
                    attempts.len()
                );
                degraded(metrics, Stage::Delivery, ErrorType::Storage, &what, &e);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
            other => return other,
        }
    }
}

type Reply = oneshot::Sender<Result<AttemptWrite, String>>;

/// A destination's recorder task and its owner: the worker sends through it, and
/// [`Recorder::close`] ends the task and waits for it (the task holds the store, which
/// the relay closes only once nothing else holds it: `daemon/relay/stop.rs`).
pub(super) struct Recorder {
    tx: mpsc::Sender<(Claim, AttemptReport, Reply)>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    pub(super) fn start(
        store: SharedStore,
        policy: RetryPolicy,
        delivered_bodies: Option<Duration>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (tx, mut rx) = mpsc::channel::<(Claim, AttemptReport, Reply)>(MAX_GROUP * 4);
        let task = tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match rx.try_recv() {
                        Ok(next) => group.push(next),
                        Err(_) => break,
                    }
                }
                let (attempts, replies): (Vec<_>, Vec<_>) =
                    group.into_iter().map(|(c, r, reply)| ((c, r), reply)).unzip();
                match record_while_held(&store, attempts, &policy, delivered_bodies, &metrics).await
                {
                    Ok(recorded) => {
                        BodiesDroppedAtSettlement(recorded.bodies_dropped).emit(&metrics);
                        for (reply, outcome) in replies.into_iter().zip(recorded.writes) {
                            let _ = reply.send(Ok(outcome));
                        }
                    }
                    Err(e) => {
                        for reply in replies {
                            let _ = reply.send(Err(e.to_string()));
                        }
                    }
                }
            }
        });
        Self { tx, task }
    }

    /// Ends the task once it has recorded what was sent, and waits for it.
    pub(super) async fn close(self) {
        let Self { tx, task } = self;
        drop(tx);
        if let Err(e) = task.await {
            if e.is_panic() {
                std::panic::resume_unwind(e.into_panic());
            }
        }
    }

    /// Records one attempt (with whatever else finishes meanwhile).
    pub(super) async fn record(
        &self,
        claim: Claim,
        report: AttemptReport,
    ) -> anyhow::Result<AttemptWrite> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send((claim, report, reply))
            .await
            .map_err(|_| anyhow::anyhow!("the recorder has stopped"))?;
        answer
            .await
            .map_err(|_| anyhow::anyhow!("the recorder has stopped"))?
            .map_err(|e| anyhow::anyhow!("recording the attempt failed: {e}"))
    }
}
