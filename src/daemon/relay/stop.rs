//! The relay's stop: every part stopped in order and waited for, within
//! `shutdown.grace`, the store closed last once nothing else holds it.

use std::time::Duration;

use anyhow::Context;

use super::{Ended, Relay};
use crate::internal_events::taxonomy::{ErrorType, Stage};
use crate::internal_events::{InternalEvent, ShuttingDown};

impl Relay {
    /// Stops every part in order and waits for each, within `grace`: the ingress
    /// finishes its callbacks, the background tasks end, the operational events and the
    /// last traces go out, the backups being streamed end, the admin listener stops,
    /// the shaping processes end, and the
    /// store commits what is queued and makes it durable ([`CLOSE_SHARE`] of the grace
    /// is kept for that).
    pub(in crate::daemon) async fn stop(
        self,
        ended: Ended,
        grace: Duration,
        durable: bool,
    ) -> anyhow::Result<()> {
        let Self {
            metrics,
            readiness,
            store,
            trigger,
            tasks,
            flow,
            operational,
            shaper,
            backups,
            ..
        } = self;
        let (export, ingress, admin) = (self.export, self.ingress, self.admin);
        ShuttingDown { reason: &ended.reason, grace }.emit(&metrics);
        crate::notify::notify("STOPPING=1\nSTATUS=draining");
        readiness.set(false);
        let started = tokio::time::Instant::now();
        let for_close = grace.mul_f64(CLOSE_SHARE);
        let drain = async {
            ingress.stop(true).await;
            trigger.stop();
            let (first, last) = flow.stop();
            for task in first.into_iter().chain(tasks).chain(last) {
                let _ = task.await;
            }
            // Nothing raises operational events any more: the queue drains and ends.
            metrics.operational.close();
            let _ = operational.await;
            // Nothing records spans any more: the last ones go out.
            if let Some(export) = export {
                export.finish(EXPORT_FINISH, &metrics).await;
            }
            // A backup being streamed ends first, and journals itself while the store
            // is open: its client may have stopped reading, and would hold the
            // listener's graceful stop for the whole grace. Its connection is then
            // cut (its body ends without a checksum), with the listener's others.
            let none_cut = backups.stop(BACKUPS_END).await == 0;
            admin.stop(none_cut).await;
            shaper.close().await;
        };
        if tokio::time::timeout(grace - for_close, drain).await.is_err() {
            let what = "shutdown grace period exceeded; cutting remaining connections";
            crate::internal_events::taxonomy::degraded(
                &metrics,
                crate::internal_events::taxonomy::Stage::Relay,
                crate::internal_events::taxonomy::ErrorType::Stalled,
                what,
                &format_args!("the drain took longer than {:?}", grace - for_close),
            );
            ingress.stop(false).await;
            admin.stop(false).await;
            shaper.close().await;
        }
        if let Some(why) = ended.failure {
            // Fail-stop: the service manager restarts the relay on a freshly opened
            // store, which holds every acknowledged callback (each was durable before
            // its 200).
            anyhow::bail!(
                "the store failed ({why}); exiting so that systemd or Kubernetes restarts the \
                 relay. Every acknowledged callback is on disk; free space on \
                 storage.data_dir if it is full"
            );
        }
        // Commits what is queued, then makes everything durable, in what is left of the
        // grace: a disk that fills now can stall the flush.
        let left = grace.saturating_sub(started.elapsed()).max(for_close);
        let waited = HOLDERS_WAIT.min(left / 4);
        let others = crate::shutdown::let_go(&store, waited).await;
        if others > 0 {
            crate::internal_events::taxonomy::degraded(
                &metrics,
                Stage::Relay,
                ErrorType::Stalled,
                "parts of the relay still hold the store after their stop; closing it anyway",
                &format_args!(
                    "{others} holders left after {waited:?}: the store's file stays open until \
                     they end"
                ),
            );
        }
        let closed = tokio::time::timeout(left, store.close()).await;
        let context = if durable {
            "final flush (every acknowledged callback was already durable before its answer: \
             what the flush missed is dispatch progress, redone after the restart)"
        } else {
            "final flush (storage.durability = \"buffered\": callbacks acknowledged since the \
             last background flush may be lost)"
        };
        match closed {
            Ok(result) => result.context(context)?,
            Err(_) => anyhow::bail!("{context}: not done within shutdown.grace ({grace:?})"),
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// Longest the stop waits for the store's other holders to let go before closing it
/// (`shutdown::let_go`).
const HOLDERS_WAIT: Duration = Duration::from_secs(2);

/// The share of `shutdown.grace` kept for closing the store (its final flush).
const CLOSE_SHARE: f64 = 0.25;

/// Longest the last traces may take to be exported at shutdown (within the grace).
const EXPORT_FINISH: Duration = Duration::from_secs(5);

/// Longest a backup being streamed may take to end and journal itself at the stop
/// (it ends at its next write: milliseconds).
const BACKUPS_END: Duration = Duration::from_secs(2);
