//! What one account's hooks need: a pure function from the hooks the upstream lists
//! to the changes that make them match the configuration.

use super::model::Hook;

/// The changes to make, in the order they are made.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    /// Disabled hooks to delete and re-create, grouped by event.
    pub(crate) recreate: Vec<(String, Vec<Hook>)>,
    /// Events without any hook here: create one.
    pub(crate) create: Vec<String>,
    /// Hooks pointing at this relay that are not wanted (only with `prune`).
    pub(crate) prune: Vec<Hook>,
    /// Hooks pointing elsewhere: never touched, only counted.
    pub(crate) foreign: usize,
}

/// Where this relay's hooks point for one source.
pub(crate) struct Targets<'a> {
    /// `{public_url}/hooks/{source}/`: anything under it points at this relay.
    pub(crate) prefix: &'a str,
    /// The exact URL for an event: `{prefix}{token}/{event}`.
    pub(crate) target: &'a dyn Fn(&str) -> String,
}

/// Plans the changes for `events` given the account's `hooks`.
///
/// - An event with an Active hook at the exact target URL is fine.
/// - An event whose only hooks at the exact URL are not Active (Disabled; re-enabling
///   is not part of the interface) gets them deleted and one created.
/// - An event with no hook at the exact URL gets one.
/// - Hooks under the relay's prefix that match no wanted (event, URL) — an event no
///   longer configured, a superseded token — and duplicates of an Active hook are
///   deleted when `prune` is set, left alone otherwise.
/// - Hooks whose target is not under the prefix belong to someone else: untouched.
pub(crate) fn plan(events: &[String], hooks: &[Hook], targets: &Targets<'_>, prune: bool) -> Plan {
    let mut plan = Plan::default();
    let (ours, foreign): (Vec<&Hook>, Vec<&Hook>) =
        hooks.iter().partition(|h| h.target_url.starts_with(targets.prefix));
    plan.foreign = foreign.len();
    let mut wanted_ids = std::collections::HashSet::new();
    for event in events {
        let target = (targets.target)(event);
        let exact: Vec<&Hook> = ours
            .iter()
            .copied()
            .filter(|h| &h.event_name == event && h.target_url == target && h.status != "Deleted")
            .collect();
        let active: Vec<&Hook> = exact.iter().copied().filter(|h| h.is_active()).collect();
        match active.first() {
            Some(keep) => {
                // Duplicates (and dead leftovers) are prunable, the first Active stays.
                wanted_ids.insert(keep.id.clone());
            }
            None if !exact.is_empty() => {
                for h in &exact {
                    wanted_ids.insert(h.id.clone());
                }
                plan.recreate.push((event.clone(), exact.into_iter().cloned().collect()));
            }
            None => plan.create.push(event.clone()),
        }
    }
    if prune {
        plan.prune = ours
            .into_iter()
            .filter(|h| !wanted_ids.contains(&h.id) && h.status != "Deleted")
            .cloned()
            .collect();
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const PREFIX: &str = "https://relay.example.com/hooks/demo/";

    fn target(event: &str) -> String {
        format!("{PREFIX}tok/{event}")
    }

    fn hook(id: &str, event: &str, url: &str, status: &str) -> Hook {
        Hook {
            id: id.into(),
            event_name: event.into(),
            target_url: url.into(),
            status: status.into(),
            triggered_count: 0,
            last_triggered: None,
        }
    }

    fn run(events: &[&str], hooks: &[Hook], prune: bool) -> Plan {
        let events: Vec<String> = events.iter().map(|e| (*e).to_owned()).collect();
        let t = target;
        plan(&events, hooks, &Targets { prefix: PREFIX, target: &t }, prune)
    }

    #[test]
    fn creates_what_is_missing_and_keeps_what_is_active() {
        let hooks = [hook("1", "ActionCreated", &target("ActionCreated"), "Active")];
        let p = run(&["ActionCreated", "TaskCreated"], &hooks, false);
        assert_eq!(p.create, vec!["TaskCreated"]);
        assert!(p.recreate.is_empty() && p.prune.is_empty());
    }

    #[test]
    fn recreates_disabled_hooks() {
        let hooks = [
            hook("1", "ActionCreated", &target("ActionCreated"), "Disabled"),
            hook("2", "ActionCreated", &target("ActionCreated"), "Disabled"),
        ];
        let p = run(&["ActionCreated"], &hooks, true);
        assert_eq!(p.recreate.len(), 1);
        assert_eq!(p.recreate[0].1.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(), ["1", "2"]);
        assert!(p.create.is_empty() && p.prune.is_empty(), "{p:?}");
    }

    #[test]
    fn never_touches_hooks_pointing_elsewhere() {
        let hooks = [
            hook("1", "ActionCreated", "https://other.example.com/x", "Disabled"),
            hook(
                "2",
                "TaskCreated",
                "https://relay.example.com/hooks/other-source/t/TaskCreated",
                "Active",
            ),
        ];
        let p = run(&["ActionCreated"], &hooks, true);
        assert_eq!(p.create, vec!["ActionCreated"]);
        assert!(p.recreate.is_empty() && p.prune.is_empty());
        assert_eq!(p.foreign, 2);
    }

    #[test]
    fn prunes_only_when_asked() {
        let hooks = [
            hook("1", "ActionCreated", &target("ActionCreated"), "Active"),
            hook("2", "ActionCreated", &target("ActionCreated"), "Active"),
            hook("3", "TaskCreated", &target("TaskCreated"), "Active"),
            hook("4", "ActionCreated", &format!("{PREFIX}old-token/ActionCreated"), "Active"),
        ];
        assert!(run(&["ActionCreated"], &hooks, false).prune.is_empty());
        let pruned: Vec<String> =
            run(&["ActionCreated"], &hooks, true).prune.into_iter().map(|h| h.id).collect();
        assert_eq!(pruned, vec!["2", "3", "4"]);
    }
}
