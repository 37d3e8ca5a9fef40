//! The filter and transform rules on real programs, and their properties.

use proptest::prelude::*;

use super::*;

/// An `ActionUpdated` of source `demo`, received at 1,763,000,000 s, about `resource`.
fn meta(resource: Option<&str>) -> EventMeta {
    let mut meta =
        crate::store::fixtures::received("demo", "ActionUpdated", 1_763_000_000_000_000, "{}").meta;
    meta.resource = resource.map(str::to_owned);
    meta
}

/// The input document of event `id` with `meta`, as a shaping process builds it.
fn input(id: EventId, meta: &EventMeta, body: &[u8]) -> Val {
    let program = Program::compile(".").unwrap();
    document(&job(Role::Filter, &program, id, meta), body).0
}

fn run(code: &str, body: &str) -> Result<Vec<Val>, String> {
    let p = Program::compile(code).unwrap();
    p.run(input(EventId::new(0x10), &meta(Some("actions/5")), body.as_bytes()))
}

const BODY: &str =
    r#"{"data":{"type":"actions","id":"5","attributes":{"status":"Open","priority":3}}}"#;

#[test]
fn the_input_document_holds_the_event_and_its_parsed_body() {
    let out = run(".", BODY).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&out[0].to_string()).unwrap();
    assert_eq!(
        doc,
        serde_json::json!({
            "id": "0000000000000010",
            "event": "ActionUpdated",
            "source": "demo",
            "resource": "actions/5",
            "record": "actions/5",
            "received_at": "2025-11-13T02:13:20.000000Z",
            "body": serde_json::from_str::<serde_json::Value>(BODY).unwrap(),
        })
    );
    // A body that is not JSON is null; so is a missing resource.
    let p = Program::compile("[.body, .resource]").unwrap();
    let out = p.run(input(EventId::new(1), &meta(None), b"status=open")).unwrap();
    assert_eq!(out[0].to_string(), "[null,null]");
}

#[test]
fn only_a_single_true_matches() {
    let verdict = |code: &str| filter_verdict(run(code, BODY), None);
    assert_eq!(verdict(".body.data.attributes.status == \"Open\""), FilterVerdict::Matched);
    assert_eq!(verdict(".event | startswith(\"Action\")"), FilterVerdict::Matched);
    let reason = |code: &str| match verdict(code) {
        FilterVerdict::Filtered { reason, error } => (reason, error),
        FilterVerdict::Matched => panic!("{code} matched"),
    };
    assert_eq!(
        reason(".body.data.attributes.priority > 5"),
        ("the filter gave false".into(), false)
    );
    assert_eq!(reason("empty"), ("the filter gave no output".into(), false));
    assert_eq!(reason("true, true"), ("the filter gave more than one output".into(), true));
    assert_eq!(reason(".body.data.id"), ("the filter gave \"5\", not a boolean".into(), true));
    let (failed, error) = reason(".body.data.attributes.status.x");
    assert!(failed.starts_with("the filter failed: ") && error, "{failed}");
    // A long value is quoted by its start.
    let (long, _) = reason("[range(200)]");
    assert!(long.ends_with("…, not a boolean") && long.len() < 140, "{long}");
}

#[test]
fn a_transform_gives_one_json_body() {
    let body = transformed(run(
        "{event, type: .body.data.type, id: .body.data.id, attributes: .body.data.attributes}",
        BODY,
    ))
    .unwrap();
    assert_eq!(
        String::from_utf8(body).unwrap(),
        r#"{"event":"ActionUpdated","type":"actions","id":"5","attributes":{"status":"Open","priority":3}}"#
    );
    assert_eq!(transformed(run("empty", BODY)), Err("the transform gave no output".into()));
    assert_eq!(
        transformed(run("1, 2", BODY)),
        Err("the transform gave more than one output".into())
    );
    assert!(transformed(run("nan", BODY)).unwrap_err().contains("not JSON"));
    assert!(transformed(run("error(\"no\")", BODY))
        .unwrap_err()
        .starts_with("the transform failed"));
}

#[test]
fn the_shipped_examples_compile_and_give_what_their_docs_say() {
    let slack = include_str!("../../docs/transforms/slack.jq");
    let out = transformed(Program::compile(slack).unwrap().run(input(
        EventId::new(0x10),
        &meta(Some("actions/5")),
        BODY.as_bytes(),
    )))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["text"], "ActionUpdated: actions/5 (demo)");
    let flat = include_str!("../../docs/transforms/flatten.jq");
    let out = transformed(Program::compile(flat).unwrap().run(input(
        EventId::new(0x10),
        &meta(Some("actions/5")),
        BODY.as_bytes(),
    )))
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"event": "ActionUpdated", "type": "actions", "id": "5", "attributes": {"status": "Open", "priority": 3}})
    );
}

/// A JSON value of a few levels.
fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i32>().prop_map(serde_json::Value::from),
        "[a-zA-Z0-9 é\"\\\\]{0,8}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    /// The identity transform gives back the body, as the same JSON value; any
    /// transform gives the same bytes every time (every attempt, every relay).
    #[test]
    fn transforms_are_faithful_and_deterministic(body in json()) {
        let text = body.to_string();
        let p = Program::compile(".body").unwrap();
        let doc = || input(EventId::new(7), &meta(None), text.as_bytes());
        let once = transformed(p.run(doc())).unwrap();
        prop_assert_eq!(serde_json::from_slice::<serde_json::Value>(&once).unwrap(), body);
        let q = Program::compile("{event, body, keys: (.body | if type == \"object\" then keys else [] end)}").unwrap();
        prop_assert_eq!(transformed(q.run(doc())), transformed(q.run(doc())));
    }

    /// A filter matches exactly when jq's answer is one `true`: here, `.body == X`
    /// against serde_json's equality.
    #[test]
    fn a_filter_matches_exactly_when_its_answer_is_true(body in json(), other in json()) {
        let code = format!(".body == {other}");
        let p = Program::compile(&code).unwrap();
        let verdict = filter_verdict(p.run(input(EventId::new(7), &meta(None), body.to_string().as_bytes())), None);
        prop_assert_eq!(verdict == FilterVerdict::Matched, body == other);
    }
}
