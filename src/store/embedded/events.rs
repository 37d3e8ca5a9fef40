//! The event log in the embedded store: ingest into `records`, reads with dispatch's outcome laid
//! over the stored meta.

use std::sync::atomic::Ordering;

use super::apply::Alongside;
use super::codec::{encode_record, split_record};
use super::engine::Batch;
use super::ride::{Rider, Riders};
use super::{EmbeddedState, RECORDS};
use crate::lock::lock;
use crate::store::hex;
use crate::store::lifecycle::ledger::{self, LedgerEdits};
use crate::store::lifecycle::Staged;
use crate::store::{EventFilter, EventId, EventRecord, EventStatus, NewEvent, StoreError, Written};

/// A group of events as the committer hands it over, with ids assigned and records
/// encoded, not written yet.
pub(super) struct Group<'a> {
    pub(super) events: &'a [NewEvent],
    pub(super) ids: Vec<EventId>,
    /// Each event's `records` key and value, in id order.
    pub(super) records: Vec<(Vec<u8>, Vec<u8>)>,
    /// The last id handed out once the group has its ids (its last event's).
    pub(super) last: u64,
}

impl<'a> Group<'a> {
    /// Assigns the ids after `last` (moving it to the group's last) and encodes the
    /// records, each event once with its body.
    fn new(events: &'a [NewEvent], last: &mut u64) -> Result<Self, StoreError> {
        let mut group = Group {
            events,
            ids: Vec::with_capacity(events.len()),
            records: Vec::with_capacity(events.len()),
            last: *last,
        };
        for ev in events {
            let id = EventId::allocate(*last, ev.meta.received_at_us);
            *last = id.raw();
            group.ids.push(id);
            // Only the ingress appends: anything but `received` is final already.
            let body = match ev.meta.status {
                EventStatus::Received => Some(ev.body.as_deref().unwrap_or_default()),
                _ => None,
            };
            group.records.push((id.to_key().to_vec(), encode_record(&ev.meta, body)?));
        }
        group.last = *last;
        Ok(group)
    }

    /// The group's events with their ids.
    pub(super) fn events(&self) -> impl Iterator<Item = (EventId, &'a NewEvent)> + '_ {
        self.ids.iter().copied().zip(self.events)
    }
}

impl EmbeddedState {
    /// Assigns ids and writes the group into `records` in one atomic batch, each event
    /// once with its body; a `quiet` group (`store::commit`) dispatched in the same
    /// transaction when it can be (`dispatch.rs`). Then waits for durability.
    ///
    /// The `riders` (attempts' records, `ride.rs`) are written in the same
    /// transaction, and answered once it is durable: with their outcomes, or with the
    /// write's error. The batch may be empty when they came alone.
    pub(super) fn append(
        &self,
        batch: &[NewEvent],
        quiet: bool,
        riders: Vec<Rider>,
    ) -> Result<Written, StoreError> {
        let mut riders = Riders::new(riders);
        let written = self.append_with(batch, quiet && !batch.is_empty(), &mut riders);
        riders.finish(&written);
        written
    }

    fn append_with(
        &self,
        batch: &[NewEvent],
        quiet: bool,
        riders: &mut Riders,
    ) -> Result<Written, StoreError> {
        // Held across the write: ids reach the tree in the order they were handed out,
        // so a visible id means every lower one is visible too (the dispatch cursor
        // relies on it).
        let mut last = lock(&self.last_id);
        let mut group = Group::new(batch, &mut last)?;
        if quiet {
            if let Some(written) = self.append_dispatched(&group, riders)? {
                return Ok(written);
            }
        }
        if riders.is_empty() {
            self.records.apply_batch(Batch::of(std::mem::take(&mut group.records)))?;
            self.published(&group)?;
        } else {
            self.store_with_riders(&group, riders)?;
        }
        drop(last);
        self.durable()?;
        Ok(Written::waiting(group.ids))
    }

    /// Writes `group` (possibly empty) and the `riders`' records in one transaction,
    /// left for the dispatcher. The caller holds `last_id`, and makes it durable.
    fn store_with_riders(&self, group: &Group<'_>, riders: &mut Riders) -> Result<(), StoreError> {
        let guard = lock(&self.lifecycle);
        let mut st = Staged::new(self);
        let staged = riders.stage(self, &mut st);
        let changes = st.into_changes();
        let alongside = Alongside { cursor: None, journal: None, appended: &group.records };
        let new_keys = self.transact(&changes, alongside, crate::clock::now_us())?.unwrap_or(0);
        if !group.ids.is_empty() {
            self.published(group)?;
        }
        self.applied(&changes, None, new_keys);
        riders.written(self, staged);
        drop(guard);
        Ok(())
    }

    /// After a group's records are written: the ledger's counts of the group, the
    /// inbox tally, and the committed watermark moved to the group's last id. The
    /// caller holds `last_id`: a ledger reading sees the group whole or not at all,
    /// and the watermark only moves forward.
    pub(super) fn published(&self, group: &Group<'_>) -> Result<(), StoreError> {
        let start = self.ledger_start();
        let mut edits = LedgerEdits::new();
        let mut received = 0;
        {
            let mut waiting = lock(&self.waiting);
            for (id, ev) in group.events() {
                ledger::appended(&mut edits, id, &ev.meta, start);
                if ev.meta.status == EventStatus::Received {
                    received += 1;
                    if id >= start {
                        *waiting.entry(super::ledger::waiting_key(id, &ev.meta)).or_insert(0) += 1;
                    }
                }
            }
        }
        self.add_appended(&edits, group.events.len(), group.last)?;
        // The whole group is written: the dispatch cursor may pass it now.
        self.committed.fetch_max(group.last, Ordering::AcqRel);
        self.inbox_count.fetch_add(received, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn event(&self, id: EventId) -> Result<Option<EventRecord>, StoreError> {
        let key = id.to_key();
        self.records.get(key)?.map(|v| self.decode(&key, &v)).transpose()
    }

    pub(super) fn body(&self, id: EventId) -> Result<Option<Vec<u8>>, StoreError> {
        let key = id.to_key();
        let Some(value) = self.records.get(key)? else { return Ok(None) };
        let record = split_record(&value).map_err(|reason| StoreError::Corrupt {
            table: RECORDS,
            key: hex(&key),
            reason,
        })?;
        Ok(record.body.map(<[u8]>::to_vec))
    }

    /// The newest `filter.limit` events that match `filter`, newest first.
    pub(super) fn list_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>, StoreError> {
        if let Some(resource) = &filter.resource {
            return self.list_by_resource(resource, filter);
        }
        let iter = match filter.after {
            Some(after) => self.records.range(..after.to_key()),
            None => self.records.iter(),
        };
        let mut out = Vec::new();
        for item in iter.rev() {
            if out.len() >= filter.limit {
                break;
            }
            let (key, value) = item?;
            // Newest first: once older than `since`, every later one is too.
            if filter.since.is_some_and(|s| EventId::from_key(&key).is_some_and(|id| id < s)) {
                break;
            }
            let record = self.decode(&key, &value)?;
            if filter.matches(&record.meta) {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// [`EmbeddedState::list_events`] about one resource: the events still in the inbox (a scan
    /// of the inbox, which dispatch keeps near empty), then the resource's prefix of
    /// `outcomes` for the dispatched ones (`keys::outcome`). In that order: an event
    /// dispatched between the two reads is seen twice (and listed once), never missed.
    fn list_by_resource(
        &self,
        resource: &str,
        filter: &EventFilter,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let mut found = std::collections::BTreeMap::new();
        let start = EventId::new(self.cursor.load(Ordering::Acquire).saturating_add(1));
        let inbox = match filter.after {
            Some(after) if after <= start => None,
            Some(after) => Some(self.records.range(start.to_key()..after.to_key())),
            None => Some(self.records.range(start.to_key()..)),
        };
        for item in inbox.into_iter().flatten() {
            let (key, value) = item?;
            // The resource is in the value's header: others are skipped unparsed (a
            // backlog after an outage is read, not decoded).
            let about = split_record(&value)
                .map_err(|reason| StoreError::Corrupt { table: RECORDS, key: hex(&key), reason })?
                .resource;
            if about != Some(resource) || !super::codec::awaits_outcome(&value) {
                continue;
            }
            let event = self.decode(&key, &value)?;
            if filter.in_window(event.id) && filter.matches(&event.meta) {
                found.insert(event.id, event);
            }
        }
        let prefix = super::keys::by_resource_prefix(resource);
        let mut indexed = 0;
        for item in self.outcomes.scan_prefix(&prefix).rev() {
            let (key, _) = item?;
            let Some(id) = EventId::from_key(&key[prefix.len()..]) else {
                return Err(StoreError::Corrupt {
                    table: super::OUTCOMES,
                    key: hex(&key),
                    reason: "no event id after the resource".into(),
                });
            };
            if !filter.in_window(id) || found.contains_key(&id) {
                continue;
            }
            // Pruned since (its outcome goes in the same transaction): skip.
            let Some(event) = self.event(id)? else { continue };
            if filter.matches(&event.meta) {
                found.insert(id, event);
                indexed += 1;
                if indexed >= filter.limit {
                    break;
                }
            }
        }
        Ok(found.into_values().rev().take(filter.limit).collect())
    }
}
