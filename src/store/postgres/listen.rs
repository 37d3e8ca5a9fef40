//! Wake-ups across the fleet: a transaction that makes deliveries due (dispatch, a
//! replay, the next of a per-resource queue) sends `NOTIFY` on the schema's channel
//! with the destination's name; every relay `LISTEN`s on a connection of its own and
//! wakes that destination's worker, so a delivery made due by one relay starts on any
//! relay without waiting for a poll. PostgreSQL delivers a notification only when
//! its transaction commits, and folds duplicates within one transaction.
//!
//! A relay that stores events without leading dispatch tells the leader the same way,
//! in the append's transaction (a payload of its instance alone, [`Wake::Inbox`]), so
//! a callback that reaches any relay of the fleet is dispatched at once.
//!
//! The poll stays as the fallback: notifications sent while a listener is
//! reconnecting are lost, so each (re)connection announces [`Wake::All`].

use std::time::Duration;

use tokio::sync::broadcast;
use tokio_postgres::AsyncMessage;

use super::cached::Cached;
use super::PgState;
use crate::store::lifecycle::Changes;
use crate::store::{StoreError, Wake};

/// Wake-ups buffered per subscriber; one that falls further behind is told
/// [`Wake::All`] (see `Store::wakeups`).
const BUFFER: usize = 1024;
/// Reconnection delays of the listener: from the first to the longest.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// The listener's `application_name`, so an operator can tell its connection apart.
pub(super) const APPLICATION_NAME: &str = "hookrelay-listen";

/// `schema`'s notification channel: short and fixed, whatever the schema's name (a
/// channel name is an identifier of at most 63 bytes). Computed once, at open.
pub(super) fn channel_of(schema: &str) -> String {
    format!("hookrelay_{:016x}", super::lead::lock_key(schema, "wake") as u64)
}

impl PgState {
    /// A subscription to the fleet's wake-ups; the listener starts with the first.
    pub(super) fn subscribe(&self) -> broadcast::Receiver<Wake> {
        let sender = self.wakeups.get_or_init(|| {
            let (sender, _) = broadcast::channel(BUFFER);
            let mut config = self.config.clone();
            config.application_name(APPLICATION_NAME);
            self.tasks.spawn(listen(
                config,
                self.tls.clone(),
                self.channel.clone(),
                self.instance.clone(),
                sender.clone(),
                self.health.clone(),
            ));
            sender
        });
        sender.subscribe()
    }

    /// Tells the fleet's dispatcher, in `tx` (an append's transaction of several
    /// statements), that this relay stores events, on [`PgState::inbox_channel`].
    pub(super) async fn notify_inbox<C: Cached + Sync>(&self, tx: &C) -> Result<(), StoreError> {
        if let Some(channel) = self.inbox_channel() {
            tx.cached_execute("SELECT pg_notify($1, $2)", &[&channel, &self.instance]).await?;
        }
        Ok(())
    }

    /// The channel on which an append tells the fleet's dispatcher that this relay
    /// stored events (its statement or [`PgState::notify_inbox`]); `None` when this
    /// relay leads dispatch (its committer wakes its own dispatcher) or is alone.
    pub(super) fn inbox_channel(&self) -> Option<&str> {
        let notifier = self.notifier();
        (!self.leads_dispatch() && !notifier.alone).then_some(notifier.channel)
    }

    /// What a transaction needs to notify the others.
    pub(super) fn notifier(&self) -> Notifier<'_> {
        Notifier {
            channel: &self.channel,
            instance: &self.instance,
            // Unknown (0) counts as not alone: better a notification nobody reads.
            alone: self.fleet_size.load(std::sync::atomic::Ordering::Relaxed) == 1,
        }
    }
}

/// Sends a transaction's wake-ups: `{instance} {destination}` on the channel.
pub(super) struct Notifier<'a> {
    channel: &'a str,
    instance: &'a str,
    /// The last heartbeat saw no other relay: nobody to wake (a relay that joins
    /// since is covered by its workers' poll until the next heartbeat, 2 s).
    alone: bool,
}

impl<'a> Notifier<'a> {
    /// The notifications of `changes`, to send in their transaction: one per
    /// destination that has a delivery becoming due now (new, replayed, or released
    /// from its queue). `None` when there is none, or nobody to tell.
    pub(super) fn due(&self, changes: &'a Changes) -> Option<DueNotice<'a>> {
        if self.alone {
            return None;
        }
        let dests = changes.made_due();
        (!dests.is_empty()).then_some(DueNotice {
            channel: self.channel,
            instance: self.instance,
            dests,
        })
    }
}

/// Sends [`DueNotice`]'s notifications: `$1` the channel, `$2` this relay's instance,
/// `$3` the destinations (a query of `apply`'s statement).
pub(super) const NOTIFY_DUE: &str =
    "SELECT pg_notify($1, $2 || ' ' || d) FROM unnest($3::text[]) AS d";

/// The destinations a transaction makes due, to notify with [`NOTIFY_DUE`].
pub(super) struct DueNotice<'a> {
    channel: &'a str,
    instance: &'a str,
    dests: Vec<&'a str>,
}

impl DueNotice<'_> {
    /// [`NOTIFY_DUE`]'s parameters.
    pub(super) fn params(&self) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        vec![&self.channel, &self.instance, &self.dests]
    }
}

/// The listener: connects, `LISTEN`s, forwards each notification, and reconnects
/// with a growing delay when the connection ends. Ends once nobody subscribes.
async fn listen(
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    channel: String,
    instance: String,
    sender: broadcast::Sender<Wake>,
    health: std::sync::Arc<crate::store::Health>,
) {
    let mut delay = RETRY_FIRST;
    loop {
        match listen_once(&config, &tls, &channel, &instance, &sender).await {
            Ok(()) => return,
            Err(e) => {
                let what = format!(
                    "the PostgreSQL notification connection failed; workers poll until it is \
                     back (next try in {delay:?})"
                );
                health.trouble(crate::store::Trouble::Unreachable, &what, &e);
            }
        }
        if sender.receiver_count() == 0 {
            return;
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RETRY_MAX);
    }
}

/// One connection's life. `Ok` when nobody subscribes any more; an error when the
/// connection failed or ended.
async fn listen_once(
    config: &tokio_postgres::Config,
    tls: &tokio_postgres_rustls::MakeRustlsConnect,
    channel: &str,
    instance: &str,
    sender: &broadcast::Sender<Wake>,
) -> Result<(), StoreError> {
    let (client, mut connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| super::explain::Target::of(config).explain(&e))?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // The connection must be polled for its messages: notifications arrive there.
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if tx.send(Some(n.payload().to_owned())).is_err() {
                        return;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    let _ = tx.send(None);
                    tracing::debug!(error = %e, "notification connection error");
                    return;
                }
                None => {
                    let _ = tx.send(None);
                    return;
                }
            }
        }
    });
    let result = async {
        client.batch_execute(&format!("LISTEN {}", super::schema::quote_ident(channel))).await?;
        tracing::debug!(channel, "listening for wake-ups from the fleet");
        // Anything made due while nobody listened: look at everything once.
        if sender.send(Wake::All).is_err() {
            return Ok(());
        }
        while let Some(message) = rx.recv().await {
            let Some(payload) = message else { break };
            let (from, wake) = match payload.split_once(' ') {
                Some((from, destination)) => (from, Wake::Due(destination.to_owned())),
                None => (payload.as_str(), Wake::Inbox),
            };
            // This relay's own: its workers and dispatcher were woken in-process.
            if from == instance {
                continue;
            }
            if sender.send(wake).is_err() {
                return Ok(());
            }
        }
        Err(StoreError::Backend {
            backend: "postgres",
            message: "the notification connection ended".into(),
        })
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::broadcast::Receiver;

    use super::APPLICATION_NAME;
    use crate::store::fixtures::{plan, received};
    use crate::store::{Coordination, DeliveryQueue, Dispatch, EventLog, Wake};

    /// The next wake-up that is not `All`, within 10 s.
    async fn next_due(rx: &mut Receiver<Wake>) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Ok(Wake::Due(d))) => return d,
                Ok(Ok(Wake::All | Wake::Inbox)) => {}
                other => panic!("no wake-up: {other:?}"),
            }
        }
    }

    /// Waits for `All`: the listener is (again) listening.
    async fn listening(rx: &mut Receiver<Wake>) {
        match tokio::time::timeout(Duration::from_secs(15), rx.recv()).await {
            Ok(Ok(Wake::All)) => {}
            other => panic!("the listener did not (re)connect: {other:?}"),
        }
    }

    /// A callback stored by a relay that does not lead dispatch wakes the one that
    /// does, at once; the leader's own send nothing (its committer wakes its
    /// dispatcher in-process).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn events_stored_by_a_relay_that_does_not_dispatch_wake_the_dispatcher() {
        let (a, b) = super::super::tests::two_relays("inbox").await;
        assert!(a.lead(crate::store::DISPATCH_LEAD).await.unwrap());
        let mut at_a = a.wakeups().expect("PostgreSQL sends wake-ups");
        listening(&mut at_a).await;
        let mut at_b = b.wakeups().expect("PostgreSQL sends wake-ups");
        listening(&mut at_b).await;

        b.append(received("demo", "ActionCreated", 1_000, "{}")).await.unwrap();
        match tokio::time::timeout(Duration::from_secs(10), at_a.recv()).await {
            Ok(Ok(Wake::Inbox)) => {}
            other => panic!("the dispatcher was not woken: {other:?}"),
        }
        a.append(received("demo", "ActionCreated", 2_000, "{}")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(at_b.try_recv().is_err(), "the leader sent a wake-up for its own events");
        assert!(at_a.try_recv().is_err(), "a relay heard its own wake-up");
    }

    /// Callbacks are counted per (source, event) across the relays sharing the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callbacks_are_counted_for_the_whole_fleet() {
        let (a, b) = super::super::tests::two_relays("received").await;
        for (store, n) in [(&a, 3), (&b, 2)] {
            for i in 0..n {
                store.append(received("demo", "ActionCreated", 1_000 + i, "{}")).await.unwrap();
            }
        }
        b.append(received("demo", "TaskCreated", 5_000, "{}")).await.unwrap();
        b.append(received("other", "TaskCreated", 6_000, "{}")).await.unwrap();
        for store in [&a, &b] {
            let counts = store.received_counts("demo").await.unwrap().expect("a fleet count");
            assert_eq!(counts.get("ActionCreated"), Some(&5));
            assert_eq!(counts.get("TaskCreated"), Some(&1));
            assert_eq!(counts.len(), 2, "{counts:?}");
        }
    }

    /// What one relay makes due wakes another, through PostgreSQL alone (no poll:
    /// nothing else sends wake-ups), also after the listener's connection was cut.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deliveries_made_due_by_one_relay_wake_another() {
        let (a, b) = super::super::tests::two_relays("listen").await;
        let mut rx = b.wakeups().expect("PostgreSQL sends wake-ups");
        listening(&mut rx).await;
        let mut own = a.wakeups().expect("PostgreSQL sends wake-ups");
        listening(&mut own).await;

        let id = a.append(received("demo", "ActionCreated", 1_000, "{}")).await.unwrap();
        a.dispatch(vec![plan(id, 1, &["crm"])], 2_000).await.unwrap();
        assert_eq!(next_due(&mut rx).await, "crm");
        // The relay that made them due is not told: its workers were woken in-process.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(own.try_recv().is_err(), "a relay heard its own wake-up");

        // The listener's connection is cut: it reconnects by itself and says `All`.
        let killed: i64 = a
            .client()
            .await
            .unwrap()
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = $1 AND datname = current_database()",
                &[&APPLICATION_NAME],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(killed, 2, "one listener per subscribed relay");
        listening(&mut rx).await;
        listening(&mut own).await;
        // A replay to a destination without a delivery yet makes a new one due.
        assert_eq!(a.replay(id, vec!["erp".into()], 3_000).await.unwrap(), 1);
        assert_eq!(next_due(&mut rx).await, "erp");

        // Closed, a relay leaves no task behind: its listener's connection ends with
        // the close (though its subscriber still lives), and its renewal stops.
        crate::store::Upkeep::close(&b).await.unwrap();
        assert_eq!(b.inner.tasks.running(), 0, "a task of the closed store runs on");
        let listeners = || async {
            let count: i64 = a
                .client()
                .await
                .unwrap()
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = $1 AND datname = current_database()",
                    &[&APPLICATION_NAME],
                )
                .await
                .unwrap()
                .get(0);
            count
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while listeners().await != 1 {
            assert!(tokio::time::Instant::now() < deadline, "the closed relay still listens");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(rx);
    }
}
