//! The upstream simulator (`hookrelay sim`) as a child process on a loopback port it
//! picks itself, with a small client for its API and controls.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

pub const JSON_API: &str = "application/vnd.api+json";

/// The simulator's users for the tests: two with static tokens, one with an OAuth2
/// refresh token, and the OAuth2 client.
pub const USERS: &str = r#"
[[users]]
name = "alice"
token = "alice-token"
[[users]]
name = "bob"
token = "bob-token"
[[users]]
name = "carol"
refresh_token = "carol-rt-1"
[oauth]
client_id = "relay"
client_secret = "relay-secret"
"#;

/// A running simulator.
pub struct Sim {
    child: Child,
    pub addr: SocketAddr,
    logs: Arc<Mutex<String>>,
    pub client: reqwest::Client,
}

impl Sim {
    /// Writes `config_text` (a simulator TOML) to `dir` and starts `hookrelay sim` on it.
    pub fn start(dir: &Path, config_text: &str) -> Sim {
        let path = dir.join("sim.toml");
        std::fs::write(&path, format!("listen = \"127.0.0.1:0\"\n{config_text}")).unwrap();
        Self::start_args(&["--config", path.to_str().unwrap()])
    }

    /// Starts `hookrelay sim ARGS` (listening on a free port unless ARGS say otherwise).
    pub fn start_args(args: &[&str]) -> Sim {
        let mut cmd = Command::new(super::binary());
        cmd.args(["--log-format", "json", "sim", "--listen", "127.0.0.1:0"]).args(args);
        let mut child = cmd
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start hookrelay sim");
        let (logs, rx) = super::read_logs(child.stderr.take().unwrap());
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((_, addr)) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("simulator did not start; logs:\n{}", logs.lock().unwrap());
            }
        };
        Sim { child, addr, logs, client: super::client() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The API base an account of the relay is configured with.
    pub fn api_base(&self) -> String {
        self.url("/api")
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap().clone()
    }

    /// A request to the resthooks API as `token`; returns status, headers and JSON.
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, reqwest::header::HeaderMap, Value) {
        let mut req = self
            .client
            .request(method, self.url(&format!("/api/rest/resthooks{path}")))
            .header("accept", JSON_API);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.header("content-type", JSON_API).body(body.to_string());
        }
        let r = req.send().await.expect("sim request");
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        let text = r.text().await.unwrap();
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Registers a hook as `token`; returns its id.
    pub async fn create_hook(&self, token: &str, event: &str, target: &str) -> String {
        let body = json!({"resthooks": {"eventName": event, "targetUrl": target}});
        let (status, _, v) = self.api(reqwest::Method::POST, "", Some(token), Some(body)).await;
        assert_eq!(status, 200, "{v}");
        v["resthooks"]["id"].as_str().unwrap().to_owned()
    }

    /// `POST /sim/events`; returns the report.
    pub async fn fire(&self, body: Value) -> Value {
        let r = self.client.post(self.url("/sim/events")).json(&body).send().await.unwrap();
        assert!(r.status().is_success(), "fire: {}", r.status());
        r.json().await.unwrap()
    }

    /// POST or PUT to a `/sim/...` control.
    pub async fn control(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let r = self.client.request(method, self.url(path)).json(&body).send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    /// Every hook of every user (`GET /sim/hooks`).
    pub async fn all_hooks(&self) -> Vec<Value> {
        let v: Value =
            self.client.get(self.url("/sim/hooks")).send().await.unwrap().json().await.unwrap();
        v["resthooks"].as_array().unwrap().clone()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
