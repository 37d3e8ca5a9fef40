use std::collections::HashMap;

use super::*;

const BASE: &str = r#"
[admin]
token = "an-admin-token-of-32-characters-x"

[storage]
data_dir = "/var/lib/hookrelay"

[[sources]]
name = "demo"
token = "0123456789abcdef0123"

[[destinations]]
name = "crm"
url = "http://127.0.0.1:9001/"

[[destinations]]
name = "erp"
url = "http://127.0.0.1:9002/"
"#;

fn config(text: &str) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hookrelay.toml");
    std::fs::write(&path, text).unwrap();
    Config::load(&path, &HashMap::new()).unwrap()
}

fn keys(refused: &[Refusal]) -> Vec<&str> {
    refused.iter().map(|r| r.key.as_str()).collect()
}

#[test]
fn the_same_file_changes_nothing_and_keeps_its_fingerprint() {
    let (a, b) = (config(BASE), config(BASE));
    assert!(restart_needed(&a, &b).is_empty());
    assert!(changes(&a, &b).is_empty(), "{:?}", changes(&a, &b));
    assert_eq!(fingerprint(&a), fingerprint(&b));
    assert!(fingerprint(&a) < 1 << 48, "whole in an f64");
}

#[test]
fn destinations_added_changed_and_removed_are_named() {
    let next = BASE.replace("9002", "9003")
        + "\n[[destinations]]\nname = \"billing\"\nurl = \"http://127.0.0.1:9004/\"\n";
    let next =
        next.replace("[[destinations]]\nname = \"crm\"\nurl = \"http://127.0.0.1:9001/\"\n", "");
    let c = changes(&config(BASE), &config(&next));
    assert_eq!(c.added, ["billing"]);
    assert_eq!(c.changed, ["erp"]);
    assert_eq!(c.removed, ["crm"]);
    assert!(!c.sources && !c.tokens);
    assert!(restart_needed(&config(BASE), &config(&next)).is_empty());
    assert_ne!(fingerprint(&config(BASE)), fingerprint(&config(&next)));
}

#[test]
fn a_changed_default_changes_every_destination() {
    let next = format!("[delivery]\ntimeout = \"7s\"\n{BASE}");
    let c = changes(&config(BASE), &config(&next));
    assert_eq!(c.changed, ["crm", "erp"]);
}

#[test]
fn a_filter_a_token_and_a_role_are_changes_a_reload_takes() {
    let next = BASE.replace(
        "url = \"http://127.0.0.1:9001/\"",
        "url = \"http://127.0.0.1:9001/\"\nfilter = '.event == \"ActionCreated\"'",
    ) + "\n[[admin.tokens]]\nname = \"helpdesk\"\nrole = \"viewer\"\ntoken = \"a-viewer-token-of-32-characters-xx\"\n";
    let next = next.replace("0123456789abcdef0123", "3210fedcba9876543210");
    let c = changes(&config(BASE), &config(&next));
    assert_eq!(c.changed, ["crm"]);
    assert!(c.tokens && c.sources);
    assert!(restart_needed(&config(BASE), &config(&next)).is_empty());
    // A rotated secret alone does not move the fingerprint (it is masked).
    let rotated = BASE.replace("0123456789abcdef0123", "3210fedcba9876543210");
    assert_eq!(fingerprint(&config(BASE)), fingerprint(&config(&rotated)));
    assert!(changes(&config(BASE), &config(&rotated)).sources);
}

#[test]
fn listeners_storage_logging_and_traces_are_refused_by_key() {
    let next = BASE
        .replace("/var/lib/hookrelay", "/srv/hookrelay")
        .replace("[admin]\n", "[admin]\nlisten = \"127.0.0.1:9999\"\n")
        + "\n[ingress]\nlisten = \"0.0.0.0:8088\"\nworkers = 3\n\n[log]\nlevel = \"debug\"\n";
    let refused = restart_needed(&config(BASE), &config(&next));
    assert_eq!(
        keys(&refused),
        ["ingress.listen", "ingress.workers", "admin.listen", "storage.data_dir", "log.level"]
    );
    let said = refused[3].to_string();
    assert!(said.contains("storage.data_dir changed") && said.contains("restart"), "{said}");
}

#[test]
fn a_database_password_alone_is_refused_by_its_section_and_never_shown() {
    let pg = |password: &str| {
        BASE.replace(
            "data_dir = \"/var/lib/hookrelay\"",
            &format!(
                "backend = \"postgres\"\n[storage.postgres]\nurl = \"postgres://relay:{password}@db/hookrelay\""
            ),
        )
    };
    let refused = restart_needed(&config(&pg("old-secret")), &config(&pg("new-secret")));
    assert_eq!(keys(&refused), ["storage"]);
    let said = refused[0].to_string();
    assert!(!said.contains("secret"), "{said}");
}
