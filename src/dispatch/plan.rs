//! Dispatch's plan rules: what a batch's plans are made from (routes, ordered and
//! latest destinations, filters, dedup rules), and each event's plan.

use std::collections::HashMap;
use std::sync::Arc;

use super::dedup;
use super::resource;
use super::route::Router;
use crate::config::Config;
use crate::delivery::Destinations;
use crate::operational;
use crate::shape::{self, program::Program};
use crate::store::{DedupKey, DispatchPlan, FilteredOut, PendingEvent};

/// A source's dedup rule.
pub(super) struct DedupRule {
    window_us: u64,
    pointers: Vec<String>,
}

/// What a plan is made from: the routes, the ordered destinations, the filters, the
/// dedup rules.
pub(super) struct PlanRules {
    router: Router,
    /// Destinations with `ordering = "per-resource"` or `"latest"`.
    ordered: std::collections::HashSet<String>,
    /// Those of them with `ordering = "latest"`.
    latest: std::collections::HashSet<String>,
    /// Destinations with a `filter`.
    pub(super) filters: HashMap<String, Arc<Program>>,
    dedup: HashMap<String, DedupRule>,
}

impl PlanRules {
    /// The dispatch plan of one pending event: its destinations, whether they are
    /// ordered, its resource key and its dedup key.
    pub(super) fn plan(
        &self,
        p: &PendingEvent,
        destinations: Vec<String>,
        filtered: Vec<FilteredOut>,
    ) -> DispatchPlan {
        let ordered: Vec<String> =
            destinations.iter().filter(|d| self.ordered.contains(*d)).cloned().collect();
        let resource = match (&p.meta.resource, ordered.is_empty()) {
            (Some(about), false) => Some(resource::key(&p.meta.source, about)),
            _ => None,
        };
        let dedup = self.dedup.get(&p.meta.source).filter(|r| r.window_us > 0).map(|r| DedupKey {
            hash: dedup::key(&p.meta.source, &p.meta.event, &p.body, &r.pointers),
            window_us: r.window_us,
        });
        let latest = ordered.iter().filter(|d| self.latest.contains(*d)).cloned().collect();
        DispatchPlan { id: p.id, dedup, destinations, filtered, latest, ordered, resource }
    }

    /// What a batch's plans are made from: each event's destinations, and the events
    /// whose destinations have filters to ask (with, for each event, its place there).
    pub(super) fn routes(&self, pending: &[PendingEvent]) -> Routes {
        let mut batch = Vec::new();
        let mut at = Vec::with_capacity(pending.len());
        let mut routes = Vec::with_capacity(pending.len());
        for p in pending {
            let mut destinations = self.router.destinations_for(&p.meta.source, &p.meta.event);
            // An operational event never goes to the destination it reports on.
            if let Some(about) = operational::reported_on(&p.meta) {
                destinations.retain(|d| d != about);
            }
            let filters: Vec<(String, Arc<Program>)> = destinations
                .iter()
                .filter_map(|d| Some((d.clone(), self.filters.get(d)?.clone())))
                .collect();
            routes.push(destinations);
            if filters.is_empty() {
                at.push(None);
                continue;
            }
            at.push(Some(batch.len()));
            let (id, meta, body) = (p.id, p.meta.clone(), p.body.clone());
            batch.push(shape::ToFilter { id, meta, body, filters });
        }
        Routes { destinations: routes, to_filter: batch, at }
    }

    /// The plans of a batch when no destination has a filter (`filters` is empty): the
    /// dispatcher's one call and the committer's (`WithCommits`).
    pub(super) fn plans_unfiltered(&self, pending: &[PendingEvent]) -> Vec<DispatchPlan> {
        self.plans(pending, self.routes(pending), Vec::new())
    }

    /// The plans of a batch, from its routes and its filters' answers (one list of
    /// destinations filtered out per event asked, in the order of `to_filter`).
    pub(super) fn plans(
        &self,
        pending: &[PendingEvent],
        routes: Routes,
        mut verdicts: Vec<Vec<FilteredOut>>,
    ) -> Vec<DispatchPlan> {
        let Routes { destinations: routes, at, .. } = routes;
        pending
            .iter()
            .zip(at)
            .zip(routes)
            .map(|((p, at), destinations)| {
                let filtered = at.and_then(|i| verdicts.get_mut(i)).map(std::mem::take);
                self.plan(p, destinations, filtered.unwrap_or_default())
            })
            .collect()
    }
}

/// A batch's routes, and the filters they need asked.
pub(super) struct Routes {
    /// Each event's destinations.
    destinations: Vec<Vec<String>>,
    /// The events with destinations that filter.
    pub(super) to_filter: Vec<shape::ToFilter>,
    /// Each event's place in `to_filter`, if it has one.
    at: Vec<Option<usize>>,
}

impl PlanRules {
    /// The rules of `config`, whose destinations are `destinations`.
    pub(super) fn of(config: &Config, destinations: &Destinations) -> Self {
        let dedup = config
            .sources
            .iter()
            .map(|s| {
                let window_us = crate::clock::micros(s.dedup_window);
                (s.name.clone(), DedupRule { window_us, pointers: s.dedup_pointers.clone() })
            })
            .collect();
        let with = |ordering: &dyn Fn(crate::config::Ordering) -> bool| {
            config
                .destinations
                .iter()
                .filter(|d| ordering(d.ordering))
                .map(|d| d.name.clone())
                .collect()
        };
        PlanRules {
            router: Router::new(&config.destinations),
            ordered: with(&|o| o != crate::config::Ordering::None),
            latest: with(&|o| o == crate::config::Ordering::Latest),
            // The destinations' own programs: one strike count per program.
            filters: destinations
                .iter()
                .filter_map(|d| Some((d.dest.name.clone(), d.dest.filter.clone()?)))
                .collect(),
            dedup,
        }
    }
}
