//! Opening the embedded store: the engine and its trees, the layout's version (and
//! the upgrades from older ones), the state rebuilt from what is stored, and the
//! threads the store owns (the group committer, the count behind the open).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::engine::{read_scope, Db, EngineOptions, Tree};
use super::{
    apply, background_flush, dedup, flush, ledger, migrate, recount, EmbeddedOptions,
    EmbeddedState, EmbeddedStore, CURSOR_KEY, DEAD_LETTERS, DEDUP, DELIVERIES, JOURNAL, META,
    ORDERING, OUTCOMES, RECORDS, SCHEDULE, SCHEMA_KEY, SCHEMA_VERSION, UPSTREAM,
};
use crate::store::{hex, ClaimTable, Committer, EventId, Health, StoreError};

impl EmbeddedStore {
    /// What a power cut would leave now, copied into `to` (`engine::Db::crash_image`);
    /// `false` on sled.
    #[cfg(test)]
    pub(crate) fn crash_image(&self, to: &std::path::Path) -> std::io::Result<bool> {
        self.inner.db.crash_image(to)
    }

    /// Opens (or creates) the store at `path`, checks its schema version and starts the
    /// count of the inbox and the queues (`recount/`). Blocking.
    pub(crate) fn open(opts: &EmbeddedOptions) -> Result<Self, StoreError> {
        let db = Db::open(
            opts.engine,
            &EngineOptions {
                path: &opts.path,
                cache_capacity_bytes: opts.cache_capacity_bytes,
                compression: opts.compression,
                flush: background_flush::Pacing::of(opts.engine, opts.flush_interval, opts.durable),
            },
        )?;
        db.observe(opts.observer.clone());
        let meta = db.open_tree(META)?;
        match meta.get(SCHEMA_KEY)? {
            None => {
                meta.insert(SCHEMA_KEY, SCHEMA_VERSION.to_string().as_bytes())?;
            }
            Some(v) if v.as_ref() == SCHEMA_VERSION.to_string().as_bytes() => {
                migrate::drop_v1_trees(&db)?;
            }
            Some(v) if v.as_ref() == b"1" || v.as_ref() == b"2" => {
                if v.as_ref() == b"1" {
                    migrate::from_v1(&db)?;
                }
                let moved = EmbeddedState::dedup_from_v2(&db, crate::clock::now_us())?;
                meta.insert(SCHEMA_KEY, SCHEMA_VERSION.to_string().as_bytes())?;
                db.flush()?;
                migrate::drop_v1_trees(&db)?;
                tracing::info!(
                    from = %String::from_utf8_lossy(&v),
                    to = SCHEMA_VERSION,
                    dedup_keys_moved = moved,
                    "the store's layout was upgraded"
                );
            }
            Some(v) => {
                return Err(StoreError::Schema {
                    found: String::from_utf8_lossy(&v).into_owned(),
                    supported: SCHEMA_VERSION,
                })
            }
        }
        let dedup = db.open_tree(DEDUP)?;
        let health = Health::new(
            opts.engine.name(),
            opts.write_timeout,
            crate::store::Writers::OneAtATime,
            opts.observer.clone(),
        );
        let inner = EmbeddedState {
            records: db.open_tree(RECORDS)?,
            outcomes: db.open_tree(OUTCOMES)?,
            deliveries: db.open_tree(DELIVERIES)?,
            schedule: db.open_tree(SCHEDULE)?,
            dead_letters: db.open_tree(DEAD_LETTERS)?,
            ordering: db.open_tree(ORDERING)?,
            upstream: db.open_tree(UPSTREAM)?,
            journal: db.open_tree(JOURNAL)?,
            cursor: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            inbox_count: AtomicI64::new(0),
            dedup_count: AtomicI64::new(apply::signed(dedup.len()?)),
            dedup_buckets: dedup::Buckets::read(&dedup)?,
            dedup,
            meta,
            db,
            lifecycle: Mutex::new(()),
            counts: recount::Counts::uncounted(),
            claims: ClaimTable::default(),
            last_id: Mutex::new(0),
            ledger_start: AtomicU64::new(0),
            waiting: Mutex::new(ledger::Waiting::new()),
            unsaved: Mutex::new(ledger::Unsaved::default()),
            flusher: flush::GroupFlush::default(),
            durable: opts.durable,
            watchdog: Health::start_watchdog(&health)?,
            health,
            commit_dispatch: Mutex::new(None),
        };
        // What the open wrote (a schema version, a migration, new trees) is durable
        // from here.
        inner.db.flush()?;
        inner.rebuild()?;
        let inner = Arc::new(inner);
        let count_thread = recount::start(&inner, opts.count_pace)?;
        let writer = inner.clone();
        let (committer, thread) = Committer::start(
            opts.engine.name(),
            Box::new(move |events, quiet, riders| {
                // A quiet group's dispatch reads in the write (`dispatch.rs`), and so
                // do the riders' rules (`ride.rs`): their lookups share their tables.
                let append = || read_scope(|| writer.append(events, quiet, riders));
                writer.health.write(StoreError::is_engine_failure, append)
            }),
            opts.commit_max_batch,
            opts.observer.clone(),
            inner.health.clone(),
        )?;
        Ok(Self {
            inner,
            committer,
            committer_thread: Arc::new(Mutex::new(Some(thread))),
            count_thread: Arc::new(Mutex::new(count_thread)),
        })
    }
}

impl EmbeddedState {
    /// Seeds the id counter and the dispatch cursor from what is stored, and says where
    /// the inbox is for the count behind the open (`recount/`).
    fn rebuild(&self) -> Result<(), StoreError> {
        let last = |tree: &Tree| -> Result<u64, StoreError> {
            Ok(tree.last()?.and_then(|(k, _)| EventId::from_key(&k)).map_or(0, EventId::raw))
        };
        *crate::lock::lock(&self.last_id) = last(&self.records)?;
        let cursor = match self.outcomes.get(CURSOR_KEY)? {
            Some(v) => {
                u64::from_be_bytes(v.as_ref().try_into().map_err(|_| StoreError::Corrupt {
                    table: OUTCOMES,
                    key: hex(CURSOR_KEY),
                    reason: "dispatch cursor is not 8 bytes".into(),
                })?)
            }
            None => 0,
        };
        self.cursor.store(cursor, Ordering::Relaxed);
        // Never hand out an id at or below the cursor: retention may have deleted the
        // newest records (the highest key is then lower than ids already settled), and
        // an event stored there would be taken as settled and never dispatched. Nor at
        // or below the ledger's append mark (saved before retention deletes anything):
        // a rejected event never moves the cursor, and once it was pruned as the newest
        // record, its id was handed out again and the new event's append went uncounted.
        {
            let mut last_id = crate::lock::lock(&self.last_id);
            *last_id = (*last_id).max(cursor).max(self.appended_mark()?.unwrap_or(0));
            // Everything stored is visible at open.
            self.committed.store(*last_id, Ordering::Release);
            let start = Self::open_ledger(&self.meta, *last_id)?;
            self.ledger_start.store(start.raw(), Ordering::Relaxed);
        }
        self.recount_appended()?;
        // The inbox is counted behind the open (`recount/`), from the event after the
        // cursor through the last one stored; later ones as they are appended.
        let last = *crate::lock::lock(&self.last_id);
        self.counts.inbox_between(EventId::new(cursor.saturating_add(1)), EventId::new(last));
        Ok(())
    }
}
