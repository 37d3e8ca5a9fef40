//! The audit ledger on sled: counters in `outcomes` (which every rule's transaction
//! spans already, so keeping them costs no tree of its own), under keys that start
//! with [`LEDGER`] and sort by hour.
//!
//! - A rule's edits are written in its transaction (`apply.rs`).
//! - The appends' (`received`, `rejected`) are kept in memory ([`Unsaved`]) and written
//!   every [`SAVE_EVERY_EVENTS`] events or [`SAVE_EVERY`], and at close, with the
//!   [`APPENDED_KEY`] mark of the last id they count: an extra sled batch per commit
//!   group cost the ack path ~8 µs of CPU per callback (BENCHMARKS.md, audit). What a
//!   crash loses of them is the records above the mark, which the next open counts
//!   ([`SledState::recount_appended`]); a reading adds the unsaved counts.
//! - `waiting` is the inbox, tallied in memory per hour, source and event (`waiting`),
//!   rebuilt from the records at open.
//! - A reading holds `last_id` and the lifecycle lock, so no append or rule lands
//!   between its counters and its tally.

use std::collections::BTreeMap;

use super::codec::{awaits_outcome, decode_meta, outcome_key};
use super::{SledState, META, OUTCOMES, RECORDS};
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::ledger::{self, Count, LedgerEdits, LedgerKey};
use crate::store::{EventId, LedgerReading, StoreError};

/// First byte of a ledger key in `outcomes` (event outcomes start with 0x00 or 0x01,
/// the cursor with `d`).
const LEDGER: u8 = 2;
/// The last event id whose append is counted (in `outcomes`, never 8 bytes long).
pub(super) const APPENDED_KEY: &[u8] = b"\x03ledger_appended";
/// The first event id the ledger counts (in `meta`).
pub(super) const START_KEY: &[u8] = b"ledger_start";

/// The in-memory tally of the inbox: (hour, source, event) -> events waiting.
pub(super) type Waiting = BTreeMap<(u64, String, String), i64>;

/// Appends' counts not written yet; changed only under `last_id`.
#[derive(Default)]
pub(super) struct Unsaved {
    edits: LedgerEdits,
    /// The last id they count.
    last: u64,
    events: usize,
    since: Option<std::time::Instant>,
}

/// Unsaved appends' counts are written once they count this many events...
const SAVE_EVERY_EVENTS: usize = 2048;
/// ...or are this old.
const SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

fn part(out: &mut Vec<u8>, text: &str) {
    let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&text.as_bytes()[..usize::from(len)]);
}

/// `[2][hour: 8][count][source][event][destination]`, each text with its u16 length.
pub(super) fn encode_key(key: &LedgerKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + key.source.len() + key.event.len());
    out.push(LEDGER);
    out.extend_from_slice(&key.hour.to_be_bytes());
    for text in [key.count.as_str(), &key.source, &key.event, &key.destination] {
        part(&mut out, text);
    }
    out
}

fn decode_key(bytes: &[u8]) -> Option<LedgerKey> {
    let (&first, rest) = bytes.split_first()?;
    if first != LEDGER || rest.len() < 8 {
        return None;
    }
    let hour = u64::from_be_bytes(rest[..8].try_into().ok()?);
    let mut rest = &rest[8..];
    let mut texts = Vec::with_capacity(4);
    for _ in 0..4 {
        let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        let text = std::str::from_utf8(rest.get(2..2 + len)?).ok()?;
        texts.push(text.to_owned());
        rest = &rest[2 + len..];
    }
    let count = Count::parse(&texts[0])?;
    let destination = texts.pop()?;
    let event = texts.pop()?;
    let source = texts.pop()?;
    Some(LedgerKey { hour, source, event, destination, count })
}

fn decode_count(key: &[u8], value: &[u8]) -> Result<i64, StoreError> {
    <[u8; 8]>::try_from(value).map(i64::from_be_bytes).map_err(|_| StoreError::Corrupt {
        table: OUTCOMES,
        key: hex(key),
        reason: "a ledger counter is not 8 bytes".into(),
    })
}

impl SledState {
    /// The counters `edits` change, with their new values, read from `outcomes` as it
    /// is now: what a batch or transaction then writes.
    fn new_values(&self, edits: &LedgerEdits) -> Result<Vec<(Vec<u8>, i64)>, StoreError> {
        let mut out = Vec::with_capacity(edits.len());
        for (key, n) in edits {
            let k = encode_key(key);
            let old = match self.outcomes.get(&k)? {
                Some(v) => decode_count(&k, &v)?,
                None => 0,
            };
            out.push((k, old + n));
        }
        Ok(out)
    }

    /// Adds a group's counts (`events` events, up to id `last`) to the unsaved ones,
    /// and writes them when they are many or old enough. The caller holds `last_id`.
    pub(super) fn add_appended(
        &self,
        edits: &LedgerEdits,
        events: usize,
        last: u64,
    ) -> Result<(), StoreError> {
        let mut unsaved = lock(&self.unsaved);
        for (key, n) in edits {
            *unsaved.edits.entry(key.clone()).or_insert(0) += n;
        }
        unsaved.last = last;
        unsaved.events += events;
        let since = *unsaved.since.get_or_insert_with(std::time::Instant::now);
        if unsaved.events >= SAVE_EVERY_EVENTS || since.elapsed() >= SAVE_EVERY {
            self.count_appended(&unsaved.edits, unsaved.last)?;
            *unsaved = Unsaved::default();
        }
        Ok(())
    }

    /// Writes the unsaved appends' counts (at close). Takes `last_id`.
    pub(super) fn save_appended(&self) -> Result<(), StoreError> {
        let _appends = lock(&self.last_id);
        let mut unsaved = lock(&self.unsaved);
        if unsaved.events > 0 {
            self.count_appended(&unsaved.edits, unsaved.last)?;
            *unsaved = Unsaved::default();
        }
        Ok(())
    }

    /// Adds counters and moves the mark to `last`, in one batch. The caller holds
    /// `last_id` (so it is the only writer of these counters).
    fn count_appended(&self, edits: &LedgerEdits, last: u64) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        for (k, v) in self.new_values(edits)? {
            batch.insert(k, &v.to_be_bytes());
        }
        batch.insert(APPENDED_KEY, &last.to_be_bytes());
        self.outcomes.apply_batch(batch)?;
        Ok(())
    }

    /// Writes `edits` inside a rule's transaction on `outcomes` (read and written
    /// there: the transaction makes the read-modify-write atomic).
    pub(super) fn write_edits(
        outcomes: &sled::transaction::TransactionalTree,
        edits: &LedgerEdits,
    ) -> Result<(), sled::transaction::ConflictableTransactionError<StoreError>> {
        use sled::transaction::ConflictableTransactionError as Txe;
        for (key, n) in edits {
            let k = encode_key(key);
            let old = match outcomes.get(&k)? {
                Some(v) => decode_count(&k, &v).map_err(Txe::Abort)?,
                None => 0,
            };
            outcomes.insert(k, &(old + n).to_be_bytes())?;
        }
        Ok(())
    }

    /// Moves the inbox tally by what `changes` take out of it (after they are
    /// written; the caller holds the lifecycle lock).
    pub(super) fn untally(&self, changes: &crate::store::lifecycle::Changes) {
        let start = self.ledger_start();
        let mut waiting = lock(&self.waiting);
        for (id, meta) in changes.dispatched.range(start..) {
            let key = (ledger::hour_of(*id), meta.source.clone(), meta.event.clone());
            if let Some(n) = waiting.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    waiting.remove(&key);
                }
            }
        }
    }

    /// At open, before any write: the ledger's start (set to the next event when the
    /// store held events before it had a ledger), the appends a crash left uncounted,
    /// and the inbox tally. Returns the start.
    pub(super) fn open_ledger(meta: &sled::Tree, last_id: u64) -> Result<EventId, StoreError> {
        match meta.get(START_KEY)? {
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(|b| EventId::new(u64::from_be_bytes(b)))
                .map_err(|_| StoreError::Corrupt {
                    table: META,
                    key: hex(START_KEY),
                    reason: "the ledger's start is not 8 bytes".into(),
                }),
            None => {
                let start = last_id.saturating_add(1);
                meta.insert(START_KEY, &start.to_be_bytes())?;
                Ok(EventId::new(start))
            }
        }
    }

    /// Counts the records above the append mark (a crash came between an append's
    /// batch and its counters), and tallies the inbox from `cursor` on.
    pub(super) fn recount_appended(&self, cursor: u64) -> Result<(), StoreError> {
        let start = self.ledger_start();
        let mark = match self.outcomes.get(APPENDED_KEY)? {
            Some(v) => {
                u64::from_be_bytes(v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                    table: OUTCOMES,
                    key: hex(APPENDED_KEY),
                    reason: "the ledger's append mark is not 8 bytes".into(),
                })?)
            }
            None => start.raw().saturating_sub(1),
        };
        let corrupt =
            |key: &[u8], reason| StoreError::Corrupt { table: RECORDS, key: hex(key), reason };
        let mut edits = LedgerEdits::new();
        let mut last = mark;
        for item in self.records.range(EventId::new(mark.saturating_add(1)).to_key()..) {
            let (key, value) = item?;
            let Some(id) = EventId::from_key(&key) else { break };
            let meta = decode_meta(&value).map_err(|r| corrupt(&key, r))?;
            ledger::appended(&mut edits, id, &meta, start);
            last = id.raw();
        }
        if last != mark {
            self.count_appended(&edits, last)?;
        }
        let mut waiting = Waiting::new();
        let from = EventId::new(cursor.saturating_add(1)).max(start);
        for item in self.records.range(from.to_key()..) {
            let (key, value) = item?;
            let Some(id) = EventId::from_key(&key) else { break };
            if !awaits_outcome(&value)
                || self
                    .outcomes
                    .contains_key(outcome_key(&key, &value).map_err(|r| corrupt(&key, r))?)?
            {
                continue;
            }
            let meta = decode_meta(&value).map_err(|r| corrupt(&key, r))?;
            *waiting.entry((ledger::hour_of(id), meta.source, meta.event)).or_insert(0) += 1;
        }
        *lock(&self.waiting) = waiting;
        Ok(())
    }

    /// See [`crate::store::Audit::ledger`].
    pub(super) fn ledger(&self, from_hour: u64, to_hour: u64) -> Result<LedgerReading, StoreError> {
        let _appends = lock(&self.last_id);
        let _rules = lock(&self.lifecycle);
        let mut counts = LedgerEdits::new();
        let bound = |hour: u64| {
            let mut k = vec![LEDGER];
            k.extend_from_slice(&hour.to_be_bytes());
            k
        };
        for item in self.outcomes.range(bound(from_hour)..bound(to_hour)) {
            let (k, v) = item?;
            let key = decode_key(&k).ok_or_else(|| StoreError::Corrupt {
                table: OUTCOMES,
                key: hex(&k),
                reason: "unreadable ledger key".into(),
            })?;
            let n = decode_count(&k, &v)?;
            if n != 0 {
                counts.insert(key, n);
            }
        }
        for (key, n) in &lock(&self.unsaved).edits {
            if (from_hour..to_hour).contains(&key.hour) {
                *counts.entry(key.clone()).or_insert(0) += n;
            }
        }
        counts.retain(|_, n| *n != 0);
        let waiting = lock(&self.waiting);
        for ((hour, source, event), n) in waiting.range((from_hour, String::new(), String::new())..)
        {
            if *hour >= to_hour {
                break;
            }
            if *n != 0 {
                counts.insert(LedgerKey::event(*hour, source, event, Count::Waiting), *n);
            }
        }
        Ok(LedgerReading { counts, start: self.ledger_start() })
    }

    /// See [`crate::store::Audit::add_triggered`].
    pub(super) fn add_triggered(
        &self,
        hour: u64,
        source: &str,
        event: &str,
        n: u64,
    ) -> Result<(), StoreError> {
        let _rules = lock(&self.lifecycle);
        let key = LedgerKey::event(hour, source, event, Count::Triggered);
        let edits = LedgerEdits::from([(key, i64::try_from(n).unwrap_or(i64::MAX))]);
        self.outcomes.transaction(|tx| Self::write_edits(tx, &edits)).map_err(|e| match e {
            sled::transaction::TransactionError::Abort(e) => e,
            sled::transaction::TransactionError::Storage(e) => e.into(),
        })?;
        self.durable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Audit, EventLog, Upkeep};

    /// A crash between an append's records and its counters leaves records above the
    /// mark: the next open counts them (and tallies them as waiting), once.
    #[tokio::test]
    async fn records_a_crash_left_uncounted_are_counted_at_open() {
        use crate::store::conformance::received;
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::testutil::open(dir.path());
        store.append(received("demo", "A", 10_000_000, "{}")).await.unwrap();
        // The second append's records reached the tree; its counters did not.
        let meta = received("demo", "A", 20_000_000, "{}").meta;
        let record = super::super::codec::encode_record(&meta, Some(b"{}")).unwrap();
        store.inner.records.insert(EventId::new(20_000_000).to_key(), record).unwrap();
        let key = LedgerKey::event(0, "demo", "A", Count::Received);
        let waiting = LedgerKey::event(0, "demo", "A", Count::Waiting);
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
    fn a_key_reads_back_and_sorts_by_hour() {
        let a = LedgerKey::event(7, "demo", "matters.updated", Count::Received);
        let b = LedgerKey::delivery(8, "crm", Count::Routed);
        assert_eq!(decode_key(&encode_key(&a)), Some(a.clone()));
        assert_eq!(decode_key(&encode_key(&b)), Some(b.clone()));
        assert!(encode_key(&a) < encode_key(&b));
        assert_eq!(decode_key(b"\x02short"), None);
    }
}
