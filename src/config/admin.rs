//! `[admin]`: the private listener, and who may use its API and console: named tokens,
//! each with a role and, for a viewer or an operator, the destinations it is scoped
//! to. The old single `admin.token` is still taken, as the admin named `admin`.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{EnvLookup, Secret, SecretSpec};

/// The private listener: metrics, health and the admin API.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct AdminConfig {
    /// Address of the private listener (`/metrics`, `/healthz`, `/readyz`, `/admin`,
    /// `/console`): keep it private.
    pub(crate) listen: SocketAddr,
    /// Bearer token of the admin API, for the admin named `admin` (`[[admin.tokens]]`
    /// names more, with roles); without any token the admin API refuses every request.
    pub(crate) token: Option<Secret>,
    /// A file holding the admin token (instead of `token`).
    pub(crate) token_file: Option<PathBuf>,
    /// An environment variable holding the admin token (instead of `token`).
    pub(crate) token_env: Option<String>,
    /// Wrong tokens one client (an IPv4 address, an IPv6 /64) may give in a minute,
    /// on the admin API, the console and the pull API together (a pull token, or a
    /// name of no pull destination, counts too); past them it is refused unread
    /// (429) until the minute ends. Raise it for a test tool that probes
    /// authentication on purpose, never for the world.
    pub(crate) wrong_tokens_per_minute: u32,
    /// Named tokens, each with a role: `viewer`, `operator` or `admin`
    /// (docs/security.md, "Roles").
    pub(crate) tokens: Vec<AdminTokenConfig>,
    #[serde(skip)]
    pub(crate) resolved_token: Option<Secret>,
}

/// The default of `admin.wrong_tokens_per_minute`.
pub(crate) const WRONG_TOKENS_PER_MINUTE: u32 = crate::wrong_tokens::PER_ADDRESS;

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8079)),
            token: None,
            token_file: None,
            token_env: None,
            wrong_tokens_per_minute: WRONG_TOKENS_PER_MINUTE,
            tokens: Vec::new(),
            resolved_token: None,
        }
    }
}

/// What a token may do, each role all the one before it may and more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub(crate) enum Role {
    /// Reads everything but the events' bodies and headers.
    #[default]
    Viewer,
    /// A viewer who may also replay, discard, pause, resume and sync hooks.
    Operator,
    /// Everything, bodies and headers included.
    Admin,
}

config_enum!(Role { "viewer" => Viewer, "operator" => Operator, "admin" => Admin });

impl Role {
    /// As the configuration and the API write it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

/// One named token of the admin API and the console.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AdminTokenConfig {
    /// Who holds it: shown to them in the console, and the name the relay's log of
    /// their changes knows them by (A-Z a-z 0-9 _ -).
    pub(crate) name: String,
    /// `viewer` (reads everything but bodies and headers), `operator` (a viewer who
    /// may also replay, discard, pause, resume and sync hooks) or `admin` (everything).
    pub(crate) role: Role,
    /// For a viewer or an operator: the destinations whose deliveries it sees and may
    /// act on (unset: all of them).
    #[serde(default)]
    pub(crate) destinations: Option<Vec<String>>,
    /// The bearer token: at least 16 characters (`openssl rand -hex 24`).
    pub(crate) token: Option<Secret>,
    /// A file holding the token (instead of `token`).
    pub(crate) token_file: Option<PathBuf>,
    /// An environment variable holding the token (instead of `token`).
    pub(crate) token_env: Option<String>,
    #[serde(skip)]
    pub(crate) resolved: Option<Secret>,
}

/// The name `admin.token` is known by.
pub(crate) const ADMIN_NAME: &str = "admin";

impl AdminConfig {
    /// Resolves every token and checks names, roles and scopes against `destinations`
    /// (the configured ones), adding each problem, by key, to `problems`.
    pub(super) fn validate(
        &mut self,
        destinations: &[String],
        env: EnvLookup<'_>,
        problems: &mut Vec<String>,
    ) {
        let spec = SecretSpec {
            inline: self.token.as_ref(),
            file: self.token_file.as_deref(),
            env: self.token_env.as_deref(),
        };
        self.resolved_token = resolve(&spec, "admin.token", env, problems);
        let mut names = HashSet::new();
        if self.resolved_token.is_some() {
            names.insert(ADMIN_NAME.to_owned());
        }
        let mut secrets: Vec<(String, Secret)> =
            self.resolved_token.iter().map(|t| ("admin.token".to_owned(), t.clone())).collect();
        for (i, entry) in self.tokens.iter_mut().enumerate() {
            let key = format!("admin.tokens[{i}]");
            if !super::validate::valid_name(&entry.name) {
                problems.push(format!(
                    "{key}.name: {:?} must be 1 to 64 characters of A-Z a-z 0-9 _ -",
                    entry.name
                ));
            } else if !names.insert(entry.name.clone()) {
                let also =
                    if entry.name == ADMIN_NAME { " (admin.token is named admin)" } else { "" };
                problems.push(format!("{key}.name: {:?} is used twice{also}", entry.name));
            }
            if let Some(scope) = &entry.destinations {
                if entry.role == Role::Admin {
                    problems.push(format!(
                        "{key}.destinations: an admin acts on every destination; scope a viewer \
                         or an operator instead"
                    ));
                }
                if scope.is_empty() {
                    problems.push(format!(
                        "{key}.destinations: empty: name at least one destination, or leave it \
                         out for all of them"
                    ));
                }
                for name in scope.iter().filter(|n| !destinations.contains(n)) {
                    problems.push(format!(
                        "{key}.destinations: {name:?} is not a configured destination (known: {})",
                        destinations.join(", ")
                    ));
                }
            }
            let spec = SecretSpec {
                inline: entry.token.as_ref(),
                file: entry.token_file.as_deref(),
                env: entry.token_env.as_deref(),
            };
            let token_key = format!("{key}.token");
            let resolved = resolve(&spec, &token_key, env, problems);
            let given = spec.inline.is_some() || spec.file.is_some() || spec.env.is_some();
            match &resolved {
                None if !given => problems.push(format!(
                    "{token_key}: missing (give `token`, `token_file` or `token_env`)"
                )),
                None => {}
                Some(token) => {
                    if let Some((other, _)) =
                        secrets.iter().find(|(_, t)| t.expose() == token.expose())
                    {
                        problems.push(format!(
                            "{token_key}: the same as {other}'s: each token must name one holder"
                        ));
                    }
                    secrets.push((key.clone(), token.clone()));
                }
            }
            entry.resolved = resolved;
        }
    }
}

impl AdminConfig {
    /// Every resolved token: `admin.token`'s, then each of `admin.tokens` (after
    /// validation).
    pub(crate) fn resolved_tokens(&self) -> impl Iterator<Item = &Secret> {
        self.resolved_token.iter().chain(self.tokens.iter().filter_map(|t| t.resolved.as_ref()))
    }
}

/// The token `spec` gives, if any, and a problem if it cannot be read or is shorter
/// than a guess takes (as a source token: wrong tokens are only throttled per client).
fn resolve(
    spec: &SecretSpec<'_>,
    key: &str,
    env: EnvLookup<'_>,
    problems: &mut Vec<String>,
) -> Option<Secret> {
    let token = spec.resolve(key, env).map_err(|e| problems.push(e)).ok().flatten()?;
    let min = super::validate::MIN_TOKEN_LEN;
    if token.expose().len() < min {
        problems.push(format!(
            "{key}: too short: at least {min} characters (try `openssl rand -hex 24`)"
        ));
    }
    Some(token)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::{Config, ConfigError};
    use super::*;

    const REST: &str = r#"
[[sources]]
name = "demo"
token = "0123456789abcdef0123"
[[destinations]]
name = "crm"
url = "http://127.0.0.1:9/hooks"
[[destinations]]
name = "erp"
url = "http://127.0.0.1:9/erp"
"#;

    fn load(admin: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hookrelay.toml");
        std::fs::write(&path, format!("{admin}\n{REST}")).unwrap();
        let env: HashMap<String, String> =
            env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        Config::load(&path, &env)
    }

    fn problems(admin: &str) -> Vec<String> {
        match load(admin, &[]) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        }
    }

    #[test]
    fn named_tokens_load_with_their_roles_and_scopes() {
        let config = load(
            r#"
[admin]
token = "the-admin-token-0123456789"
[[admin.tokens]]
name = "helpdesk"
role = "viewer"
token = "helpdesk-token-0123456789"
[[admin.tokens]]
name = "crm-team"
role = "operator"
destinations = ["crm"]
token_env = "CRM_TEAM_TOKEN"
"#,
            &[("CRM_TEAM_TOKEN", "crm-team-token-0123456789")],
        )
        .unwrap();
        let tokens = &config.admin.tokens;
        assert_eq!(tokens.len(), 2);
        assert_eq!((tokens[0].name.as_str(), tokens[0].role), ("helpdesk", Role::Viewer));
        assert_eq!(tokens[1].role, Role::Operator);
        assert_eq!(tokens[1].destinations.as_deref(), Some(&["crm".to_owned()][..]));
        assert_eq!(tokens[1].resolved.as_ref().unwrap().expose(), "crm-team-token-0123456789");
        // Printed, the configuration shows no token.
        let shown = format!("{config:?}");
        assert!(!shown.contains("helpdesk-token-0123456789"), "{shown}");
    }

    /// Every mistake is said, by key, at once; no message holds a token.
    #[test]
    fn wrong_entries_are_each_said_by_key() {
        let p = problems(
            r#"
[admin]
token = "the-admin-token-0123456789"
[[admin.tokens]]
name = "admin"
role = "viewer"
token = "another-token-0123456789"
[[admin.tokens]]
name = "bad name!"
role = "operator"
token = "short"
[[admin.tokens]]
name = "scoped-admin"
role = "admin"
destinations = ["crm"]
token = "scoped-admin-token-0123456789"
[[admin.tokens]]
name = "ghost"
role = "operator"
destinations = ["nowhere"]
token = "the-admin-token-0123456789"
[[admin.tokens]]
name = "empty"
role = "viewer"
destinations = []
"#,
        );
        let want = [
            "admin.tokens[0].name: \"admin\" is used twice (admin.token is named admin)",
            "admin.tokens[1].name: \"bad name!\" must be",
            "admin.tokens[1].token: too short",
            "admin.tokens[2].destinations: an admin acts on every destination",
            "admin.tokens[3].destinations: \"nowhere\" is not a configured destination",
            "admin.tokens[3].token: the same as admin.token's",
            "admin.tokens[4].destinations: empty",
            "admin.tokens[4].token: missing",
        ];
        for w in want {
            assert!(p.iter().any(|p| p.starts_with(w)), "{w:?} not in {p:#?}");
        }
        assert_eq!(p.len(), want.len(), "{p:#?}");
        let all = p.join("\n");
        assert!(!all.contains("0123456789") && !all.contains("short\""), "{all}");
    }

    #[test]
    fn a_role_is_one_of_three_words() {
        let err = load(
            "[[admin.tokens]]\nname = \"x\"\nrole = \"root\"\ntoken = \"x-token-0123456789abc\"",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("\"viewer\" or \"operator\" or \"admin\""), "{err}");
    }
}
