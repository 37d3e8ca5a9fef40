//! The deployment files, checked by the tools that own their formats: systemd-analyze
//! (verify, security), kubernetes-validate, checkov, hadolint; and kept consistent with
//! the binary (flags, config) and with each other (alert rules, grace periods).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} not found ({e}): scripts/test.sh installs it"))
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The unit, with `ExecStart` pointing at the binary under test (systemd-analyze
/// verify checks that the command exists), in a temporary directory.
fn unit_for_test(dir: &Path) -> PathBuf {
    let unit = read("deploy/systemd/hookrelay.service")
        .replace("/usr/local/bin/hookrelay", common::binary());
    let path = dir.join("hookrelay.service");
    std::fs::write(&path, unit).unwrap();
    path
}

/// `--flags` of a command line, and the values of `--config`.
fn flags(args: &[&str]) -> Vec<String> {
    args.iter()
        .filter(|a| a.starts_with("--"))
        .map(|a| a.split('=').next().unwrap().to_owned())
        .collect()
}

/// Every flag must be one `hookrelay serve --help` documents.
fn assert_serve_accepts(what: &str, args: &[&str]) {
    assert_eq!(args.first(), Some(&"serve"), "{what}: {args:?}");
    let help = run(common::binary(), &["serve", "--help"]);
    let help = text(&help);
    for flag in flags(args) {
        assert!(help.contains(&flag), "{what}: `hookrelay serve --help` has no {flag}");
    }
}

#[test]
fn the_systemd_unit_verifies_and_scores_ok_on_security() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_for_test(dir.path());
    let unit = unit.to_str().unwrap();
    let out = run("systemd-analyze", &["verify", unit]);
    assert!(
        out.status.success() && text(&out).trim().is_empty(),
        "systemd-analyze verify: {}",
        text(&out)
    );

    let out = run("systemd-analyze", &["security", "--offline=yes", "--no-pager", unit]);
    let report = text(&out);
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no score in:\n{report}"));
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unreadable score: {line}"));
    // AttemptWrite next to the test binaries, and printed with --nocapture.
    eprintln!("systemd-analyze security: {line}");
    std::fs::write(
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("systemd-security-score.txt"),
        format!("{score}\n"),
    )
    .unwrap();
    assert!(score <= 2.5, "exposure {score} > 2.5:\n{report}");
}

#[test]
fn the_socket_unit_verifies_and_holds_both_listeners_in_order() {
    let dir = tempfile::tempdir().unwrap();
    unit_for_test(dir.path());
    let socket = read("deploy/systemd/hookrelay.socket");
    let path = dir.path().join("hookrelay.socket");
    std::fs::write(&path, &socket).unwrap();
    let out = run("systemd-analyze", &["verify", path.to_str().unwrap()]);
    assert!(
        out.status.success() && text(&out).trim().is_empty(),
        "systemd-analyze verify: {}",
        text(&out)
    );
    // The ingress first, the admin listener second: the order the relay reads them in.
    let listens: Vec<&str> =
        socket.lines().filter_map(|l| l.strip_prefix("ListenStream=")).collect();
    assert_eq!(listens, ["0.0.0.0:8080", "127.0.0.1:8079"]);
    assert!(socket.lines().any(|l| l == "Backlog=4096"));
}

#[test]
fn the_systemd_unit_runs_the_binary_as_documented() {
    let unit = read("deploy/systemd/hookrelay.service");
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let args: Vec<&str> = exec.split_whitespace().skip(1).collect();
    assert_serve_accepts("ExecStart", &args);
    assert!(exec.contains("--config /etc/hookrelay/hookrelay.toml"), "{exec}");
    for line in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DynamicUser=yes",
        "StateDirectory=hookrelay",
        "Restart=on-failure",
        "EnvironmentFile=-/etc/hookrelay/hookrelay.env",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
    ] {
        assert!(unit.lines().any(|l| l == line), "missing {line}");
    }
    // TimeoutStopSec above the default shutdown.grace (10s), so SIGTERM can drain.
    let stop: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.trim_end_matches('s').parse().ok())
        .expect("TimeoutStopSec=Ns");
    assert!(stop > 10, "TimeoutStopSec={stop}");
}

/// The Kubernetes manifests: every file of the base, and the examples.
fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("deploy/kubernetes/base"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    files.sort();
    files
}

#[test]
fn the_kustomize_base_lists_every_manifest_and_only_existing_ones() {
    let kustomization = read("deploy/kubernetes/base/kustomization.yaml");
    let listed: Vec<&str> = kustomization
        .lines()
        .skip_while(|l| !l.starts_with("resources:"))
        .skip(1)
        .map_while(|l| l.trim().strip_prefix("- "))
        .collect();
    assert!(listed.len() >= 9, "{listed:?}");
    for file in &listed {
        assert!(
            Path::new(ROOT).join("deploy/kubernetes/base").join(file).is_file(),
            "{file} listed but missing"
        );
    }
    for path in manifests() {
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(
            listed.contains(&name) || name.contains(".example."),
            "{name} is neither in the base nor an example"
        );
    }
}

#[test]
fn every_manifest_is_valid_for_a_recent_kubernetes() {
    let files = manifests();
    let mut args = vec!["--strict", "--kubernetes-version", "1.33.0"];
    let paths: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    args.extend(paths.iter().map(String::as_str));
    let out = run("kubernetes-validate", &args);
    let report = text(&out);
    assert!(out.status.success(), "kubernetes-validate:\n{report}");
    for path in &paths {
        let name = Path::new(path).file_name().unwrap().to_str().unwrap();
        if name.starts_with("servicemonitor") || name.starts_with("prometheusrule") {
            continue; // CRDs: no schema in kubernetes-validate
        }
        assert!(
            report.lines().any(|l| l.contains(path) && l.contains(" passed ")),
            "{name} not validated:\n{report}"
        );
    }
}

#[test]
fn the_statefulset_matches_the_daemon() {
    let sts = read("deploy/kubernetes/base/statefulset.yaml");
    let config_map = read("deploy/kubernetes/base/configmap.yaml");
    // The container's arguments are flags `hookrelay serve` accepts.
    let args_line = sts.lines().find_map(|l| l.trim().strip_prefix("args: ")).expect("args");
    let args: Vec<String> = serde_json::from_str(args_line).unwrap();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_serve_accepts("StatefulSet args", &args);
    // Probes on the admin port, the data dir on the volume.
    assert!(sts.contains("path: /readyz") && sts.contains("path: /healthz"));
    assert!(sts.contains("mountPath: /var/lib/hookrelay"));
    // terminationGracePeriodSeconds above the configured grace.
    let termination: u64 = sts
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds: "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    let grace: u64 = config_map
        .lines()
        .find_map(|l| l.trim().strip_prefix("grace = \""))
        .and_then(|v| v.trim_end_matches("s\"").parse().ok())
        .unwrap();
    assert!(termination > grace, "terminationGracePeriodSeconds {termination} <= grace {grace}s");

    // The ConfigMap's config is valid with the operator's own tokens in the Secret;
    // with the example Secret's published tokens, on its public listeners, it is
    // refused, saying what to do.
    let env = secret_env("deploy/kubernetes/base/secret.example.yaml");
    assert_eq!(env.len(), 3, "{env:?}");
    check_config("ConfigMap config", &config_map_toml(&config_map), &own_tokens(&env));
    let refused = check_config_output(&config_map_toml(&config_map), &env);
    assert!(!refused.status.success(), "the example Secret's tokens were accepted");
    let said = text(&refused);
    assert!(said.contains("sources[0].token: is the example token"), "{said}");
    assert!(said.contains("admin.token: is the example token"), "{said}");
}

#[test]
fn the_prometheus_rule_is_built_from_the_alerts_file() {
    let alerts = read("deploy/prometheus/alerts.yml");
    let rule = read("deploy/kubernetes/base/prometheusrule.yaml");
    let spec = rule.split_once("\nspec:\n").expect("spec:").1;
    let expected: String = alerts
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| if l.is_empty() { "\n".to_owned() } else { format!("  {l}\n") })
        .collect();
    assert_eq!(
        spec, expected,
        "deploy/kubernetes/base/prometheusrule.yaml is stale: run scripts/gen-prometheusrule.sh"
    );
}

#[test]
fn checkov_finds_nothing_left_unexplained() {
    let out = run(
        "checkov",
        &[
            "--config-file",
            &format!("{ROOT}/deploy/.checkov.yaml"),
            "--directory",
            &format!("{ROOT}/deploy"),
            "--file",
            &format!("{ROOT}/Dockerfile"),
            "--compact",
            "--quiet",
        ],
    );
    assert!(out.status.success(), "checkov:\n{}", text(&out));
    // The skips are explained where operators read them.
    let config = read("deploy/.checkov.yaml");
    let docs = read("docs/deploy.md");
    let skipped =
        config.lines().filter_map(|l| l.trim().strip_prefix("- ")).filter(|c| c.starts_with("CKV"));
    for check in skipped.map(|c| c.split_whitespace().next().unwrap()) {
        assert!(docs.contains(check), "{check} is skipped but docs/deploy.md does not say why");
    }
}

#[test]
fn the_dockerfile_passes_hadolint_and_runs_the_binary_as_documented() {
    let out = run("hadolint", &[&format!("{ROOT}/Dockerfile")]);
    assert!(out.status.success(), "hadolint:\n{}", text(&out));
    let dockerfile = read("Dockerfile");
    let json_array = |prefix: &str| -> Vec<String> {
        let line = dockerfile
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix}"));
        serde_json::from_str(line.trim()).unwrap()
    };
    assert_eq!(json_array("ENTRYPOINT "), ["/usr/local/bin/hookrelay"]);
    let cmd = json_array("CMD ");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    assert_serve_accepts("Dockerfile CMD", &cmd);
    for needle in ["EXPOSE 8080 8079", "VOLUME [\"/var/lib/hookrelay\"]", "USER 65532:65532"] {
        assert!(dockerfile.contains(needle), "Dockerfile lacks {needle}");
    }
    // Every bench of Cargo.toml has a stub in the dependency layer (cargo refuses a
    // manifest whose bench file is missing).
    let manifest = read("Cargo.toml");
    let benches: Vec<&str> = manifest
        .split("[[bench]]")
        .skip(1)
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("name = ")))
        .map(|n| n.trim_matches('"'))
        .collect();
    let stubs = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("&& for b in "))
        .and_then(|l| l.split(';').next())
        .expect("the bench stubs' loop");
    let stubs: Vec<&str> = stubs.split_whitespace().collect();
    assert_eq!(stubs, benches, "the Dockerfile's bench stubs and Cargo.toml's benches");
    // The image's environment with the default config's example tokens: refused, with
    // what to do (both listeners reach other machines in a container).
    let image_env = [
        ("HOOKRELAY__INGRESS__LISTEN", "0.0.0.0:8080"),
        ("HOOKRELAY__ADMIN__LISTEN", "0.0.0.0:8079"),
        ("HOOKRELAY__STORAGE__DATA_DIR", "/var/lib/hookrelay"),
        ("HOOKRELAY__LOG__FORMAT", "json"),
    ];
    let check = |extra: &[(&str, &str)], config: &str| {
        Command::new(common::binary())
            .args(["check-config", "--config", config])
            .envs(image_env.iter().copied())
            .envs(extra.iter().copied())
            .output()
            .unwrap()
    };
    let shipped = format!("{ROOT}/config/hookrelay.toml");
    let out = check(&[], &shipped);
    assert!(!out.status.success(), "{}", text(&out));
    for needle in [
        "sources[0].token: is the example token",
        "admin.token: is the example token",
        "openssl rand",
    ] {
        assert!(text(&out).contains(needle), "{needle}: {}", text(&out));
    }
    // With the operator's tokens (a mounted config; the admin token from the
    // environment), it is valid.
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("hookrelay.toml");
    let source_token = "k3J9xQ2vL8mN4pR7sT1wY6zA";
    std::fs::write(
        &own,
        read("config/hookrelay.toml").replace("demo-token-change-me", source_token),
    )
    .unwrap();
    let admin_token = "a9F2kL7pQ4xZ8mN3vB6cR1tY";
    let out = check(&[("HOOKRELAY__ADMIN__TOKEN", admin_token)], own.to_str().unwrap());
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("/var/lib/hookrelay"));
    assert!(!text(&out).contains(source_token) && !text(&out).contains(admin_token));
}

/// The `hookrelay.toml` a ConfigMap manifest carries.
fn config_map_toml(config_map: &str) -> String {
    config_map
        .lines()
        .skip_while(|l| !l.contains("hookrelay.toml: |"))
        .skip(1)
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect()
}

/// `hookrelay check-config` on `toml` with `env`: it must pass and print no value of
/// `env` (they are the secrets); returns what it printed.
fn check_config(what: &str, toml: &str, env: &[(String, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(common::binary())
        .args(["check-config", "--config", path.to_str().unwrap()])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{what}: {}", text(&out));
    for (_, value) in env {
        assert!(!text(&out).contains(value.as_str()), "{what}: check-config printed a secret");
    }
    text(&out)
}

/// [`check_config`] of a PostgreSQL config: not even the password inside the
/// database URL is printed.
fn assert_config_valid(what: &str, toml: &str, env: &[(String, String)]) {
    let printed = check_config(what, toml, env);
    assert!(!printed.contains("change-me-db-password"), "{what}: the database password");
}

/// `env` with the tokens (`*_TOKEN`) replaced by an operator's own, as the example
/// Secret tells the operator to.
fn own_tokens(env: &[(String, String)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| match k.ends_with("_TOKEN") {
            true => (k.clone(), format!("own-{}-0123456789abcdef", k.to_lowercase())),
            false => (k.clone(), v.clone()),
        })
        .collect()
}

/// `hookrelay check-config` on `toml` with `env`, whatever its outcome.
fn check_config_output(toml: &str, env: &[(String, String)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(&path, toml).unwrap();
    Command::new(common::binary())
        .args(["check-config", "--config", path.to_str().unwrap()])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()
        .unwrap()
}

/// The `KEY: value` pairs of a Secret example's `stringData`.
fn secret_env(path: &str) -> Vec<(String, String)> {
    read(path)
        .lines()
        .skip_while(|l| !l.starts_with("stringData:"))
        .skip(1)
        .filter_map(|l| l.trim().split_once(": "))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The PostgreSQL overlay: kustomize renders a fleet (a Deployment of 3 without any
/// volume, an HPA, the PDB; no StatefulSet), each manifest is valid for a recent
/// Kubernetes, and its config is a valid PostgreSQL config once the Secret is there.
#[test]
fn the_postgres_overlay_renders_a_stateless_fleet() {
    let overlay = format!("{ROOT}/deploy/kubernetes/overlays/postgres");
    let out = run("kubectl", &["kustomize", &overlay]);
    assert!(out.status.success(), "kubectl kustomize:\n{}", text(&out));
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    let kinds: Vec<&str> = rendered.lines().filter_map(|l| l.strip_prefix("kind: ")).collect();
    for kind in ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ConfigMap"] {
        assert!(kinds.contains(&kind), "no {kind} in the overlay: {kinds:?}");
    }
    assert!(!kinds.contains(&"StatefulSet"), "the sled StatefulSet is still there");
    assert!(
        !rendered.contains("PersistentVolumeClaim") && !rendered.contains("volumeClaimTemplates")
    );
    assert!(!rendered.contains("hookrelay-headless"));
    assert!(rendered.contains("replicas: 3") && rendered.contains("backend = \"postgres\""));

    // The manifests themselves (patches are partial objects: rendered above).
    let files: Vec<String> = [
        "deployment.yaml",
        "horizontalpodautoscaler.yaml",
        "configmap.yaml",
        "secret.example.yaml",
    ]
    .iter()
    .map(|f| format!("{overlay}/{f}"))
    .collect();
    let mut args = vec!["--strict", "--kubernetes-version", "1.33.0"];
    args.extend(files.iter().map(String::as_str));
    let out = run("kubernetes-validate", &args);
    assert!(out.status.success(), "kubernetes-validate:\n{}", text(&out));
    for f in &files {
        assert!(
            text(&out).lines().any(|l| l.contains(f.as_str()) && l.contains(" passed ")),
            "{f} not validated"
        );
    }

    // The Deployment runs the binary as documented, with a grace period above the config's.
    let deployment = read("deploy/kubernetes/overlays/postgres/deployment.yaml");
    let args_line = deployment.lines().find_map(|l| l.trim().strip_prefix("args: ")).expect("args");
    let args: Vec<String> = serde_json::from_str(args_line).unwrap();
    assert_serve_accepts("Deployment args", &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(deployment.contains("path: /readyz") && deployment.contains("path: /healthz"));
    assert!(!deployment.contains("mountPath: /var/lib/hookrelay"), "a fleet relay keeps no state");

    let toml = config_map_toml(&read("deploy/kubernetes/overlays/postgres/configmap.yaml"));
    let env = secret_env("deploy/kubernetes/overlays/postgres/secret.example.yaml");
    assert_eq!(env.len(), 4, "{env:?}");
    assert_config_valid("the overlay's ConfigMap", &toml, &own_tokens(&env));
    assert!(!check_config_output(&toml, &env).status.success(), "the example tokens, public");
}

/// The systemd example for a fleet relay is a valid config with the env file it names.
#[test]
fn the_systemd_postgres_example_is_a_valid_config() {
    let toml = read("deploy/systemd/postgres.example.toml");
    // The env file the comment names, with its placeholders filled in.
    let env: Vec<(String, String)> = toml
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = match v {
                "whsec_..." => "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned(),
                "..." => format!("own-{}-0123456789abcdef", k.to_lowercase()),
                url => url.replace("PASSWORD", "change-me-db-password"),
            };
            (k.to_owned(), v)
        })
        .collect();
    assert_eq!(env.len(), 4, "{env:?}");
    assert_config_valid("deploy/systemd/postgres.example.toml", &toml, &env);
}

/// The test command must not fail on its own plumbing: under `pipefail`, a pipe into
/// a reader that stops early (`head`, `grep -q`) kills the writer with SIGPIPE and
/// fails the run with exit 141 and no message (seen on a new user's first run).
#[test]
fn the_test_script_has_no_pipe_that_can_die_of_sigpipe() {
    let script = read("scripts/test.sh");
    assert!(script.contains("pipefail"), "the script runs under pipefail");
    for (n, line) in script.lines().enumerate() {
        let code = line.split('#').next().unwrap_or_default();
        for reader in ["| head", "|head", "| grep -q", "| grep -m"] {
            assert!(
                !code.contains(reader),
                "scripts/test.sh:{}: `{reader}` under pipefail: {line}",
                n + 1
            );
        }
    }
}

/// The declared minimum Rust version is the highest any crate we build needs (the
/// redb 4 needs 1.90, the vendored actix-http 1.89; the manifest once said 1.85).
#[test]
fn the_declared_rust_version_covers_every_dependency() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = run("rustc", &["-vV"]);
    let host = text(&rustc)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .expect("host");
    let manifest = format!("{ROOT}/Cargo.toml");
    let out = run(
        &cargo,
        &[
            "metadata",
            "--manifest-path",
            &manifest,
            "--format-version",
            "1",
            "--locked",
            "--offline",
            "--filter-platform",
            &host,
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let version = |v: &serde_json::Value| -> Option<(u64, u64)> {
        let mut parts = v.as_str()?.split('.').map(|p| p.parse::<u64>().ok());
        Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
    };
    let used: std::collections::HashSet<&str> =
        m["resolve"]["nodes"].as_array().unwrap().iter().filter_map(|n| n["id"].as_str()).collect();
    let ours = m["packages"].as_array().unwrap().iter().find(|p| p["name"] == "hookrelay").unwrap();
    let declared = version(&ours["rust_version"]).expect("hookrelay declares rust-version");
    for p in m["packages"].as_array().unwrap() {
        if let (Some(needs), true) =
            (version(&p["rust_version"]), used.contains(p["id"].as_str().unwrap_or("")))
        {
            assert!(
                needs <= declared,
                "{} needs Rust {needs:?}, Cargo.toml declares {declared:?}",
                p["name"]
            );
        }
    }
}
