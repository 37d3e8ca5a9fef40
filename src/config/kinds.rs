//! What each destination kind needs of its `[[destinations]]` entry: the URL's
//! schemes, the keys it requires, and the keys of other kinds it refuses (a `subject`
//! on an HTTP destination is a mistake to name, not to ignore).

use super::delivery::{DestinationConfig, DestinationKind};
use crate::template::Template;

/// The URL schemes of `kind` (none: it takes no URL).
fn schemes(kind: DestinationKind) -> &'static [&'static str] {
    match kind {
        DestinationKind::Http => &["http", "https"],
        DestinationKind::Nats => &["nats", "tls"],
        DestinationKind::Amqp => &["amqp", "amqps"],
        DestinationKind::RedisStream => &["redis", "rediss"],
        DestinationKind::Pull => &[],
    }
}

/// Whether the key `field` belongs to `kind`.
fn belongs(field: &str, kind: DestinationKind) -> bool {
    use DestinationKind::*;
    match field {
        "subject" | "credentials_file" => kind == Nats,
        "exchange" | "routing_key" => kind == Amqp,
        "stream" | "max_len" => kind == RedisStream,
        "password" | "ca_file" => matches!(kind, Nats | Amqp | RedisStream),
        "token" => kind == Pull,
        _ => true,
    }
}

/// The problems of `dest`'s kind-specific keys, each under `key`.
pub(super) fn check(key: &str, dest: &DestinationConfig, problems: &mut Vec<String>) {
    let kind = dest.kind;
    let kind_name = kind.name();
    let given = [
        ("subject", dest.subject.is_some()),
        ("exchange", dest.exchange.is_some()),
        ("routing_key", dest.routing_key.is_some()),
        ("stream", dest.stream.is_some()),
        ("max_len", dest.max_len.is_some()),
        (
            "password",
            dest.password.is_some() || dest.password_file.is_some() || dest.password_env.is_some(),
        ),
        ("credentials_file", dest.credentials_file.is_some()),
        ("ca_file", dest.ca_file.is_some()),
        ("token", dest.token.is_some() || dest.token_file.is_some() || dest.token_env.is_some()),
    ];
    for (field, _) in given.iter().filter(|(f, set)| *set && !belongs(f, kind)) {
        problems.push(format!("{key}.{field}: not used by kind = {kind_name:?}; remove it"));
    }
    check_url(key, dest, problems);
    if belongs("ca_file", kind) {
        if let Some(ca) = &dest.ca_file {
            check_ca_file(key, dest, ca, problems);
        }
    }
    let template = |field: &str, text: Option<&str>, problems: &mut Vec<String>| match text {
        None => None,
        Some(text) => match Template::parse(text) {
            Ok(t) => Some(t),
            Err(e) => {
                problems.push(format!("{key}.{field}: {e}"));
                None
            }
        },
    };
    match kind {
        DestinationKind::Nats => match dest.subject.as_deref() {
            None => problems.push(format!(
                "{key}.subject: kind = \"nats\" needs the subject to publish to, such as \
                 \"hookrelay.{{source}}.{{event}}\" (a stream of yours must capture it)"
            )),
            Some(text) => {
                if let Some(t) = template("subject", Some(text), problems) {
                    let literal = t.literal();
                    if literal.contains(['*', '>']) || literal.contains(char::is_whitespace) {
                        problems.push(format!(
                            "{key}.subject: {text:?} holds a wildcard or a space; a subject \
                             published to names one subject"
                        ));
                    }
                    if text.starts_with('.') || text.ends_with('.') || text.contains("..") {
                        problems.push(format!("{key}.subject: {text:?} has an empty token"));
                    }
                }
            }
        },
        DestinationKind::Amqp => {
            if dest.exchange.is_none() {
                problems.push(format!(
                    "{key}.exchange: kind = \"amqp\" needs the exchange to publish to (\"\" \
                     for the default exchange); the relay does not declare it"
                ));
            }
            template("routing_key", dest.routing_key.as_deref(), problems);
        }
        DestinationKind::RedisStream => {
            if dest.stream.is_none() {
                problems.push(format!(
                    "{key}.stream: kind = \"redis-stream\" needs the stream's key, such as \
                     \"hookrelay\""
                ));
            }
            template("stream", dest.stream.as_deref(), problems);
            if dest.max_len == Some(0) {
                problems.push(format!("{key}.max_len: must be at least 1 (omit it to keep all)"));
            }
        }
        DestinationKind::Pull => {
            let given =
                dest.token.is_some() || dest.token_file.is_some() || dest.token_env.is_some();
            if !given {
                problems.push(format!(
                    "{key}.token: kind = \"pull\" needs the token its consumer sends \
                     (token, token_file or token_env; at least 16 characters)"
                ));
            }
        }
        DestinationKind::Http => {}
    }
}

/// The TLS URL scheme of each broker kind.
fn tls_scheme(kind: DestinationKind) -> Option<&'static str> {
    match kind {
        DestinationKind::Nats => Some("tls"),
        DestinationKind::Amqp => Some("amqps"),
        DestinationKind::RedisStream => Some("rediss"),
        DestinationKind::Http | DestinationKind::Pull => None,
    }
}

/// A `ca_file` is for a TLS URL, and is a readable PEM file with a certificate.
fn check_ca_file(
    key: &str,
    dest: &DestinationConfig,
    ca: &std::path::Path,
    problems: &mut Vec<String>,
) {
    let scheme = dest.url.split_once("://").map(|(s, _)| s).unwrap_or_default();
    if let Some(tls) = tls_scheme(dest.kind).filter(|tls| *tls != scheme) {
        problems.push(format!(
            "{key}.ca_file: set, but the URL does not use TLS: begin it with {tls}:// \
             (or remove ca_file)"
        ));
    }
    match std::fs::read_to_string(ca) {
        Err(e) => problems.push(format!("{key}.ca_file: cannot read {}: {e}", ca.display())),
        Ok(pem) if !pem.contains("-----BEGIN CERTIFICATE-----") => problems.push(format!(
            "{key}.ca_file: {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ca.display()
        )),
        Ok(_) => {}
    }
}

/// The URL's scheme and host for `dest`'s kind; none for pull.
fn check_url(key: &str, dest: &DestinationConfig, problems: &mut Vec<String>) {
    let kind = dest.kind;
    let allowed = schemes(kind);
    if allowed.is_empty() {
        if !dest.url.is_empty() {
            problems.push(format!(
                "{key}.url: kind = {:?} takes no URL (its consumer fetches); remove it",
                kind.name()
            ));
        }
        return;
    }
    let expected = allowed.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(" or ");
    match reqwest::Url::parse(&dest.url) {
        Ok(url) if allowed.contains(&url.scheme()) && url.host().is_some() => {
            if kind != DestinationKind::Http && url.password().is_some() {
                problems.push(format!(
                    "{key}.url: holds a password; give it by password_file or password_env \
                     (or password), so that it stays out of the URL"
                ));
            }
        }
        _ if kind == DestinationKind::Http => problems.push(format!(
            "{key}.url: {:?} is not an absolute http(s) URL",
            super::mask_url(&dest.url)
        )),
        _ => problems.push(format!(
            "{key}.url: {:?} is not an absolute {expected} URL (kind = {:?})",
            super::mask_url(&dest.url),
            kind.name()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(dest: DestinationConfig) -> Vec<String> {
        let mut out = Vec::new();
        check("destinations[0]", &dest, &mut out);
        out
    }

    fn nats(subject: &str) -> DestinationConfig {
        DestinationConfig {
            name: "bus".into(),
            kind: DestinationKind::Nats,
            url: "nats://127.0.0.1:4222".into(),
            subject: Some(subject.into()),
            ..Default::default()
        }
    }

    #[test]
    fn each_kind_takes_its_own_url_and_keys() {
        assert!(problems(nats("hookrelay.{source}.{event}")).is_empty());
        let redis = DestinationConfig {
            kind: DestinationKind::RedisStream,
            url: "rediss://cache.internal:6380".into(),
            stream: Some("hookrelay".into()),
            max_len: Some(100_000),
            ..Default::default()
        };
        assert!(problems(redis.clone()).is_empty());
        let http =
            DestinationConfig { url: "https://crm.example.com/h".into(), ..Default::default() };
        assert!(problems(http.clone()).is_empty());
        // A URL of another kind, a key of another kind, a missing key: each named.
        let wrong_url = DestinationConfig { url: "http://127.0.0.1:4222".into(), ..nats("a.b") };
        assert!(problems(wrong_url)[0].contains("not an absolute nats:// or tls:// URL"));
        let foreign = DestinationConfig { subject: Some("a".into()), ..http };
        assert_eq!(
            problems(foreign),
            ["destinations[0].subject: not used by kind = \"http\"; remove it"]
        );
        let missing = DestinationConfig { stream: None, ..redis.clone() };
        assert!(problems(missing)[0].contains("stream: kind = \"redis-stream\" needs"));
        let zero = DestinationConfig { max_len: Some(0), ..redis };
        assert!(problems(zero)[0].contains("max_len: must be at least 1"));
        let amqp = DestinationConfig {
            kind: DestinationKind::Amqp,
            url: "amqp://hookrelay@rabbit.internal:5672/%2f".into(),
            exchange: Some(String::new()),
            routing_key: Some("{source}.{event}".into()),
            ..Default::default()
        };
        assert!(problems(amqp.clone()).is_empty(), "the default exchange is \"\"");
        let no_exchange = DestinationConfig { exchange: None, ..amqp.clone() };
        assert!(problems(no_exchange)[0].contains("exchange: kind = \"amqp\" needs"));
        let bad_key = DestinationConfig { routing_key: Some("{source".into()), ..amqp };
        assert!(problems(bad_key)[0].contains("routing_key: "));
    }

    #[test]
    fn a_ca_file_is_for_a_tls_url_of_a_broker_and_holds_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
            .unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let tls = |ca: &std::path::Path| DestinationConfig {
            url: "tls://nats.internal:4222".into(),
            ca_file: Some(ca.to_owned()),
            ..nats("a.b")
        };
        assert!(problems(tls(&good)).is_empty());
        let plain = DestinationConfig { url: "nats://nats.internal:4222".into(), ..tls(&good) };
        assert!(problems(plain)[0].contains("begin it with tls://"));
        assert!(problems(tls(&junk))[0].contains("holds no PEM certificate"));
        let missing = dir.path().join("nope.pem");
        assert!(problems(tls(&missing))[0].contains("ca_file: cannot read"));
        let http = DestinationConfig {
            url: "https://crm.example.com/h".into(),
            ca_file: Some(good),
            ..Default::default()
        };
        assert_eq!(
            problems(http),
            ["destinations[0].ca_file: not used by kind = \"http\"; remove it"]
        );
    }

    #[test]
    fn a_subject_names_one_subject_and_its_placeholders_exist() {
        assert!(problems(nats("a.*"))[0].contains("wildcard"));
        assert!(problems(nats("a.>"))[0].contains("wildcard"));
        assert!(problems(nats("a b"))[0].contains("wildcard or a space"));
        assert!(problems(nats("a..b"))[0].contains("empty token"));
        assert!(problems(nats("a.{evnt}"))[0].contains("unknown placeholder {evnt}"));
    }

    #[test]
    fn a_password_stays_out_of_the_url_and_a_pull_destination_needs_its_token() {
        let in_url = DestinationConfig { url: "nats://app:hunter2@127.0.0.1".into(), ..nats("a") };
        let said = problems(in_url);
        assert!(said[0].contains("holds a password; give it by password_file"), "{said:?}");
        assert!(said.iter().all(|p| !p.contains("hunter2")), "{said:?}");
        let pull = DestinationConfig { kind: DestinationKind::Pull, ..Default::default() };
        assert!(problems(pull)[0].contains("token: kind = \"pull\" needs the token"));
    }
}
