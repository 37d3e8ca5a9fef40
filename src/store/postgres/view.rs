//! The rules' [`View`] over PostgreSQL: rows fetched and locked (`FOR UPDATE`) inside
//! the deciding transaction, found by running the rule until it asks for nothing it
//! does not have (see the module docs of `postgres`).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use tokio_postgres::types::ToSql;

use super::cached::pipelined;
use super::tx::Tx;
use super::{pg, sql_id};
use crate::lock::lock;
use crate::store::lifecycle::{DedupEntry, Queue, Staged, View};
use crate::store::{DeliveryRecord, EventId, EventMeta, StoreError};

/// Keys a pass asked for and did not find fetched.
#[derive(Default)]
struct Misses {
    dedup: HashSet<[u8; 16]>,
    deliveries: HashSet<(EventId, String)>,
    queues: HashSet<(String, [u8; 16])>,
    events: HashSet<EventId>,
    /// Events whose every delivery was asked for.
    all_deliveries: HashSet<EventId>,
}

impl Misses {
    fn is_empty(&self) -> bool {
        self.dedup.is_empty()
            && self.deliveries.is_empty()
            && self.queues.is_empty()
            && self.events.is_empty()
            && self.all_deliveries.is_empty()
    }
}

/// Rows fetched so far (`None`: looked for, absent), and what a pass missed.
#[derive(Default)]
pub(super) struct Prefetch {
    pub(super) dedup: HashMap<[u8; 16], Option<DedupEntry>>,
    pub(super) deliveries: HashMap<(EventId, String), Option<DeliveryRecord>>,
    pub(super) queues: HashMap<(String, [u8; 16]), Option<Queue>>,
    pub(super) events: HashMap<EventId, Option<EventMeta>>,
    /// Events whose every delivery is in `deliveries`.
    pub(super) complete: HashSet<EventId>,
    /// Until when each fetched delivery is claimed (absent: not claimed).
    pub(super) claimed_until: HashMap<(EventId, String), u64>,
    /// Events this transaction locked in the inbox: they have no delivery yet (only
    /// dispatch writes an event's first, in the transaction that takes it out of the
    /// inbox; a replay refuses an event still there), so a rule asking for one is told
    /// "absent" without a read (dispatch asks for each delivery it creates).
    pub(super) undispatched: HashSet<EventId>,
    misses: Mutex<Misses>,
}

impl View for Prefetch {
    fn dedup(&self, hash: &[u8; 16]) -> Result<Option<DedupEntry>, StoreError> {
        match self.dedup.get(hash) {
            Some(found) => Ok(*found),
            None => {
                lock(&self.misses).dedup.insert(*hash);
                Ok(None)
            }
        }
    }
    fn delivery(&self, event: EventId, dest: &str) -> Result<Option<DeliveryRecord>, StoreError> {
        if self.undispatched.contains(&event) {
            return Ok(None);
        }
        let key = (event, dest.to_owned());
        match self.deliveries.get(&key) {
            Some(found) => Ok(found.clone()),
            None => {
                lock(&self.misses).deliveries.insert(key);
                Ok(None)
            }
        }
    }
    fn queue(&self, dest: &str, resource: &[u8; 16]) -> Result<Option<Queue>, StoreError> {
        let key = (dest.to_owned(), *resource);
        match self.queues.get(&key) {
            Some(found) => Ok(*found),
            None => {
                lock(&self.misses).queues.insert(key);
                Ok(None)
            }
        }
    }
    fn claimed(&self, event: EventId, dest: &str, now_us: u64) -> Result<bool, StoreError> {
        if self.undispatched.contains(&event) {
            return Ok(false);
        }
        let key = (event, dest.to_owned());
        if !self.deliveries.contains_key(&key) {
            // Fetched (and locked) with the record: its claim cannot move meanwhile.
            lock(&self.misses).deliveries.insert(key);
            return Ok(false);
        }
        Ok(self.claimed_until.get(&key).is_some_and(|until| *until > now_us))
    }
    fn event(&self, id: EventId) -> Result<Option<EventMeta>, StoreError> {
        match self.events.get(&id) {
            Some(found) => Ok(found.clone()),
            None => {
                lock(&self.misses).events.insert(id);
                Ok(None)
            }
        }
    }
    fn deliveries_of(&self, event: EventId) -> Result<Vec<DeliveryRecord>, StoreError> {
        if self.undispatched.contains(&event) {
            return Ok(Vec::new());
        }
        if !self.complete.contains(&event) {
            lock(&self.misses).all_deliveries.insert(event);
            return Ok(Vec::new());
        }
        let mut all: Vec<DeliveryRecord> = self
            .deliveries
            .iter()
            .filter(|((e, _), _)| *e == event)
            .filter_map(|(_, record)| record.clone())
            .collect();
        all.sort_by(|a, b| a.destination.cmp(&b.destination));
        Ok(all)
    }
}

/// Most passes of one rule: each fetches one more level of what it reads.
const MAX_PASSES: usize = 8;

impl Prefetch {
    /// Runs `rule` until every row it reads is fetched (and locked) in `tx`; returns
    /// its result and the staged changes of the last, complete pass.
    pub(super) async fn decide<T>(
        &mut self,
        tx: &Tx<'_>,
        mut rule: impl FnMut(&mut Staged<'_, Prefetch>) -> Result<T, StoreError>,
    ) -> Result<(T, crate::store::lifecycle::Changes), StoreError> {
        for _ in 0..MAX_PASSES {
            let mut staged = Staged::new(&*self);
            let result = rule(&mut staged)?;
            let changes = staged.into_changes();
            let misses = std::mem::take(&mut *lock(&self.misses));
            if misses.is_empty() {
                return Ok((result, changes));
            }
            self.fetch(tx, misses).await?;
        }
        Err(StoreError::Backend {
            backend: "postgres",
            message: format!("a rule kept asking for more rows after {MAX_PASSES} passes"),
        })
    }

    /// Fetches and locks, before the rule's first pass asks, the dedup keys and the
    /// queues that a caller knows it will ask for (dispatch: its plans' keys and
    /// resources), in one round trip that may go with the caller's own statements.
    pub(super) async fn fetch_ahead(
        &mut self,
        tx: &Tx<'_>,
        dedup: impl IntoIterator<Item = [u8; 16]>,
        queues: impl IntoIterator<Item = (String, [u8; 16])>,
    ) -> Result<(), StoreError> {
        let m = Misses {
            dedup: dedup.into_iter().collect(),
            queues: queues.into_iter().collect(),
            ..Misses::default()
        };
        if m.is_empty() {
            return Ok(());
        }
        self.fetch(tx, m).await
    }

    /// Keeps delivery rows a caller fetched and locked (`record` in column `at`,
    /// `claim_expires_us` in the next) for the rule, with every key of `looked_for`
    /// that none of them is as absent: the rule's first pass reads them without a
    /// query of its own.
    pub(super) fn seed_deliveries(
        &mut self,
        looked_for: impl IntoIterator<Item = (EventId, String)>,
        rows: &[pg::Row],
        at: usize,
    ) -> Result<(), StoreError> {
        for key in looked_for {
            self.deliveries.insert(key, None);
        }
        self.take_deliveries(rows, at)
    }

    /// Keeps fetched delivery rows (`record` in column `at`, `claim_expires_us` in
    /// the next) and their claims.
    fn take_deliveries(&mut self, rows: &[pg::Row], at: usize) -> Result<(), StoreError> {
        for r in rows {
            let record = decode_record(r.get(at))?;
            let key = (record.event, record.destination.clone());
            let claimed: Option<i64> = r.get(at + 1);
            if let Some(until) = claimed {
                self.claimed_until.insert(key.clone(), until as u64);
            }
            self.deliveries.insert(key, Some(record));
        }
        Ok(())
    }

    /// Fetches and locks the missed rows, every kind in one round trip (pipelined);
    /// absent ones are remembered as absent.
    async fn fetch(&mut self, tx: &Tx<'_>, m: Misses) -> Result<(), StoreError> {
        let dedup_keys: Vec<&[u8]> = m.dedup.iter().map(|h| h.as_slice()).collect();
        let events: Vec<i64> = m.deliveries.iter().map(|(e, _)| sql_id(*e)).collect();
        let dests: Vec<&str> = m.deliveries.iter().map(|(_, d)| d.as_str()).collect();
        let all_events: Vec<i64> = m.all_deliveries.iter().map(|e| sql_id(*e)).collect();
        let queue_dests: Vec<&str> = m.queues.iter().map(|(d, _)| d.as_str()).collect();
        let resources: Vec<&[u8]> = m.queues.iter().map(|(_, r)| r.as_slice()).collect();
        let ids: Vec<i64> = m.events.iter().map(|id| sql_id(*id)).collect();
        // Each kind missed: what it is, its statement and its parameters.
        let wanted: [(bool, Kind, &str, Vec<&(dyn ToSql + Sync)>); 5] = [
            (
                !dedup_keys.is_empty(),
                Kind::Dedup,
                "SELECT hash, original, until_us FROM dedup WHERE hash = ANY($1) FOR UPDATE",
                vec![&dedup_keys],
            ),
            (
                !events.is_empty(),
                Kind::Deliveries,
                "SELECT d.record, d.claim_expires_us FROM deliveries d
                 JOIN unnest($1::bigint[], $2::text[]) AS k(event, destination)
                   ON d.event = k.event AND d.destination = k.destination
                 FOR UPDATE OF d",
                vec![&events, &dests],
            ),
            (
                !all_events.is_empty(),
                Kind::AllDeliveries,
                "SELECT record, claim_expires_us FROM deliveries WHERE event = ANY($1)
                 FOR UPDATE",
                vec![&all_events],
            ),
            (
                !queue_dests.is_empty(),
                Kind::Queues,
                "SELECT q.destination, q.resource, q.head, q.tail, q.len FROM queues q
                 JOIN unnest($1::text[], $2::bytea[]) AS k(destination, resource)
                   ON q.destination = k.destination AND q.resource = k.resource
                 FOR UPDATE OF q",
                vec![&queue_dests, &resources],
            ),
            (
                !ids.is_empty(),
                Kind::Events,
                "SELECT id, meta FROM events WHERE id = ANY($1) AND NOT inbox FOR UPDATE",
                vec![&ids],
            ),
        ];
        let (mut kinds, mut reads) = (Vec::new(), Vec::new());
        for (missed, kind, sql, params) in wanted {
            if missed {
                kinds.push(kind);
                reads.push((sql, params));
            }
        }
        let results = pipelined(&**tx, &reads).await?;
        for (kind, rows) in kinds.into_iter().zip(results) {
            match kind {
                Kind::Dedup => {
                    for h in &m.dedup {
                        self.dedup.insert(*h, None);
                    }
                    for r in rows {
                        let hash: &[u8] = r.get(0);
                        let Ok(hash) = <[u8; 16]>::try_from(hash) else { continue };
                        let original: i64 = r.get(1);
                        let until: i64 = r.get(2);
                        self.dedup.insert(
                            hash,
                            Some(DedupEntry {
                                original: EventId::new(original as u64),
                                until_us: until as u64,
                            }),
                        );
                    }
                }
                Kind::Deliveries => {
                    for key in &m.deliveries {
                        self.deliveries.insert(key.clone(), None);
                    }
                    self.take_deliveries(&rows, 0)?;
                }
                Kind::AllDeliveries => {
                    self.take_deliveries(&rows, 0)?;
                    self.complete.extend(m.all_deliveries.iter().copied());
                }
                Kind::Queues => {
                    for key in &m.queues {
                        self.queues.insert(key.clone(), None);
                    }
                    for r in rows {
                        let dest: String = r.get(0);
                        let resource: &[u8] = r.get(1);
                        let Ok(resource) = <[u8; 16]>::try_from(resource) else { continue };
                        let (head, tail, len): (i64, i64, i64) = (r.get(2), r.get(3), r.get(4));
                        self.queues.insert(
                            (dest, resource),
                            Some(Queue {
                                head: EventId::new(head as u64),
                                tail: EventId::new(tail as u64),
                                len: len as u64,
                            }),
                        );
                    }
                }
                Kind::Events => {
                    for id in &m.events {
                        self.events.insert(*id, None);
                    }
                    for r in rows {
                        let id: i64 = r.get(0);
                        let meta = decode_meta(r.get(1))?;
                        self.events.insert(EventId::new(id as u64), Some(meta));
                    }
                }
            }
        }
        Ok(())
    }
}

/// What one of [`Prefetch::fetch`]'s reads fetched.
enum Kind {
    Dedup,
    Deliveries,
    AllDeliveries,
    Queues,
    Events,
}

pub(super) fn decode_record(bytes: &[u8]) -> Result<DeliveryRecord, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        table: "deliveries",
        key: String::new(),
        reason: e.to_string(),
    })
}

pub(super) fn decode_meta(bytes: &[u8]) -> Result<EventMeta, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        table: "events",
        key: String::new(),
        reason: e.to_string(),
    })
}
