//! The audit ledger in the embedded store: counters in `outcomes` (which every rule's transaction
//! spans already, so keeping them costs no tree of its own), under keys that start
//! with [`LEDGER`] and sort by hour.
//!
//! - A rule's edits are written in its transaction (`apply.rs`).
//! - The appends' (`received`, `rejected`) are kept in memory ([`Unsaved`]) and written
//!   every [`SAVE_EVERY_EVENTS`] events or [`SAVE_EVERY`], and at close, with the
//!   [`APPENDED_KEY`] mark of the last id they count: an extra sled batch per commit
//!   group cost the ack path ~8 µs of CPU per callback (BENCHMARKS.md, audit). What a
//!   crash loses of them is the records above the mark, which the next open counts
//!   ([`EmbeddedState::recount_appended`]); a reading adds the unsaved counts.
//! - `waiting` is the inbox, tallied in memory per hour, source and event (`waiting`),
//!   rebuilt at open by the same scan that counts the inbox (`EmbeddedState::rebuild`).
//! - A reading holds `last_id` and the lifecycle lock, so no append or rule lands
//!   between its counters and its tally.

use std::collections::BTreeMap;

use super::codec::decode_meta;
use super::engine::{Batch, Tree, TxError, TxResult, TxTree};
use super::{EmbeddedState, META, OUTCOMES, RECORDS};
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::ledger::{self, Count, LedgerEdits, LedgerKey};
use crate::store::{DeliveryState, EventId, EventMeta, LedgerReading, StoreError};

/// First byte of a ledger key in `outcomes` (event outcomes start with 0x00 or 0x01,
/// the cursor with `d`).
const LEDGER: u8 = 2;
/// The last event id whose append is counted (in `outcomes`, never 8 bytes long).
pub(super) const APPENDED_KEY: &[u8] = b"\x03ledger_appended";
/// The first event id the ledger counts (in `meta`).
pub(super) const START_KEY: &[u8] = b"ledger_start";

/// The in-memory tally of the inbox: (hour, source, event) -> events waiting.
pub(super) type Waiting = BTreeMap<(u64, String, String), i64>;

/// Where an event waiting in the inbox is tallied: its event name's bucket, as every
/// counter keys it ([`LedgerKey::event`]).
pub(super) fn waiting_key(id: EventId, meta: &EventMeta) -> (u64, String, String) {
    let bucket = crate::event_names::metric_label(&meta.event);
    (ledger::hour_of(id), meta.source.clone(), bucket.to_owned())
}

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

/// The counters of one row, in the order of its value's slots. A row is one sled key,
/// so a change writes one key per source-and-event or destination it touches, not one
/// per count. Appends have a row of their own: they are written outside the rules'
/// transactions (under `last_id`), and two writers must never share a key.
const APPEND_ROW: &[Count] = &[Count::Received, Count::Rejected];
const EVENT_ROW: &[Count] = &[Count::Unrouted, Count::Duplicate, Count::Routed, Count::Triggered];
const DESTINATION_ROW: &[Count] = &[
    Count::Routed,
    Count::State(DeliveryState::Delivered),
    Count::State(DeliveryState::Filtered),
    Count::State(DeliveryState::Superseded),
    Count::State(DeliveryState::Dead),
    Count::State(DeliveryState::Discarded),
    Count::State(DeliveryState::Pending),
    Count::State(DeliveryState::Retrying),
    Count::State(DeliveryState::Held),
];

/// The rows, by the byte after the hour in their key.
const ROWS: [&[Count]; 3] = [APPEND_ROW, EVENT_ROW, DESTINATION_ROW];

/// The row of a counter (its key) and its slot in the row's value.
fn row_of(key: &LedgerKey) -> Option<(Vec<u8>, usize)> {
    let kind: u8 = match key.count {
        _ if !key.destination.is_empty() => 2,
        Count::Received | Count::Rejected => 0,
        _ => 1,
    };
    let slot = ROWS[usize::from(kind)].iter().position(|c| *c == key.count)?;
    let mut out =
        Vec::with_capacity(16 + key.source.len() + key.event.len() + key.destination.len());
    out.push(LEDGER);
    out.extend_from_slice(&key.hour.to_be_bytes());
    out.push(kind);
    for text in [&key.source, &key.event, &key.destination] {
        part(&mut out, text);
    }
    Some((out, slot))
}

/// A row's key read back: its hour, kind, source, event and destination.
fn decode_row(bytes: &[u8]) -> Option<(u64, u8, [String; 3])> {
    let (&first, rest) = bytes.split_first()?;
    if first != LEDGER || rest.len() < 9 {
        return None;
    }
    let hour = u64::from_be_bytes(rest[..8].try_into().ok()?);
    let kind = rest[8];
    if usize::from(kind) >= ROWS.len() {
        return None;
    }
    let mut rest = &rest[9..];
    let mut texts: [String; 3] = Default::default();
    for text in &mut texts {
        let len = usize::from(u16::from_be_bytes(rest.get(..2)?.try_into().ok()?));
        *text = std::str::from_utf8(rest.get(2..2 + len)?).ok()?.to_owned();
        rest = &rest[2 + len..];
    }
    Some((hour, kind, texts))
}

/// A row's value: one big-endian i64 per slot (a shorter value reads as zeros beyond).
fn decode_values(key: &[u8], value: &[u8], width: usize) -> Result<Vec<i64>, StoreError> {
    if !value.len().is_multiple_of(8) || value.len() / 8 > width {
        return Err(StoreError::Corrupt {
            table: OUTCOMES,
            key: hex(key),
            reason: "a ledger row is not a whole number of counters".into(),
        });
    }
    let mut out: Vec<i64> =
        value.chunks_exact(8).map(|c| i64::from_be_bytes(c.try_into().unwrap_or([0; 8]))).collect();
    out.resize(width, 0);
    Ok(out)
}

fn encode_values(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_be_bytes()).collect()
}

/// A row's new value: `old` (absent: zeros) with `deltas` added.
fn added(
    row: &[u8],
    old: Option<&[u8]>,
    width: usize,
    deltas: &Deltas,
) -> Result<Vec<u8>, StoreError> {
    let mut values = match old {
        Some(v) => decode_values(row, v, width)?,
        None => vec![0; width],
    };
    for (slot, n) in deltas {
        values[*slot] += n;
    }
    Ok(encode_values(&values))
}

/// What to add to which slot of a row.
type Deltas = Vec<(usize, i64)>;
/// A row's edit: its key, its width, and its deltas.
type RowEdit = (Vec<u8>, usize, Deltas);
/// A row's key and its new value.
type RowWrite = (Vec<u8>, Vec<u8>);

/// `edits` grouped by row.
fn by_row(edits: &LedgerEdits) -> Result<Vec<RowEdit>, StoreError> {
    let mut rows: BTreeMap<Vec<u8>, (usize, Deltas)> = BTreeMap::new();
    for (key, n) in edits {
        let Some((row, slot)) = row_of(key) else {
            return Err(StoreError::Corrupt {
                table: OUTCOMES,
                key: key.count.as_str().to_owned(),
                reason: "a count the ledger does not keep".into(),
            });
        };
        let width = ROWS[usize::from(row[9])].len();
        rows.entry(row).or_insert_with(|| (width, Vec::new())).1.push((slot, *n));
    }
    Ok(rows.into_iter().map(|(k, (w, d))| (k, w, d)).collect())
}

impl EmbeddedState {
    /// The rows `edits` change, with their new values, read from `outcomes` as it is
    /// now: what a batch then writes.
    fn new_values(&self, edits: &LedgerEdits) -> Result<Vec<RowWrite>, StoreError> {
        let mut out = Vec::new();
        for (row, width, deltas) in by_row(edits)? {
            let value = added(&row, self.outcomes.get(&row)?.as_deref(), width, &deltas)?;
            out.push((row, value));
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
        ledger::merge(&mut unsaved.edits, edits);
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
        let mut batch = Batch::default();
        for (k, v) in self.new_values(edits)? {
            batch.insert(k, v);
        }
        batch.insert(APPENDED_KEY, last.to_be_bytes());
        self.outcomes.apply_batch(batch)?;
        Ok(())
    }

    /// Writes `edits` inside a rule's transaction on `outcomes` (read and written
    /// there: the transaction makes the read-modify-write atomic).
    pub(super) fn write_edits(outcomes: &TxTree<'_>, edits: &LedgerEdits) -> TxResult<()> {
        for (row, width, deltas) in by_row(edits).map_err(TxError::Abort)? {
            let old = outcomes.get(&row)?;
            let value = added(&row, old.as_deref(), width, &deltas).map_err(TxError::Abort)?;
            outcomes.insert(row, value)?;
        }
        Ok(())
    }

    /// Moves the inbox tally by the events of `left` (dispatched by `changes`, counted
    /// now) leaving it (after they are written; the caller holds the lifecycle lock).
    pub(super) fn untally(&self, changes: &crate::store::lifecycle::Changes, left: &[EventId]) {
        let start = self.ledger_start();
        let mut waiting = lock(&self.waiting);
        for id in left.iter().filter(|id| **id >= start) {
            let Some(meta) = changes.dispatched.get(id) else { continue };
            let key = waiting_key(*id, meta);
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
    pub(super) fn open_ledger(meta: &Tree, last_id: u64) -> Result<EventId, StoreError> {
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
                meta.insert(START_KEY, start.to_be_bytes())?;
                Ok(EventId::new(start))
            }
        }
    }

    /// The last event id whose append the saved counts include, if any: saved before
    /// retention deletes any record, so it is at or above every id handed out before
    /// (the newest records may be gone).
    pub(super) fn appended_mark(&self) -> Result<Option<u64>, StoreError> {
        self.outcomes
            .get(APPENDED_KEY)?
            .map(|v| {
                <[u8; 8]>::try_from(v.as_ref()).map(u64::from_be_bytes).map_err(|_| {
                    StoreError::Corrupt {
                        table: OUTCOMES,
                        key: hex(APPENDED_KEY),
                        reason: "the ledger's append mark is not 8 bytes".into(),
                    }
                })
            })
            .transpose()
    }

    /// Counts the records above the append mark (a crash came between their append
    /// and the save of its counts).
    pub(super) fn recount_appended(&self) -> Result<(), StoreError> {
        let start = self.ledger_start();
        let mark = self.appended_mark()?.unwrap_or_else(|| start.raw().saturating_sub(1));
        let mut edits = LedgerEdits::new();
        let mut last = mark;
        for item in self.records.range(EventId::new(mark.saturating_add(1)).to_key()..) {
            let (key, value) = item?;
            let Some(id) = EventId::from_key(&key) else { break };
            let meta = decode_meta(&value).map_err(|reason| StoreError::Corrupt {
                table: RECORDS,
                key: hex(&key),
                reason,
            })?;
            ledger::appended(&mut edits, id, &meta, start);
            last = id.raw();
        }
        if last != mark {
            self.count_appended(&edits, last)?;
        }
        Ok(())
    }

    /// See [`crate::store::Audit::ledger`].
    pub(super) fn ledger(&self, from_hour: u64, to_hour: u64) -> Result<LedgerReading, StoreError> {
        // The `waiting` tally only once the inbox is counted behind the open (before the
        // locks below: the count takes the lifecycle lock).
        self.counts.wait_for_inbox()?;
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
            let (hour, kind, [source, event, destination]) =
                decode_row(&k).ok_or_else(|| StoreError::Corrupt {
                    table: OUTCOMES,
                    key: hex(&k),
                    reason: "unreadable ledger row".into(),
                })?;
            let row = ROWS[usize::from(kind)];
            for (count, n) in row.iter().zip(decode_values(&k, &v, row.len())?) {
                if n != 0 {
                    let key = LedgerKey {
                        hour,
                        source: source.clone(),
                        event: event.clone(),
                        destination: destination.clone(),
                        count: *count,
                    };
                    counts.insert(key, n);
                }
            }
        }
        ledger::merge(&mut counts, &ledger::hours(&lock(&self.unsaved).edits, from_hour, to_hour));
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

    /// See [`crate::store::Audit::prune_ledger`]. The unsaved appends' counts are saved
    /// first (they may count hours being pruned), then the rows go under both locks, so
    /// no rule's read-modify-write of a row straddles its deletion.
    pub(super) fn prune_ledger(&self, before_hour: u64, limit: usize) -> Result<usize, StoreError> {
        self.save_appended()?;
        let _appends = lock(&self.last_id);
        let _rules = lock(&self.lifecycle);
        let mut end = vec![LEDGER];
        end.extend_from_slice(&before_hour.to_be_bytes());
        let rows = self
            .outcomes
            .range(vec![LEDGER]..end)
            .take(limit)
            .map(|item| item.map(|(k, _)| k))
            .collect::<Result<Vec<_>, _>>()?;
        if rows.is_empty() {
            return Ok(0);
        }
        self.db.transaction(&[&self.outcomes], |tx| {
            for row in &rows {
                tx[0].remove(row)?;
            }
            Ok(())
        })?;
        self.durable()?;
        Ok(rows.len())
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
        let edits = ledger::triggered(hour, source, event, n);
        self.db.transaction(&[&self.outcomes], |tx| Self::write_edits(&tx[0], &edits))?;
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
}
