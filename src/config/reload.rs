//! What a reload may change and what only a restart can: pure comparisons of the
//! running configuration with the next, so that the daemon's reload (`daemon/reload.rs`)
//! decides nothing itself and the rules are tested here.
//!
//! A reload swaps the destinations, the routes, the filters and transforms, the retry,
//! rate and circuit settings, the sources, the upstream accounts, retention, and the
//! admin tokens and roles. What is set up once at start is refused by name: the
//! listeners (bound once), the store (opened once), logging and the trace export (set
//! up before anything else).

use serde_json::Value;

use super::Config;

/// A key whose change only a restart can take, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The key as the config file spells it (`storage.data_dir`).
    pub(crate) key: String,
    pub(crate) why: &'static str,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} changed: {}; restart the relay to change it", self.key, self.why)
    }
}

/// The keys of `next` that differ from `running` and only a restart takes, each once.
pub(crate) fn restart_needed(running: &Config, next: &Config) -> Vec<Refusal> {
    let (r, n) = (running, next);
    // (section, its value in each, why, whether it holds a secret (masked alike in
    // both printed forms: a change of it alone is named by the section))
    let sections = [
        ("ingress.listen", json(&r.ingress.listen), json(&n.ingress.listen), LISTEN, false),
        ("ingress.workers", json(&r.ingress.workers), json(&n.ingress.workers), WORKERS, false),
        ("admin.listen", json(&r.admin.listen), json(&n.admin.listen), LISTEN, false),
        ("storage", json(&r.storage), json(&n.storage), STORE, r.storage != n.storage),
        ("log", json(&r.log), json(&n.log), LOG, false),
        ("telemetry", json(&r.telemetry), json(&n.telemetry), TRACES, r.telemetry != n.telemetry),
    ];
    let mut refused = Vec::new();
    for (name, a, b, why, differs) in sections {
        let mut keys = Vec::new();
        differing(name, &a, &b, &mut keys);
        if keys.is_empty() && differs {
            keys.push(name.to_owned());
        }
        refused.extend(keys.into_iter().map(|key| Refusal { key, why }));
    }
    refused
}

const LISTEN: &str = "the listeners are bound once, at start";
const WORKERS: &str = "the public listener's workers are started once, at start";
const STORE: &str = "the store is opened once, at start";
const LOG: &str = "logging is set up once, at start";
const TRACES: &str = "the trace export is set up once, at start";

/// `v` as a JSON value (as `hookrelay check-config` prints it: secrets masked).
fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The dotted keys under `at` where `a` and `b` differ: objects are walked, anything
/// else (arrays included) is compared whole.
fn differing(at: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let null = Value::Null;
                let (x, y) = (a.get(key).unwrap_or(&null), b.get(key).unwrap_or(&null));
                differing(&format!("{at}.{key}"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(at.to_owned()),
        _ => {}
    }
}

/// What a reload changes, by name: what the log line and the journal say.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Changes {
    pub(crate) added: Vec<String>,
    /// Destinations whose settings changed (or whose defaults in `[delivery]` did).
    pub(crate) changed: Vec<String>,
    /// Their pending deliveries are held, as at a start without them (`retention.rs`).
    pub(crate) removed: Vec<String>,
    /// The sources or the upstream accounts changed: the reconciler starts again.
    pub(crate) sources: bool,
    /// The admin tokens or roles changed.
    pub(crate) tokens: bool,
    /// Anything else that a reload takes (`retention`, `shutdown`, the ingress limits).
    pub(crate) other: bool,
}

impl Changes {
    /// Whether the reload changes nothing at all.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What differs between `running` and `next`, as a reload takes it (the refusals
/// apart: see [`restart_needed`]).
pub(crate) fn changes(running: &Config, next: &Config) -> Changes {
    let find = |c: &Config, name: &str| c.destinations.iter().find(|d| d.name == name).cloned();
    let defaults_changed = running.delivery != next.delivery;
    let mut changes = Changes::default();
    for d in &next.destinations {
        match find(running, &d.name) {
            None => changes.added.push(d.name.clone()),
            Some(was) if was != *d || defaults_changed => changes.changed.push(d.name.clone()),
            Some(_) => {}
        }
    }
    for d in &running.destinations {
        if find(next, &d.name).is_none() {
            changes.removed.push(d.name.clone());
        }
    }
    changes.sources = running.sources != next.sources || running.upstream != next.upstream;
    changes.tokens = running.admin.token != next.admin.token
        || running.admin.resolved_token != next.admin.resolved_token
        || running.admin.tokens != next.admin.tokens
        || running.admin.wrong_tokens_per_minute != next.admin.wrong_tokens_per_minute;
    changes.other = running.retention != next.retention
        || running.shutdown != next.shutdown
        || running.ingress.max_body_bytes != next.ingress.max_body_bytes
        || running.ingress.body_timeout != next.ingress.body_timeout
        || running
            .destinations
            .iter()
            .map(|d| &d.name)
            .ne(next.destinations.iter().map(|d| &d.name));
    changes
}

/// A fingerprint of `config` (48 bits of SHA-256 of its printed form, secrets masked:
/// a rotated secret alone does not change it), whole in a gauge's f64: relays of a
/// fleet running the same configuration show the same number.
pub(crate) fn fingerprint(config: &Config) -> u64 {
    use sha2::Digest;
    let printed = serde_json::to_vec(config).unwrap_or_default();
    let digest = sha2::Sha256::digest(&printed);
    digest[..6].iter().fold(0u64, |n, b| (n << 8) | u64::from(*b))
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
