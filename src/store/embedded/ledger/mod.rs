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
use crate::store::{EventId, EventMeta, LedgerReading, StoreError};
use row::{added, by_row, decode_row, decode_values, RowWrite, LEDGER, ROWS};

mod row;

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
mod tests;
