//! The last hour of each destination, as the console's charts draw it: its backlog, how
//! long the oldest of it has waited, and its deliveries per minute, sampled by this
//! relay every [`INTERVAL`] from its own data (the store's queue counts, its workers'
//! activity): no Prometheus needed to see what is stuck. Kept in memory: a restart
//! starts the charts again.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, HttpResponse};

use super::views::age_seconds;
use super::AdminState;
use crate::api::{DestinationHistory, DestinationSeries, HistoryPoint};
use crate::delivery::{DestinationState, Destinations};
use crate::lock::{lock, Current};
use crate::shutdown::Stop;
use crate::store::SharedStore;

/// Time between two samples.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);
/// Samples kept per destination: an hour.
const KEPT: usize = 360;

/// Each destination's samples, oldest first.
#[derive(Default)]
pub(crate) struct History(Mutex<BTreeMap<String, VecDeque<HistoryPoint>>>);

impl History {
    /// Adds a sample of `name`, forgetting what is past the hour.
    fn add(&self, name: &str, point: HistoryPoint) {
        let mut all = lock(&self.0);
        let points = all.entry(name.to_owned()).or_default();
        points.push_back(point);
        while points.len() > KEPT {
            points.pop_front();
        }
    }

    /// Forgets the destinations not in `names` (removed by a reload).
    fn keep(&self, names: &[&String]) {
        lock(&self.0).retain(|name, _| names.contains(&name));
    }

    /// The samples of the destinations `sees` lets through.
    fn series(&self, sees: impl Fn(&str) -> bool) -> Vec<DestinationSeries> {
        lock(&self.0)
            .iter()
            .filter(|(name, _)| sees(name))
            .map(|(name, points)| DestinationSeries {
                name: name.clone(),
                points: points.iter().cloned().collect(),
            })
            .collect()
    }
}

/// Samples every destination in force every [`INTERVAL`] until `stop`, the first at
/// once. A store that does not answer skips a sample (the chart shows the gap).
pub(crate) async fn sample(
    history: Arc<History>,
    destinations: Arc<Current<Destinations>>,
    store: SharedStore,
    mut stop: Stop,
) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait() => return,
        }
        let in_force = destinations.load();
        for d in in_force.iter() {
            if let Some(point) = point(d, &store).await {
                history.add(&d.dest.name, point);
            }
        }
        history.keep(&in_force.names().collect::<Vec<_>>());
    }
}

/// `GET /admin/destinations/history`: the last hour of the destinations the caller
/// sees, each ended by a sample taken now (so the charts' latest value is the table's).
pub(super) async fn show(state: web::Data<AdminState>, who: super::Who) -> HttpResponse {
    let mut destinations = state.history.series(|name| who.sees(name));
    let in_force = state.destinations.load();
    for series in &mut destinations {
        let Some(d) = in_force.get(&series.name) else { continue };
        if let Some(now) = point(d, &state.store).await {
            series.points.push(now);
        }
    }
    HttpResponse::Ok()
        .json(DestinationHistory { interval_seconds: INTERVAL.as_secs(), destinations })
}

/// A sample of `d` now; `None` when the store does not answer.
async fn point(d: &DestinationState, store: &SharedStore) -> Option<HistoryPoint> {
    let q = store.queue_stats(&d.dest.name).await.ok()?;
    Some(HistoryPoint {
        at: crate::timefmt::format_admin(std::time::SystemTime::now()),
        backlog: q.pending + q.held + q.retrying,
        oldest_pending_seconds: q.oldest.map(|id| age_seconds(id) as u64),
        per_minute: d.activity().per_minute,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(n: u64) -> HistoryPoint {
        HistoryPoint { at: n.to_string(), backlog: n, oldest_pending_seconds: None, per_minute: 0 }
    }

    #[test]
    fn an_hour_is_kept_and_a_removed_destination_forgotten() {
        let h = History::default();
        for n in 0..(KEPT as u64 + 5) {
            h.add("crm", point(n));
            h.add("erp", point(n));
        }
        let all = h.series(|_| true);
        assert_eq!(all[0].points.len(), KEPT);
        assert_eq!(all[0].points[0].backlog, 5, "the oldest past the hour went first");
        assert_eq!(h.series(|n| n == "erp").len(), 1, "only what the caller sees");
        let crm = "crm".to_owned();
        h.keep(&[&crm]);
        assert_eq!(h.series(|_| true).len(), 1);
    }
}
