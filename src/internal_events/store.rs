//! The store: group commits, events stored, the store failing, whether the database
//! answers.

use std::time::Duration;

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::event_names;
use crate::metrics::Metrics;
use crate::store::EventMeta;

/// A group of appends committed in one write (or failed as one).
pub(crate) struct CommitGroup {
    pub(crate) size: usize,
    pub(crate) took: Duration,
    pub(crate) ok: bool,
}

impl InternalEvent for CommitGroup {
    const FAMILIES: &'static [&'static str] = &[
        "hookrelay_store_commit_duration_seconds",
        "hookrelay_store_commit_batch_size",
        "hookrelay_store_commit_failures_total",
        ERRORS,
    ];
    fn emit(self, m: &Metrics) {
        m.store.store_commit_duration.observe(self.took.as_secs_f64());
        m.store.store_commit_batch_size.observe(self.size as f64);
        if !self.ok {
            m.store.store_commit_failures.inc();
            taxonomy::count(m, Stage::Store, ErrorType::Storage);
        }
    }
}

/// redb's checkpoint (`store/embedded/engine/redo/`): its time is what it adds to the
/// tail of every write waiting for it; a failed one is a storage error (the redo log
/// keeps every write until the next succeeds).
pub(crate) struct Checkpoint {
    pub(crate) took: Duration,
    pub(crate) ok: bool,
}

impl InternalEvent for Checkpoint {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_store_checkpoint_duration_seconds", ERRORS];
    fn emit(self, m: &Metrics) {
        tracing::debug!(took_us = self.took.as_micros() as u64, ok = self.ok, "redb checkpoint");
        m.store.store_checkpoint_duration.observe(self.took.as_secs_f64());
        if !self.ok {
            taxonomy::count(m, Stage::Store, ErrorType::Storage);
        }
    }
}

/// An event stored (by this relay): counted by source and event name (the hook
/// lifecycle compares these counts with the upstream's).
pub(crate) struct EventStored<'a>(pub(crate) &'a EventMeta);

impl InternalEvent for EventStored<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_events_stored_total"];
    fn emit(self, m: &Metrics) {
        let event = event_names::metric_label(&self.0.event);
        m.store.events_stored.with_label_values(&[self.0.source.as_str(), event]).inc();
    }
}

/// The store failed for good (an engine error): the relay is not ready, and exits to
/// be restarted. The reason is logged where the failure is handled.
pub(crate) struct StoreFailed<'a> {
    pub(crate) reason: &'a str,
}

impl InternalEvent for StoreFailed<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_ready", "hookrelay_store_failed", ERRORS];
    fn emit(self, m: &Metrics) {
        m.relay.ready.set(0);
        taxonomy::count(m, Stage::Store, ErrorType::Storage);
        m.store.store_failed.set(1);
        tracing::error!(reason = %self.reason,
            "the store failed: it takes no more writes; the relay stops so that it is \
             restarted on a freshly opened store");
    }
}

/// The answer to one probe of the database (`reachability.rs`), with what it changed.
pub(crate) enum StoreProbed<'a> {
    /// It answered, as before.
    Reachable,
    /// It answered again after failing.
    Back,
    /// It failed, having answered before.
    Lost(&'a str),
    /// It failed again.
    StillLost,
}

impl InternalEvent for StoreProbed<'_> {
    const FAMILIES: &'static [&'static str] =
        &["hookrelay_store_reachable", "hookrelay_store_probe_failures_total", ERRORS];
    fn emit(self, m: &Metrics) {
        let up = matches!(self, Self::Reachable | Self::Back);
        m.store.store_reachable.set(i64::from(up));
        if !up {
            m.store.store_probe_failures.inc();
            taxonomy::count(m, Stage::Store, ErrorType::Unreachable);
        }
        match self {
            Self::Lost(error) => tracing::error!(%error,
                "the database is unreachable: not ready, callbacks are closed unanswered (the upstream retries) until it is back"),
            Self::Back => tracing::info!("the database is reachable again: ready"),
            Self::Reachable | Self::StillLost => {}
        }
    }
}

/// The machine's clock against the database's (`clock::wall_skew`, read at the last
/// fleet heartbeat), checked with every probe of the database.
pub(crate) struct ClockChecked<'a> {
    /// Machine minus database, in µs.
    pub(crate) skew_us: i64,
    /// Why the relay is not ready for it ([`crate::clock::skew_problem`]), if it is off.
    pub(crate) problem: Option<&'a str>,
    /// Whether the last check found it off: a change is logged once.
    pub(crate) was_off: bool,
}

impl InternalEvent for ClockChecked<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_clock_skew_seconds", ERRORS];
    fn emit(self, m: &Metrics) {
        m.relay.clock_skew.set(self.skew_us as f64 / 1e6);
        match (self.problem, self.was_off) {
            (Some(problem), false) => {
                taxonomy::count(m, Stage::Relay, ErrorType::ClockSkew);
                tracing::error!(skew_us = self.skew_us, "not ready: {problem}")
            }
            (None, true) => tracing::info!(
                skew_us = self.skew_us,
                "this machine's clock is within the bound of the database's again: ready"
            ),
            _ => {}
        }
    }
}

/// The audit of the last day was read (`audit/`): the equations that do not hold.
pub(crate) enum AuditChecked<'a> {
    Read(&'a [String]),
    /// The ledger could not be read (the gauge keeps its last value).
    Failed(&'a crate::store::StoreError),
}

impl InternalEvent for AuditChecked<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_audit_imbalance", ERRORS];
    fn emit(self, m: &Metrics) {
        match self {
            Self::Read(imbalances) => {
                let before = m.store.audit_imbalance.get();
                let now = i64::try_from(imbalances.len()).unwrap_or(i64::MAX);
                m.store.audit_imbalance.set(now);
                if now > 0 && before == 0 {
                    taxonomy::count(m, Stage::Audit, ErrorType::Imbalance);
                    tracing::error!(imbalances = ?imbalances,
                        "the audit ledger does not balance: some callbacks are not accounted for \
                         (see GET /admin/audit and the runbook's HookrelayAuditImbalance)");
                } else if now == 0 && before > 0 {
                    tracing::info!("the audit ledger balances again");
                }
            }
            Self::Failed(e) => {
                taxonomy::count(m, Stage::Audit, ErrorType::Storage);
                tracing::warn!(error = %e, "cannot read the audit ledger; checking again in a minute");
            }
        }
    }
}

/// The TLS the relay talks to its database with, told once at start: the gauge says
/// whether the server's certificate is verified; prefer, allow and require without a
/// CA are warned about (an impostor on the path would be talked to, and prefer falls
/// back to plaintext without a word).
pub(crate) struct PostgresTls {
    pub(crate) sslmode: &'static str,
    pub(crate) verified: bool,
}

impl InternalEvent for PostgresTls {
    const FAMILIES: &'static [&'static str] = &["hookrelay_postgres_tls_verified"];
    fn emit(self, m: &Metrics) {
        let Self { sslmode, verified } = self;
        m.store.postgres_tls_verified.with_label_values(&[sslmode]).set(i64::from(verified));
        if verified {
            tracing::info!(sslmode, "PostgreSQL over TLS, the server's certificate verified");
        } else {
            tracing::warn!(
                sslmode,
                "PostgreSQL: the server's certificate is not verified, so an impostor on the \
                 network path would be talked to (and sslmode prefer or allow fall back to \
                 plaintext without a word): set storage.postgres.sslmode = \"verify-full\" \
                 and ca_file (docs/deploy.md, production checklist)"
            );
        }
    }
}

/// The committer reports its groups here, as internal events: the store imports
/// nothing from above it, and the metrics know nothing of the events.
impl crate::store::StoreObserver for Metrics {
    fn group(&self, size: usize, took: std::time::Duration, ok: bool) {
        CommitGroup { size, took, ok }.emit(self);
    }
    fn stored(&self, meta: &EventMeta) {
        EventStored(meta).emit(self);
    }
    fn checkpoint(&self, took: std::time::Duration, ok: bool) {
        Checkpoint { took, ok }.emit(self);
    }
    fn failed(&self, reason: &str) {
        StoreFailed { reason }.emit(self);
    }
    fn trouble(&self, kind: crate::store::Trouble, what: &str, error: &dyn std::fmt::Display) {
        let error_type = match kind {
            crate::store::Trouble::Unreachable => ErrorType::Unreachable,
            crate::store::Trouble::Storage => ErrorType::Storage,
            crate::store::Trouble::Corrupt => ErrorType::Corrupt,
        };
        taxonomy::degraded(self, Stage::Store, error_type, what, error);
    }
}
