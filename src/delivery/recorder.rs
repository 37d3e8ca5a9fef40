//! Group record: the attempts of one destination that finish together are recorded by
//! one store call (one lock, one transaction, one fsync), as the committer groups
//! callbacks. Each attempt waits for its own outcome; under light load a group is one
//! attempt, under heavy load groups grow by themselves.

use tokio::sync::{mpsc, oneshot};

use crate::config::RetryPolicy;
use crate::store::lifecycle::AttemptReport;
use crate::store::{Claim, Recorded, SharedStore};

/// Most attempts one store call records.
const MAX_GROUP: usize = 256;

type Reply = oneshot::Sender<Result<Recorded, String>>;

/// Handle to a destination's recorder task; the task ends when every handle is gone.
#[derive(Clone)]
pub(super) struct Recorder {
    tx: mpsc::Sender<(Claim, AttemptReport, Reply)>,
}

impl Recorder {
    pub(super) fn start(store: SharedStore, policy: RetryPolicy) -> Self {
        let (tx, mut rx) = mpsc::channel::<(Claim, AttemptReport, Reply)>(MAX_GROUP * 4);
        tokio::spawn(async move {
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
                match store.record_attempts(attempts, &policy).await {
                    Ok(outcomes) => {
                        for (reply, outcome) in replies.into_iter().zip(outcomes) {
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
        Self { tx }
    }

    /// Records one attempt (with whatever else finishes meanwhile).
    pub(super) async fn record(
        &self,
        claim: Claim,
        report: AttemptReport,
    ) -> anyhow::Result<Recorded> {
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
