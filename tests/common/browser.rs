//! A real headless Chromium (Debian's `chromium`), driven over the W3C WebDriver
//! protocol by Debian's `chromedriver`: a few calls spoken with reqwest, so the tests
//! need no WebDriver crate and no browser download. `scripts/test.sh` installs both.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

/// The W3C name of an element reference in JSON.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long a lookup waits for its element to appear.
const WAIT: Duration = Duration::from_secs(10);

/// A browser session; the driver and the browser are killed on drop.
pub struct Browser {
    driver: Child,
    client: reqwest::Client,
    session: String,
    base: String,
    _profile: tempfile::TempDir,
}

/// An element of the current page.
pub struct Element<'b> {
    browser: &'b Browser,
    id: String,
}

impl Browser {
    /// Starts chromedriver on a free port and opens a headless Chromium at 1,440 px.
    pub async fn start() -> Browser {
        for tool in ["chromedriver", "chromium"] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .is_ok_and(|o| o.status.success());
            assert!(found, "{tool} is not installed: run scripts/test.sh (it installs Debian's chromium and chromium-driver)");
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cmd = Command::new("chromedriver");
        cmd.arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let driver = cmd.spawn().expect("start chromedriver");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while client.get(format!("{base}/status")).send().await.is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not answer within 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1440,900", "--no-first-run", "--disable-extensions",
                         "--disable-background-networking", "--disable-sync", "--lang=en-US",
                         format!("--user-data-dir={}", profile.path().display())],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        } } });
        let resp: Value = client
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .expect("new session")
            .json()
            .await
            .unwrap();
        let session = resp["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromedriver refused the session: {resp}"))
            .to_owned();
        Browser { driver, client, session, base, _profile: profile }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.client.request(method.clone(), url);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp: Value = req.send().await.expect("webdriver request").json().await.unwrap();
        resp["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn get(&self, path: &str) -> Value {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        let v = self.post("/url", json!({ "url": url })).await;
        assert!(v.is_null(), "navigating to {url}: {v}");
    }

    /// The current address.
    pub async fn url(&self) -> String {
        self.get("/url").await.as_str().unwrap_or_default().to_owned()
    }

    /// The page's source as the browser holds it now.
    pub async fn source(&self) -> String {
        self.get("/source").await.as_str().unwrap_or_default().to_owned()
    }

    /// Reloads the page.
    pub async fn reload(&self) {
        self.post("/refresh", json!({})).await;
    }

    /// Resizes the window.
    pub async fn resize(&self, width: u32, height: u32) {
        self.post("/window/rect", json!({ "width": width, "height": height })).await;
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and returns its value.
    pub async fn run(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args })).await
    }

    /// Runs an asynchronous `script`, which calls `arguments[arguments.length - 1]`
    /// with its result.
    pub async fn run_async(&self, script: &str, args: Value) -> Value {
        self.post("/timeouts", json!({ "script": 60_000 })).await;
        self.post("/execute/async", json!({ "script": script, "args": args })).await
    }

    /// The first element matching `css`, waiting up to 10 s for it.
    pub async fn find(&self, css: &str) -> Element<'_> {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self.post("/element", json!({ "using": "css selector", "value": css })).await;
            if let Some(id) = v[ELEMENT].as_str() {
                return Element { browser: self, id: id.to_owned() };
            }
            assert!(Instant::now() < deadline, "no element {css:?} within {WAIT:?}: {v}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every element matching `css` now.
    pub async fn find_all(&self, css: &str) -> Vec<Element<'_>> {
        let v = self.post("/elements", json!({ "using": "css selector", "value": css })).await;
        v.as_array()
            .map(|a| a.iter().filter_map(|e| e[ELEMENT].as_str()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|id| Element { browser: self, id: id.to_owned() })
            .collect()
    }

    /// Waits until the text of the page's `main` contains `needle`; returns it.
    pub async fn wait_for_text(&self, needle: &str, timeout: Duration) -> String {
        self.wait_for_text_where(&format!("{needle:?}"), |t| t.contains(needle), timeout).await
    }

    /// Waits until the text of the page's `main` satisfies `shown` (`what` says what
    /// was awaited); returns it.
    pub async fn wait_for_text_where(
        &self,
        what: &str,
        shown: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.find("main").await.text().await;
            if shown(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not shown within {timeout:?}; shown: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the page's address ends with `suffix`. The console changes its
    /// address before it fetches the page's data (`history.pushState`, then the
    /// fetch): text read just after may still be the page the form was on; wait for
    /// the new page's content ([`Browser::wait_for_text_where`]).
    pub async fn wait_for_url(&self, suffix: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let url = self.url().await;
            if url.ends_with(suffix) {
                return;
            }
            assert!(Instant::now() < deadline, "not at …{suffix} within {timeout:?}; at {url}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the button whose text is `label`.
    pub async fn click_button(&self, label: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            for b in self.find_all("button").await {
                if b.text().await.trim() == label && b.displayed().await {
                    b.click().await;
                    return;
                }
            }
            assert!(Instant::now() < deadline, "no button {label:?} within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Accepts the console's confirmation dialog, after checking its question.
    pub async fn confirm(&self, question_contains: &str) -> String {
        let text = self.find("dialog[open] #confirm-text").await.text().await;
        assert!(
            text.contains(question_contains),
            "confirmation {text:?} lacks {question_contains:?}"
        );
        self.find("dialog[open] #confirm-ok").await.click().await;
        text
    }

    /// Writes a PNG of the window to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let b64 = self.get("/screenshot").await;
        let png = base64::engine::general_purpose::STANDARD.decode(b64.as_str().unwrap()).unwrap();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, png).unwrap();
    }

    /// The browser's console messages of level SEVERE (errors) since the last call.
    pub async fn console_errors(&self) -> Vec<String> {
        let v = self.post("/se/log", json!({ "type": "browser" })).await;
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter(|e| e["level"] == "SEVERE")
                    .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every cookie the browser holds for the current page.
    pub async fn cookies(&self) -> Vec<Value> {
        self.get("/cookie").await.as_array().cloned().unwrap_or_default()
    }

    /// Runs axe-core (vendored under tests/vendor) on the page; returns its serious
    /// and critical violations, each as `id: help (targets)`.
    pub async fn accessibility_violations(&self) -> Vec<String> {
        let axe = include_str!("../vendor/axe-core/axe.min.js");
        self.run(&format!("{axe}\n;return true;"), json!([])).await;
        let result = self
            .run_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, { resultTypes: ['violations'] })
                    .then((r) => done(r.violations))
                    .catch((e) => done([{ id: 'axe-error', impact: 'critical', help: String(e), nodes: [] }]));",
                json!([]),
            )
            .await;
        result
            .as_array()
            .expect("axe answered")
            .iter()
            .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
            .map(|v| {
                let targets: Vec<String> = v["nodes"]
                    .as_array()
                    .map(|n| n.iter().map(|n| n["target"].to_string()).collect())
                    .unwrap_or_default();
                format!("{}: {} ({})", v["id"], v["help"], targets.join(", "))
            })
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The driver and the browser it started share its process group.
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Element<'_> {
    fn path(&self, tail: &str) -> String {
        format!("/element/{}{tail}", self.id)
    }

    pub async fn click(&self) {
        let v = self.browser.post(&self.path("/click"), json!({})).await;
        assert!(v.is_null(), "click: {v}");
    }

    /// Types `text` into the element.
    pub async fn type_text(&self, text: &str) {
        let v = self.browser.post(&self.path("/value"), json!({ "text": text })).await;
        assert!(v.is_null(), "typing: {v}");
    }

    /// Empties an input.
    pub async fn clear(&self) {
        self.browser.post(&self.path("/clear"), json!({})).await;
    }

    pub async fn text(&self) -> String {
        self.browser.get(&self.path("/text")).await.as_str().unwrap_or_default().to_owned()
    }

    pub async fn attribute(&self, name: &str) -> Option<String> {
        self.browser
            .get(&self.path(&format!("/attribute/{name}")))
            .await
            .as_str()
            .map(str::to_owned)
    }

    pub async fn displayed(&self) -> bool {
        self.browser.get(&self.path("/displayed")).await.as_bool().unwrap_or(false)
    }
}
