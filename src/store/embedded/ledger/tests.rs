//! The embedded ledger: rows written in a rule's transaction, the appends' counts saved
//! by the mark, and what a crash loses of them counted again at open.

use super::row::row_of;
use super::*;
use crate::store::DeliveryState;
use crate::store::{Audit, EventLog, Upkeep};

/// A crash between an append's records and its counters leaves records above the
/// mark: the next open counts them (and tallies them as waiting), once.
#[tokio::test]
async fn records_a_crash_left_uncounted_are_counted_at_open() {
    use crate::store::fixtures::received;
    let dir = tempfile::tempdir().unwrap();
    let store = super::super::testutil::open(dir.path());
    store.append(received("demo", "ActionCreated", 10_000_000, "{}")).await.unwrap();
    // The second append's records reached the tree; its counters did not.
    let meta = received("demo", "ActionCreated", 20_000_000, "{}").meta;
    let record = super::super::codec::encode_record(&meta, Some(b"{}")).unwrap();
    store.inner.records.insert(EventId::new(20_000_000).to_key(), record).unwrap();
    let key = LedgerKey::event(0, "demo", "ActionCreated", Count::Received);
    let waiting = LedgerKey::event(0, "demo", "ActionCreated", Count::Waiting);
    let before = store.ledger(0, 1).await.unwrap();
    assert_eq!(before.counts.get(&key), Some(&1));
    store.close().await.unwrap();
    drop(store);
    for _ in 0..2 {
        let store = super::super::testutil::open(dir.path());
        let after = store.ledger(0, 1).await.unwrap();
        assert_eq!(after.counts.get(&key), Some(&2), "{:?}", after.counts);
        assert_eq!(after.counts.get(&waiting), Some(&2));
        store.close().await.unwrap();
    }
}

#[test]
fn a_row_reads_back_and_sorts_by_hour() {
    let a = LedgerKey::event(7, "demo", "ActionUpdated", Count::Received);
    let b = LedgerKey::delivery(8, "crm", Count::State(DeliveryState::Dead));
    let (ka, sa) = row_of(&a).unwrap();
    let (kb, sb) = row_of(&b).unwrap();
    assert_eq!(
        decode_row(&ka),
        Some((7, 0, ["demo".into(), "ActionUpdated".into(), String::new()]))
    );
    assert_eq!(decode_row(&kb), Some((8, 2, [String::new(), String::new(), "crm".into()])));
    assert_eq!((sa, sb), (0, 4));
    assert!(ka < kb);
    // The rules' counts of an event are another row than its appends'.
    let routed = LedgerKey::event(7, "demo", "ActionUpdated", Count::Routed);
    assert_ne!(row_of(&routed).unwrap().0, ka);
    assert_eq!(row_of(&LedgerKey::event(7, "d", "e", Count::Waiting)), None, "not stored");
    assert_eq!(decode_row(b"\x02short"), None);
}
