//! The role each admin route needs: one table, read by the guard before any handler
//! runs. A route missing from it needs the admin role (closed by default), and
//! `tests/integration/roles.rs` holds every route of the OpenAPI document to a rule
//! of its own, tried with every role.

use actix_web::http::Method;

use crate::config::Role;

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    /// The least role that may call it.
    pub(crate) role: Role,
    /// Its `{name}` segment is a destination: a scoped token may call it only for
    /// one of its own.
    pub(crate) destination_in_path: bool,
}

/// `(method, path under /admin, role, destination in path)`: `{x}` matches one
/// segment. HEAD is answered as GET.
const RULES: &[(&str, &str, Role, bool)] = &[
    ("GET", "/openapi.json", Role::Viewer, false),
    ("GET", "/events", Role::Viewer, false),
    ("GET", "/events/{id}", Role::Viewer, false),
    ("POST", "/events/{id}/replay", Role::Operator, false),
    ("GET", "/dead-letters", Role::Viewer, false),
    ("DELETE", "/dead-letters", Role::Operator, false),
    ("POST", "/dead-letters/replay", Role::Operator, false),
    ("POST", "/dead-letters/selection/replay", Role::Operator, false),
    ("POST", "/dead-letters/selection/discard", Role::Operator, false),
    ("GET", "/audit", Role::Viewer, false),
    ("GET", "/overview", Role::Viewer, false),
    ("GET", "/destinations", Role::Viewer, false),
    ("POST", "/destinations/{name}/pause", Role::Operator, true),
    ("POST", "/destinations/{name}/resume", Role::Operator, true),
    // A preview runs the destination's transform on an event: it shows the body.
    ("POST", "/destinations/{name}/preview", Role::Admin, true),
    ("GET", "/hooks", Role::Viewer, false),
    ("POST", "/hooks/sync", Role::Operator, false),
    ("POST", "/reload", Role::Admin, false),
    ("GET", "/backup", Role::Admin, false),
    ("GET", "/destinations/history", Role::Viewer, false),
    ("GET", "/journal", Role::Viewer, false),
];

/// The rule of `method` on `path` (under `/admin`), and the destination its path
/// names when the rule says it does. Unknown routes need the admin role.
pub(crate) fn rule_of<'p>(method: &Method, path: &'p str) -> (Rule, Option<&'p str>) {
    let method = if method == Method::HEAD { "GET" } else { method.as_str() };
    for (m, pattern, role, destination_in_path) in RULES {
        if *m != method {
            continue;
        }
        if let Some(name) = matches(pattern, path) {
            let rule = Rule { role: *role, destination_in_path: *destination_in_path };
            return (rule, if *destination_in_path { name } else { None });
        }
    }
    (Rule { role: Role::Admin, destination_in_path: false }, None)
}

/// Every rule's method and path (tests compare them with the OpenAPI document).
#[cfg(test)]
pub(crate) fn routes() -> impl Iterator<Item = (&'static str, &'static str, Role)> {
    RULES.iter().map(|(m, p, r, _)| (*m, *p, *r))
}

/// Whether `path` has the segments of `pattern`; `Some(Some(x))` with the value of
/// its `{name}` segment, if it has one.
fn matches<'p>(pattern: &str, path: &'p str) -> Option<Option<&'p str>> {
    let mut named = None;
    let mut given = path.trim_end_matches('/').split('/');
    for want in pattern.split('/') {
        let got = given.next()?;
        if want.starts_with('{') {
            if got.is_empty() {
                return None;
            }
            if want == "{name}" {
                named = Some(got);
            }
        } else if want != got {
            return None;
        }
    }
    given.next().is_none().then_some(named)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every operation of the OpenAPI document under `/admin` has a rule of its own,
    /// and every rule is an operation of it: a new route cannot fall back on the
    /// default unseen (`tests/integration/roles.rs` then tries each with every role).
    #[test]
    fn every_route_of_the_api_document_has_a_rule() {
        let document = crate::api::openapi::document();
        let mut documented = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            let Some(under) = path.strip_prefix("/admin") else { continue };
            for method in item.as_object().unwrap().keys() {
                documented.push((method.to_uppercase(), under.to_owned()));
            }
        }
        documented.sort();
        let mut ruled: Vec<(String, String)> =
            routes().map(|(m, p, _)| (m.to_owned(), p.to_owned())).collect();
        ruled.sort();
        assert_eq!(documented, ruled, "the rules and the API document differ");
    }

    #[test]
    fn routes_are_matched_by_segment() {
        let get = Method::GET;
        assert_eq!(rule_of(&get, "/events").0.role, Role::Viewer);
        assert_eq!(rule_of(&get, "/events/0000000000000010").0.role, Role::Viewer);
        assert_eq!(rule_of(&Method::HEAD, "/events").0.role, Role::Viewer);
        assert_eq!(rule_of(&Method::POST, "/events/1/replay").0.role, Role::Operator);
        let (rule, name) = rule_of(&Method::POST, "/destinations/crm/pause");
        assert_eq!((rule.role, name), (Role::Operator, Some("crm")));
        assert_eq!(rule_of(&Method::POST, "/destinations/crm/preview").0.role, Role::Admin);
        // Anything else is closed: the admin role, which then meets the 404 or 405.
        for (method, path) in [
            (Method::GET, "/nowhere"),
            (Method::PUT, "/events"),
            (Method::GET, "/events/1/replay/more"),
            (Method::POST, "/destinations//pause"),
            (Method::DELETE, "/events/1"),
        ] {
            assert_eq!(rule_of(&method, path).0.role, Role::Admin, "{method} {path}");
        }
    }
}
