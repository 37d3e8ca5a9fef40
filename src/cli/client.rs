//! The admin API as the CLI sees it: where it is, the token, JSON in and out.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::config::Config;

/// A client for one relay's admin API.
pub(super) struct AdminClient {
    base: String,
    token: Option<String>,
    /// Where the token came from, for the hint on a refusal.
    token_from: &'static str,
    http: reqwest::Client,
}

impl AdminClient {
    /// `url` overrides the config's `admin.listen`; `token` overrides `admin.token`.
    pub(super) fn new(
        config: Option<&Config>,
        url: Option<String>,
        token: Option<String>,
    ) -> anyhow::Result<Self> {
        let base = match (url, config) {
            (Some(url), _) => url.trim_end_matches('/').to_owned(),
            (None, Some(c)) => {
                let addr = reachable(c.admin.listen);
                if addr.port() == 0 {
                    bail!("admin.listen has port 0 (picked at start-up): give --admin-url");
                }
                format!("http://{addr}")
            }
            (None, None) => bail!("no admin URL: give --admin-url or a readable --config"),
        };
        let (token, token_from) = match token {
            Some(t) => (Some(t), "--admin-token or HOOKRELAY_ADMIN_TOKEN"),
            None => (
                config.and_then(|c| c.admin.resolved_token.as_ref()).map(|t| t.expose().to_owned()),
                "admin.token of --config (with this shell's HOOKRELAY__ADMIN__TOKEN, if set)",
            ),
        };
        let http = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(60))
            .build()
            .context("building the HTTP client")?;
        Ok(Self { base, token, token_from, http })
    }

    pub(super) async fn get(&self, path_and_query: &str) -> anyhow::Result<Value> {
        self.send(self.http.get(format!("{}{path_and_query}", self.base))).await
    }

    pub(super) async fn post(
        &self,
        path_and_query: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self.http.post(format!("{}{path_and_query}", self.base));
        if let Some(body) = body {
            req = req.json(&body);
        }
        self.send(req).await
    }

    /// GETs `path` and writes the body to `out` as it comes (a backup: no total
    /// timeout, only one between two reads); returns the bytes written.
    pub(super) async fn download(
        &self,
        path: &str,
        out: &mut (impl std::io::Write + ?Sized),
    ) -> anyhow::Result<u64> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(std::time::Duration::from_secs(120))
            .build()
            .context("building the HTTP client")?;
        let mut req = http.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let mut resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the admin API at {}", self.base))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            bail!(
                "the admin API answered {status}: {}",
                body["error"].as_str().unwrap_or("no details")
            );
        }
        let mut written = 0u64;
        while let Some(chunk) =
            resp.chunk().await.context("the backup's stream broke off: take it again")?
        {
            out.write_all(&chunk).context("writing the backup")?;
            written += chunk.len() as u64;
        }
        Ok(written)
    }

    pub(super) async fn delete(&self, path_and_query: &str) -> anyhow::Result<Value> {
        self.send(self.http.delete(format!("{}{path_and_query}", self.base))).await
    }

    async fn send(&self, mut req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("cannot reach the admin API at {}", self.base))?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = body["error"].as_str().unwrap_or("no details");
            if status == reqwest::StatusCode::UNAUTHORIZED {
                let sent = if self.token.is_some() {
                    "the token sent came from"
                } else {
                    "no token was found in"
                };
                bail!(
                    "the admin API answered {status}: {message}. {sent} {}; the relay may run \
                     with another one (HOOKRELAY__ADMIN__TOKEN in the relay's environment \
                     overrides admin.token in its file): give the relay's with \
                     HOOKRELAY_ADMIN_TOKEN=... or --admin-token",
                    self.token_from
                );
            }
            bail!("the admin API answered {status}: {message}");
        }
        Ok(body)
    }
}

/// A listener on 0.0.0.0 / [::] is reached on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(std::net::Ipv6Addr::LOCALHOST.into(), addr.port())
        }
        _ => addr,
    }
}

/// `?a=1&b=2` from the given pairs (values percent-encoded), or "" if none is set.
pub(super) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'*' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_encode_values_and_skip_unset_ones() {
        assert_eq!(query(&[("a", None)]), "");
        assert_eq!(
            query(&[
                ("source", Some("demo".into())),
                ("x", None),
                ("event", Some("Action*".into())),
                ("q", Some("a b&c".into()))
            ]),
            "?source=demo&event=Action*&q=a%20b%26c"
        );
    }

    #[test]
    fn unspecified_listen_addresses_become_loopback() {
        assert_eq!(reachable("0.0.0.0:8079".parse().unwrap()).to_string(), "127.0.0.1:8079");
        assert_eq!(reachable("10.1.2.3:8079".parse().unwrap()).to_string(), "10.1.2.3:8079");
    }
}
