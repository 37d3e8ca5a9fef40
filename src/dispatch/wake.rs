//! The dispatcher's wake-ups from the other relays of a fleet: it stores no event of
//! theirs itself, so their commits reach it as notifications (`Wake::Inbox`).

use tokio::sync::broadcast::{self, error::RecvError};

use crate::store::Wake;

/// Returns when another relay of the fleet says it stored events, or when wake-ups may
/// have been missed; never without the fleet's wake-ups (the poll is left).
pub(super) async fn inbox_wakeup(wakeups: &mut Option<broadcast::Receiver<Wake>>) {
    let Some(rx) = wakeups else { return std::future::pending().await };
    loop {
        match rx.recv().await {
            Ok(Wake::Inbox | Wake::All) | Err(RecvError::Lagged(_)) => return,
            Ok(Wake::Due(_)) => {}
            Err(RecvError::Closed) => return std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::inbox_wakeup;
    use crate::store::Wake;

    /// The dispatcher wakes for another relay's stored events, for wake-ups that may
    /// have been missed, and for a subscriber that fell behind; not for a destination's
    /// due deliveries, and never without the fleet's wake-ups.
    #[tokio::test]
    async fn the_dispatcher_wakes_for_the_inbox_and_for_missed_wake_ups_only() {
        let soon = Duration::from_millis(50);
        let (tx, rx) = tokio::sync::broadcast::channel(2);
        let mut wakeups = Some(rx);
        tx.send(Wake::Due("crm".into())).unwrap();
        assert!(tokio::time::timeout(soon, inbox_wakeup(&mut wakeups)).await.is_err());
        for wake in [Wake::Inbox, Wake::All] {
            tx.send(Wake::Due("crm".into())).unwrap();
            tx.send(wake.clone()).unwrap();
            let woke = tokio::time::timeout(soon, inbox_wakeup(&mut wakeups)).await;
            assert!(woke.is_ok(), "not woken by {wake:?}");
        }
        for _ in 0..3 {
            tx.send(Wake::Due("crm".into())).unwrap(); // more than it holds: lagged
        }
        assert!(tokio::time::timeout(soon, inbox_wakeup(&mut wakeups)).await.is_ok());
        drop(tx);
        assert!(tokio::time::timeout(soon, inbox_wakeup(&mut wakeups)).await.is_err(), "closed");
        assert!(tokio::time::timeout(soon, inbox_wakeup(&mut None)).await.is_err(), "none");
    }
}
