//! Whole-config checks. Every problem names its key (`sources[1].name: ...`), and all
//! of them are reported at once.

use std::collections::HashSet;

use super::{Config, EnvLookup, SecretSpec};

/// Source names appear in URLs and metric labels: keep them short and plain.
const MAX_SOURCE_NAME: usize = 64;
/// Tokens are the only thing that authenticates a callback: refuse guessable ones.
pub(crate) const MIN_TOKEN_LEN: usize = 16;
const MAX_BODY_LIMIT: u64 = 1024 * 1024 * 1024;

impl Config {
    /// Resolves every secret and checks every value, collecting all problems.
    pub(crate) fn validate(&mut self, env: EnvLookup<'_>) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();

        if self.ingress.max_body_bytes == 0 || self.ingress.max_body_bytes > MAX_BODY_LIMIT {
            problems.push(format!(
                "ingress.max_body_bytes: must be between 1 and {MAX_BODY_LIMIT} (1 GiB)"
            ));
        }
        // Port 0 ("pick a free port") is fine for both.
        if self.ingress.listen == self.admin.listen && self.ingress.listen.port() != 0 {
            problems.push(format!(
                "admin.listen: must differ from ingress.listen ({})",
                self.ingress.listen
            ));
        }

        let admin = &self.admin;
        let spec = SecretSpec {
            inline: admin.token.as_ref(),
            file: admin.token_file.as_deref(),
            env: admin.token_env.as_deref(),
        };
        match spec.resolve("admin.token", env) {
            Ok(token) => self.admin.resolved_token = token,
            Err(e) => problems.push(e),
        }

        if self.storage.data_dir.as_os_str().is_empty() {
            problems.push("storage.data_dir: must not be empty".into());
        }
        if !(1..=10_000).contains(&self.storage.commit_max_batch) {
            problems.push("storage.commit_max_batch: must be between 1 and 10000".into());
        }
        if self.storage.flush_interval.is_zero() {
            problems.push("storage.flush_interval: must be greater than 0".into());
        }
        if self.shutdown.grace.is_zero() {
            problems.push("shutdown.grace: must be greater than 0".into());
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            problems.push(format!("log.level: {e} (try \"info\" or \"hookrelay=debug\")"));
        }

        let mut names = HashSet::new();
        for (i, source) in self.sources.iter_mut().enumerate() {
            let key = format!("sources[{i}]");
            if !valid_name(&source.name) {
                problems.push(format!(
                    "{key}.name: {:?} must be 1 to {MAX_SOURCE_NAME} characters of \
                     A-Z a-z 0-9 _ -",
                    source.name
                ));
            } else if !names.insert(source.name.clone()) {
                problems.push(format!("{key}.name: {:?} is used twice", source.name));
            }
            let spec = SecretSpec {
                inline: source.token.as_ref(),
                file: source.token_file.as_deref(),
                env: source.token_env.as_deref(),
            };
            match spec.resolve(&format!("{key}.token"), env) {
                Ok(None) => problems.push(format!(
                    "{key}.token: missing (give `token`, `token_file` or `token_env`)"
                )),
                Ok(Some(token)) => {
                    if let Err(e) = check_url_token(token.expose()) {
                        problems.push(format!("{key}.token: {e}"));
                    }
                    source.resolved_token = Some(token);
                }
                Err(e) => problems.push(e),
            }
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

fn valid_name(name: &str) -> bool {
    (1..=MAX_SOURCE_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A source token is a URL path segment the upstream stores verbatim in `targetUrl`.
/// The message describes the problem, never the token.
fn check_url_token(token: &str) -> Result<(), String> {
    if token.len() < MIN_TOKEN_LEN {
        return Err(format!(
            "too short: at least {MIN_TOKEN_LEN} characters (try `openssl rand -hex 24`)"
        ));
    }
    let url_safe = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~');
    if !token.bytes().all(url_safe) {
        return Err("may contain only A-Z a-z 0-9 - _ . ~ (it is part of a URL)".into());
    }
    Ok(())
}
