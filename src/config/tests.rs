use std::collections::HashMap;
use std::time::Duration;

use super::validate::{is_example, MIN_TOKEN_LEN};
use super::*;

const SOURCE: &str = r#"
[[sources]]
name = "demo"
token = "0123456789abcdef0123"
"#;

fn write(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, text);
    let env: HashMap<String, String> =
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::load(&path, &env)
}

fn problems(text: &str, env: &[(&str, &str)]) -> Vec<String> {
    match load(text, env) {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected validation problems, got {other:?}"),
    }
}

fn load_error(text: &str, env: &[(&str, &str)]) -> String {
    match load(text, env) {
        Err(e @ ConfigError::Load { .. }) => e.to_string(),
        other => panic!("expected a load error, got {other:?}"),
    }
}

#[test]
fn an_empty_file_gives_the_documented_defaults() {
    let c = load("", &[]).unwrap();
    assert_eq!(c.ingress.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.ingress.max_body_bytes, 10 * 1024 * 1024);
    assert_eq!(c.admin.listen.to_string(), "127.0.0.1:8079");
    assert!(c.admin.resolved_token.is_none());
    assert_eq!(c.storage.data_dir, PathBuf::from("./data"));
    assert_eq!(c.storage.durability, Durability::Durable);
    assert_eq!(c.shutdown.grace, Duration::from_secs(10));
    assert_eq!(c.log.format, LogFormat::Text);
    assert!(c.sources.is_empty());
}

#[test]
fn the_shipped_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_PATH);
    let c = Config::load(&path, &HashMap::new()).unwrap();
    assert_eq!(c.sources.len(), 1);
    assert_eq!(c.sources[0].name, "demo");
    assert!(c.sources[0].resolved_token.is_some());
    assert!(c.admin.resolved_token.is_some());
}

#[test]
fn environment_overrides_the_file() {
    let text = format!("[ingress]\nmax_body_bytes = 100\n[storage]\ndata_dir = \"/a\"\n{SOURCE}");
    let c = load(
        &text,
        &[
            ("HOOKRELAY__INGRESS__MAX_BODY_BYTES", "2048"),
            ("HOOKRELAY__STORAGE__DATA_DIR", "/var/lib/hookrelay"),
            ("HOOKRELAY__STORAGE__DURABILITY", "buffered"),
            ("HOOKRELAY__SHUTDOWN__GRACE", "1500ms"),
            ("HOOKRELAY__ADMIN__TOKEN", "12345678901234567890123"),
            ("HOOKRELAY_UNRELATED", "x"),
        ],
    )
    .unwrap();
    assert_eq!(c.ingress.max_body_bytes, 2048);
    assert_eq!(c.storage.data_dir, PathBuf::from("/var/lib/hookrelay"));
    assert_eq!(c.storage.durability, Durability::Buffered);
    assert_eq!(c.shutdown.grace, Duration::from_millis(1500));
    // A long numeric token must survive as text, digit for digit.
    assert_eq!(c.admin.resolved_token.unwrap().expose(), "12345678901234567890123");
}

#[test]
fn unknown_keys_are_errors() {
    let err = load_error("[ingress]\nlisten_addr = \"0.0.0.0:1\"\n", &[]);
    assert!(err.contains("unknown field `listen_addr`"), "{err}");
    let err = load_error("[storage]\ndurabilty = \"durable\"\n", &[]);
    assert!(err.contains("durabilty"), "{err}");
    let err = load_error("", &[("HOOKRELAY__INGRESS__LISTN", "0.0.0.0:1")]);
    assert!(err.contains("listn"), "{err}");
    let err = load_error("[nonsense]\na = 1\n", &[]);
    assert!(err.contains("nonsense"), "{err}");
}

#[test]
fn type_errors_name_the_key() {
    let err = load_error("[ingress]\nlisten = \"localhost\"\n", &[]);
    assert!(err.contains("ingress.listen"), "{err}");
    let err = load_error("[shutdown]\ngrace = \"soon\"\n", &[]);
    assert!(err.contains("shutdown.grace") && err.contains("expected a duration"), "{err}");
    let err = load_error("[storage]\ndurability = \"maybe\"\n", &[]);
    assert!(err.contains("storage.durability") && err.contains("buffered"), "{err}");
    let err = load_error("[ingress]\nmax_body_bytes = -1\n", &[]);
    assert!(err.contains("ingress.max_body_bytes"), "{err}");
}

#[test]
fn every_validation_problem_is_reported_by_key() {
    let text = r#"
[ingress]
listen = "127.0.0.1:7000"
max_body_bytes = 0
[admin]
listen = "127.0.0.1:7000"
token = "a"
token_env = "B"
[storage]
data_dir = ""
commit_max_batch = 0
flush_interval = "0s"
min_free_percent = 60.0
write_timeout = "0s"
[shutdown]
grace = "0s"
[retention]
audit = "12h"
[log]
level = "hookrelay=loud"
[[sources]]
name = "bad name"
token = "0123456789abcdef0123"
[[sources]]
name = "twice"
token = "short"
[[sources]]
name = "twice"
token = "has/slash/0123456789"
[[sources]]
name = "notoken"
[[sources]]
name = "fromfile"
token_file = "/nonexistent/hookrelay-token"
"#;
    let p = problems(text, &[]);
    let expect = [
        "ingress.max_body_bytes: must be between 1",
        "admin.listen: must differ from ingress.listen",
        "admin.token: give only one of `token`, `token_file`, `token_env`",
        "storage.data_dir: must not be empty",
        "storage.commit_max_batch: must be between 1 and 10000",
        "storage.min_free_percent: must be between 0 and 50",
        "storage.write_timeout: must be between 1s and 10m",
        "storage.flush_interval: must be greater than 0",
        "shutdown.grace: must be greater than 0",
        "retention.audit: 12h is less than a day",
        "log.level:",
        "sources[0].name: \"bad name\" must be 1 to 64 characters",
        "sources[1].token: too short",
        "sources[2].name: \"twice\" is used twice",
        "sources[2].token: may contain only",
        "sources[3].token: missing",
        "sources[4].token_file: cannot read /nonexistent/hookrelay-token",
    ];
    for e in expect {
        assert!(p.iter().any(|x| x.starts_with(e)), "missing {e:?} in {p:#?}");
    }
    assert_eq!(p.len(), expect.len(), "{p:#?}");
}

#[test]
fn secrets_come_from_files_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admin.token");
    std::fs::write(&file, "admin-token-from-a-file\n").unwrap();
    let text = format!(
        "[admin]\ntoken_file = {:?}\n[[sources]]\nname = \"a\"\ntoken_env = \"A_TOKEN\"\n",
        file.display().to_string()
    );
    let c = load(&text, &[("A_TOKEN", "source-token-from-env")]).unwrap();
    assert_eq!(c.admin.resolved_token.unwrap().expose(), "admin-token-from-a-file");
    assert_eq!(c.sources[0].resolved_token.as_ref().unwrap().expose(), "source-token-from-env");
}

#[test]
fn masked_output_shows_no_secret() {
    let text = format!("[admin]\ntoken = \"very-secret-admin-token\"\n{SOURCE}");
    let c = load(&text, &[]).unwrap();
    let shown = c.to_masked_toml();
    assert!(!shown.contains("very-secret-admin-token"), "{shown}");
    assert!(!shown.contains("0123456789abcdef0123"), "{shown}");
    assert!(shown.contains(secret::MASK), "{shown}");
    assert!(shown.contains("name = \"demo\""), "{shown}");
    assert!(shown.contains("grace = \"10s\""), "{shown}");
    // What is printed can be read back.
    let back: Config = toml::from_str(&shown).unwrap();
    assert_eq!(back.shutdown.grace, Duration::from_secs(10));
}

#[test]
fn a_missing_file_says_so() {
    let err = Config::load(Path::new("/nonexistent/h.toml"), &HashMap::new()).unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[test]
fn destinations_get_defaults_and_overrides() {
    let text = format!(
        r#"{SOURCE}
[delivery]
timeout = "5s"
[delivery.retry]
max_attempts = 7
[[destinations]]
name = "crm"
url = "https://crm.example.com/hooks?key=x"
events = ["Action*"]
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
rate_limit = 20
[destinations.headers]
x-api-key = "abc"
[destinations.retry]
initial_backoff = "250ms"
[[destinations]]
name = "all"
url = "http://10.0.0.1:9000/in"
max_concurrency = 2
"#
    );
    let c = load(&text, &[]).unwrap();
    let crm = &c.destinations[0];
    assert_eq!(crm.sources, ["*"]);
    assert_eq!(crm.events, ["Action*"]);
    let retry = crm.retry_policy(&c.delivery.retry);
    assert_eq!(retry.initial_backoff, Duration::from_millis(250));
    assert_eq!(retry.max_attempts, 7, "inherited from [delivery.retry]");
    assert_eq!(retry.max_backoff, Duration::from_secs(600));
    assert!(crm.resolved_secret.is_some());
    let all = &c.destinations[1];
    assert_eq!((all.max_concurrency, all.timeout), (Some(2), None));
    assert_eq!(c.delivery.timeout, Duration::from_secs(5));
    assert_eq!(c.sources[0].dedup_window, Duration::from_secs(600));
    assert_eq!(c.sources[0].dedup_pointers, ["/data"]);
    let shown = c.to_masked_toml();
    assert!(!shown.contains("MfKQ9r8"), "{shown}");
}

#[test]
fn destination_problems_are_reported_by_key() {
    let text = format!(
        r#"{SOURCE}
dedup_pointers = ["data"]
[delivery.retry]
backoff_multiplier = 0.5
retryable_statuses = [503]
[[destinations]]
name = "a"
url = "ftp://example.com/x"
sources = ["nosuch"]
events = ["ActionCreatd"]
secret = "not-whsec"
rate_limit = 0
ordering = "per-resource"
[destinations.headers]
webhook-id = "x"
[destinations.retry]
max_attempts = 0
[[destinations]]
name = "a"
url = "relative/path"
secret = "whsec_c2hvcnQ="
rate_limit = 1e-300
"#
    );
    let p = problems(&text, &[]);
    let expect = [
        "sources[0].dedup_pointers[0]: \"data\" is not a JSON pointer",
        "delivery.retry.backoff_multiplier: must be between 1 and 100",
        "delivery.retry.retryable_statuses: 503 is not a 4xx status",
        "destinations[0].url: \"ftp://example.com/x\" is not an absolute http(s) URL",
        "destinations[0].headers.webhook-id: set by the relay",
        "destinations[0].sources[0]: no source is named \"nosuch\"",
        "destinations[0].events[0]: \"ActionCreatd\" is not an upstream event name; did you mean \"ActionCreated\"?",
        "destinations[0].rate_limit: must be a positive number",
        "destinations[0].retry.max_attempts: must be at least 1",
        "destinations[0].secret: must start with `whsec_`",
        "destinations[1].name: \"a\" is used twice",
        "destinations[1].url: \"relative/path\" is not an absolute http(s) URL",
        "destinations[1].secret: key too short",
        "destinations[1].rate_limit: must be a positive number of requests per second, at least one an hour",
    ];
    for e in expect {
        assert!(p.iter().any(|x| x.starts_with(e)), "missing {e:?} in {p:#?}");
    }
    // Inherited retry problems are reported again for a destination with its own `retry`.
    assert!(p.len() >= expect.len(), "{p:#?}");
    assert!(p.iter().all(|x| !x.contains("not-whsec")), "secrets are never echoed: {p:#?}");
}

#[test]
fn the_local_loop_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/local-loop.toml");
    let c = Config::load(&path, &HashMap::new()).unwrap();
    assert_eq!(c.sources[0].accounts.len(), 2);
    assert_eq!(c.upstream.public_url.as_deref(), Some("http://127.0.0.1:8080"));
}

#[test]
fn upstream_accounts_resolve_their_credentials() {
    let text = format!(
        r#"
[upstream]
public_url = "https://relay.example.com/"
{SOURCE}
events = ["ActionCreated", "TaskCreated"]
[[sources.accounts]]
name = "alice"
api_base = "https://api.example.com/api"
token_env = "ALICE_TOKEN"
[[sources.accounts]]
name = "bob"
events = ["StepChanged"]
prune = true
[sources.accounts.oauth]
token_url = "https://auth.example.com/oauth/token"
client_id = "relay"
client_secret = "cs-secret-value"
refresh_token_env = "BOB_RT"
"#
    );
    let c = load(&text, &[("ALICE_TOKEN", "alice-secret"), ("BOB_RT", "bob-rt-secret")]).unwrap();
    let source = &c.sources[0];
    let (alice, bob) = (&source.accounts[0], &source.accounts[1]);
    assert_eq!(alice.events(source), ["ActionCreated", "TaskCreated"]);
    assert_eq!(bob.events(source), ["StepChanged"]);
    assert!(
        matches!(&alice.resolved, Some(AccountAuth::Static(t)) if t.expose() == "alice-secret")
    );
    assert!(
        matches!(&bob.resolved, Some(AccountAuth::OAuth { refresh_token, .. }) if refresh_token.expose() == "bob-rt-secret")
    );
    assert_eq!(c.upstream.reconcile_interval, Duration::from_secs(60));
    let shown = c.to_masked_toml();
    assert!(!shown.contains("cs-secret-value") && !shown.contains("alice-secret"), "{shown}");
}

#[test]
fn upstream_mistakes_are_reported_by_key() {
    let text = format!(
        r#"
{SOURCE}
events = ["ActionMoved", "TaskCreated", "TaskCreated"]
[[sources.accounts]]
name = "alice"
token = "t"
page_size = 500
[[sources.accounts]]
name = "alice"
api_base = "not a url"
[[sources.accounts]]
name = "carol"
api_base = "https://api.example.com/api"
token = "t"
[sources.accounts.oauth]
token_url = "https://auth.example.com/token"
client_id = "relay"
"#
    );
    let p = problems(&text, &[]);
    let expect = [
        "upstream.public_url: missing",
        "sources[0].events[0]: \"ActionMoved\" is not one of",
        "sources[0].events: \"TaskCreated\" is listed twice",
        "sources[0].accounts[0].api_base: missing",
        "sources[0].accounts[0].page_size: must be between 1 and 200",
        "sources[0].accounts[1].name: \"alice\" is used twice",
        "sources[0].accounts[1].api_base: \"not a url\" is not an absolute",
        "sources[0].accounts[1]: no credentials",
        "sources[0].accounts[2]: give either a token or `oauth`, not both",
    ];
    // A mistyped name is answered with the valid ones.
    let moved = p.iter().find(|x| x.contains("\"ActionMoved\"")).unwrap();
    assert!(
        moved.contains("they are: ActionCreated, ActionUpdated,")
            && moved.contains("TimeEntryUpdated"),
        "{moved}"
    );
    for needle in expect {
        assert!(p.iter().any(|x| x.starts_with(needle)), "no {needle:?} in {p:#?}");
    }
}

#[test]
fn an_oauth_account_needs_its_secrets() {
    let text = format!(
        r#"
[upstream]
public_url = "https://relay.example.com"
{SOURCE}
events = ["TaskCreated"]
[[sources.accounts]]
name = "bob"
[sources.accounts.oauth]
token_url = "https://auth.example.com/token"
client_id = "relay"
"#
    );
    let p = problems(&text, &[]);
    assert!(
        p.iter().any(|x| x.starts_with("sources[0].accounts[0].oauth.client_secret: missing")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|x| x.starts_with("sources[0].accounts[0].oauth.refresh_token: missing")),
        "{p:?}"
    );
}

/// Safe by default: the repository's example tokens are fine on loopback, refused on
/// a listener other machines reach, each with what to do; the shipped file is valid
/// as it is (the quick start).
#[test]
fn example_tokens_are_refused_on_a_listener_other_machines_reach() {
    let example = r#"
[admin]
token = "change-me-admin-token"

[[sources]]
name = "demo"
token = "demo-token-change-me"
"#;
    assert!(load(example, &[]).is_ok(), "loopback by default: the examples are fine");
    let p = problems(example, &[("HOOKRELAY__INGRESS__LISTEN", "0.0.0.0:8080")]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("sources[0].token: is the example token"), "{p:?}");
    assert!(p[0].contains("0.0.0.0:8080") && p[0].contains("openssl rand"), "{p:?}");
    assert!(!p[0].contains("demo-token-change-me"), "the message never holds the token");
    let p = problems(example, &[("HOOKRELAY__ADMIN__LISTEN", "[::]:8079")]);
    assert!(p.len() == 1 && p[0].starts_with("admin.token: is the example token"), "{p:?}");
    // The operator's own tokens: fine anywhere.
    let own = example
        .replace("demo-token-change-me", "k3J9xQ2vL8mN4pR7sT1wY6zA")
        .replace("change-me-admin-token", "a9F2kL7pQ4xZ8mN3vB6cR1tY");
    let env = [
        ("HOOKRELAY__INGRESS__LISTEN", "0.0.0.0:8080"),
        ("HOOKRELAY__ADMIN__LISTEN", "0.0.0.0:8079"),
    ];
    assert!(load(&own, &env).is_ok());
    let shipped = std::fs::read_to_string("config/hookrelay.toml").unwrap();
    assert!(load(&shipped, &[]).is_ok(), "the quick start's config");
    assert!(!problems(&shipped, &env).is_empty(), "the quick start's config, exposed");
}

/// Every token the repository publishes (config/, deploy/, docs/, the README) is
/// refused on a listener other machines reach: either the example check knows it, or
/// it is too short to be a token at all. Read from the files, so that a new example
/// cannot slip past the list.
#[test]
fn every_published_token_is_refused_on_a_public_listener() {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut paths = vec![std::path::PathBuf::from("README.md")];
    for dir in ["config", "deploy", "docs"] {
        files(std::path::Path::new(dir), &mut paths);
    }
    let mut found = Vec::new();
    for path in paths {
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        for line in text.lines() {
            // `token = "..."` (TOML) and `..._TOKEN: ...` (a Kubernetes Secret, env).
            let lower = line.to_ascii_lowercase();
            let Some(at) = lower.find("token") else { continue };
            let rest = &line[at + 5..];
            let key_end = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
            let key_tail = &rest[..rest.len() - key_end.len()].to_ascii_lowercase();
            // `token_env`, `token_file`, `token_url`: a name or a path, not a token.
            if ["_env", "_file", "_url", "_path"].iter().any(|s| key_tail.ends_with(s)) {
                continue;
            }
            let Some(value) = key_end.trim_start().strip_prefix(['=', ':']) else {
                continue;
            };
            let value = value.trim().trim_matches(['"', '\'']);
            let value: String = value
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "-_.~".contains(*c))
                .collect();
            if value.len() >= 4 {
                found.push((path.display().to_string(), value));
            }
        }
    }
    assert!(found.iter().any(|(p, _)| p.contains("secret.example.yaml")), "{found:?}");
    for (path, token) in &found {
        assert!(
            token.len() < MIN_TOKEN_LEN || is_example(token),
            "{path}: {token:?} is published and would be accepted on a public listener"
        );
    }
}

#[test]
fn a_short_admin_token_is_refused() {
    let p = problems(&format!("[admin]\ntoken = \"short-token\"\n{SOURCE}"), &[]);
    assert!(p.iter().any(|p| p.starts_with("admin.token: too short: at least 16")), "{p:?}");
    assert!(!p.iter().any(|p| p.contains("short-token")), "the message never holds it");
}

#[test]
fn a_memory_limit_sizes_redb() {
    // Where it cannot hold (sled, below the floor), the store says so (`store::settle`).
    let redb = format!("[storage]\nbackend = \"redb\"\nmemory_limit_bytes = 268435456\n{SOURCE}");
    let config = load(&redb, &[]).unwrap();
    assert_eq!(config.storage.engine_cache_bytes(), (256 - 112) << 20);
    // Without it, the cache is cache_capacity_bytes.
    let plain = load(&format!("[storage]\nbackend = \"redb\"\n{SOURCE}"), &[]).unwrap();
    assert_eq!(plain.storage.engine_cache_bytes(), 64 << 20);
}
