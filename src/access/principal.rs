//! Who a request comes from: the holder of one of the admin tokens, with the role the
//! configuration gave it and, for a viewer or an operator, the destinations it is
//! scoped to. The guard puts it in the request; handlers ask it what it may see.

use crate::config::Role;

/// The holder of an admin token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// The token's name (`admin` for `admin.token`).
    pub(crate) name: String,
    pub(crate) role: Role,
    /// The destinations it sees and acts on; `None`: all of them.
    pub(crate) destinations: Option<Vec<String>>,
}

impl Principal {
    /// Whether its role is `needed` or above.
    pub(crate) fn may(&self, needed: Role) -> bool {
        self.role >= needed
    }

    /// Whether it sees (and, as an operator, acts on) the deliveries to `destination`.
    pub(crate) fn sees(&self, destination: &str) -> bool {
        self.destinations.as_ref().is_none_or(|d| d.iter().any(|n| n == destination))
    }

    /// Whether it sees events' bodies and headers (the admin role only: they hold the
    /// firm's client data).
    pub(crate) fn sees_bodies(&self) -> bool {
        self.may(Role::Admin)
    }

    /// 403 when it may not act on `destination`, with what to do.
    pub(crate) fn refuse_destination(&self, destination: &str) -> Option<String> {
        (!self.sees(destination)).then(|| {
            format!(
                "token {:?} is scoped to destination(s) {}; {destination:?} is not one of them \
                 (admin.tokens[].destinations)",
                self.name,
                self.destinations.as_deref().unwrap_or_default().join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(role: Role, destinations: Option<&[&str]>) -> Principal {
        Principal {
            name: "t".into(),
            role,
            destinations: destinations.map(|d| d.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    #[test]
    fn each_role_may_what_the_one_below_may_and_more() {
        let (v, o, a) = (Role::Viewer, Role::Operator, Role::Admin);
        assert!(holder(v, None).may(v) && !holder(v, None).may(o) && !holder(v, None).may(a));
        assert!(holder(o, None).may(v) && holder(o, None).may(o) && !holder(o, None).may(a));
        assert!(holder(a, None).may(v) && holder(a, None).may(o) && holder(a, None).may(a));
        assert!(!holder(o, None).sees_bodies() && holder(a, None).sees_bodies());
    }

    #[test]
    fn a_scope_names_what_it_sees() {
        let crm = holder(Role::Operator, Some(&["crm"]));
        assert!(crm.sees("crm") && !crm.sees("erp") && !crm.sees("crm2"));
        assert!(crm.refuse_destination("crm").is_none());
        let why = crm.refuse_destination("erp").unwrap();
        assert!(why.contains("scoped to destination(s) crm") && why.contains("\"erp\""), "{why}");
        assert!(holder(Role::Viewer, None).sees("anything"));
    }
}
