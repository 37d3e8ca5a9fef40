//! The audit: every callback received accounted for, from the ledger the store keeps
//! as the states change (`store/lifecycle/ledger.rs`). `report.rs` does the
//! arithmetic; this module reads a window for the admin API and the CLI, and checks
//! the last day every minute for `hookrelay_audit_imbalance`.

pub(crate) mod report;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::api::AuditReport;
use crate::internal_events::taxonomy::{self, ErrorType, Stage};
use crate::internal_events::{AuditChecked, InternalEvent};
use crate::metrics::Metrics;
use crate::shutdown::Stop;
use crate::store::lifecycle::ledger::HOUR_US;
use crate::store::{SharedStore, StoreError};

/// The window the imbalance check reads, and the API's default: the last day.
pub(crate) const DEFAULT_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// How often the imbalance check runs.
const CHECK_EVERY: Duration = Duration::from_secs(60);
/// The widest window one request may read (a year of hours).
pub(crate) const MAX_HOURS: u64 = 366 * 24;

/// The hours (since the Unix epoch) that cover `since..until`, widened to whole hours.
pub(crate) fn hours(since: SystemTime, until: SystemTime) -> Result<(u64, u64), String> {
    let (from, to) = (crate::clock::unix_micros(since), crate::clock::unix_micros(until));
    if from >= to {
        return Err("since must be before until".into());
    }
    let (from, to) = (from / HOUR_US, to.div_ceil(HOUR_US));
    if to - from > MAX_HOURS {
        return Err(format!(
            "the window spans {} hours; read at most {MAX_HOURS} (a year) at a time",
            to - from
        ));
    }
    Ok((from, to))
}

/// The audit of `from_hour..to_hour`, for `source` only when one is given.
pub(crate) async fn read(
    store: &SharedStore,
    from_hour: u64,
    to_hour: u64,
    source: Option<&str>,
) -> Result<AuditReport, StoreError> {
    let reading = store.ledger(from_hour, to_hour).await?;
    Ok(report::report(&reading, from_hour, to_hour, source))
}

/// Checks the last [`DEFAULT_WINDOW`] every [`CHECK_EVERY`] until `stop`.
pub(crate) async fn watch(store: SharedStore, metrics: Arc<Metrics>, mut stop: Stop) {
    loop {
        let now = crate::clock::now();
        let since = now.checked_sub(DEFAULT_WINDOW).unwrap_or(SystemTime::UNIX_EPOCH);
        match hours(since, now) {
            Ok((from, to)) => match read(&store, from, to, None).await {
                Ok(report) => AuditChecked::Read(&report.imbalances).emit(&metrics),
                Err(e) => AuditChecked::Failed(&e).emit(&metrics),
            },
            Err(e) => taxonomy::failed(
                &metrics,
                Stage::Audit,
                ErrorType::Invalid,
                "cannot compute the audit window",
                &e,
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(CHECK_EVERY) => {}
            _ = stop.wait() => return,
        }
    }
}
