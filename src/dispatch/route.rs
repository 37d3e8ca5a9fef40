//! Routing: which destinations want an event, by source and event name globs.

use crate::config::DestinationConfig;

/// The routes of every destination, in config order.
pub(crate) struct Router {
    routes: Vec<Route>,
}

struct Route {
    destination: String,
    sources: Vec<String>,
    events: Vec<String>,
}

impl Router {
    pub(crate) fn new(destinations: &[DestinationConfig]) -> Self {
        Self {
            routes: destinations
                .iter()
                .map(|d| Route {
                    destination: d.name.clone(),
                    sources: d.sources.clone(),
                    events: d.events.clone(),
                })
                .collect(),
        }
    }

    /// Names of the destinations that want `event` from `source`.
    pub(crate) fn destinations_for(&self, source: &str, event: &str) -> Vec<String> {
        // The relay's operational events are about the relay, not a source.
        let any_source = crate::operational::NAMES.contains(&event);
        self.routes
            .iter()
            .filter(|r| any_source || r.sources.iter().any(|p| glob_match(p, source)))
            .filter(|r| r.events.iter().any(|p| event_matches(p, event)))
            .map(|r| r.destination.clone())
            .collect()
    }
}

/// Whether an `events` pattern takes `event`. The relay's own `hookrelay.*` events go
/// only to patterns that name them (`hookrelay.HookGap`, `hookrelay.*`): a consumer
/// that asked for `*` expects upstream records, not the relay's notices.
fn event_matches(pattern: &str, event: &str) -> bool {
    if crate::event_names::is_internal(event) && !crate::event_names::is_internal(pattern) {
        return false;
    }
    glob_match(pattern, event)
}

/// `*` matches any run of characters (including none); everything else literally.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|b| *b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("*", "ActionCreated"));
        assert!(glob_match("Action*", "ActionCreated"));
        assert!(glob_match("Action*", "Action"));
        assert!(!glob_match("Action*", "TaskCreated"));
        assert!(glob_match("*Created", "TaskCreated"));
        assert!(glob_match("A*D*d", "ActionDocumentCreated"));
        assert!(!glob_match("A*D*x", "ActionDocumentCreated"));
        assert!(glob_match("ActionCreated", "ActionCreated"));
        assert!(!glob_match("ActionCreated", "ActionCreatedX"));
        assert!(!glob_match("", "x"));
    }

    #[test]
    fn routes_by_source_and_event() {
        let dest = |name: &str, sources: &[&str], events: &[&str]| DestinationConfig {
            name: name.into(),
            sources: sources.iter().map(|s| s.to_string()).collect(),
            events: events.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let router = Router::new(&[
            dest("all", &["*"], &["*"]),
            dest("actions", &["*"], &["Action*"]),
            dest("b-tasks", &["b"], &["Task*", "StepChanged"]),
        ]);
        assert_eq!(router.destinations_for("a", "ActionCreated"), ["all", "actions"]);
        assert_eq!(router.destinations_for("a", "TaskCreated"), ["all"]);
        assert_eq!(router.destinations_for("b", "StepChanged"), ["all", "b-tasks"]);
    }

    #[test]
    fn internal_events_go_only_where_named() {
        let dest = |name: &str, events: &[&str]| DestinationConfig {
            name: name.into(),
            sources: vec!["*".into()],
            events: events.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let router = Router::new(&[
            dest("all", &["*"]),
            dest("gaps", &["hookrelay.HookGap"]),
            dest("relay", &["hookrelay.*"]),
        ]);
        assert_eq!(router.destinations_for("a", "hookrelay.HookGap"), ["gaps", "relay"]);
        assert_eq!(router.destinations_for("a", "ActionCreated"), ["all"]);
    }
}
