//! The simulated resthooks: ownership, validation, paging, triggers and disabling, as the real service does them.

use super::*;

const URL: &str = "https://relay.example.com/hooks/demo/t/ActionCreated";

fn create(hooks: &mut Hooks, owner: &str, event: &str) -> u64 {
    let body = json!({"resthooks": {"eventName": event, "targetUrl": URL}});
    hooks.create(owner, &body).unwrap()[0].id
}

#[test]
fn new_hooks_are_active_and_untriggered() {
    let mut hooks = Hooks::default();
    let id = create(&mut hooks, "alice", "ActionCreated");
    let h = hooks.hook(id).unwrap();
    assert_eq!((h.status, h.triggered_count, h.last_triggered), (Status::Active, 0, None));
    let shown = h.to_json(Quirks::default());
    assert_eq!(shown["lastTriggered"], "");
    assert_eq!(shown["id"], id.to_string());
    let quirky = h.to_json(Quirks { triggered_last_timestamp: true, ..Quirks::default() });
    assert!(quirky["triggeredLastTimestamp"].is_null());
    assert!(quirky.get("lastTriggered").is_none());
}

#[test]
fn validation_names_the_problem() {
    let mut hooks = Hooks::default();
    let cases = [
        (json!({"resthooks": {"eventName": "ActionMoved", "targetUrl": URL}}), "ActionMoved"),
        (
            json!({"resthooks": {"eventName": "ActionCreated", "targetUrl": "/relative"}}),
            "absolute",
        ),
        (
            json!({"resthooks": {"eventName": "ActionCreated", "targetUrl": "ftp://x/y"}}),
            "absolute",
        ),
        (json!({"resthooks": {"targetUrl": URL}}), "eventName is required"),
        (json!({"hooks": {}}), "resthooks"),
        // One bad record in an array: nothing is created.
        (
            json!({"resthooks": [{"eventName": "ActionCreated", "targetUrl": URL}, {"eventName": "x", "targetUrl": URL}]}),
            "\"x\"",
        ),
    ];
    for (body, needle) in cases {
        let e = hooks.create("alice", &body).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.detail.contains(needle), "{} lacks {needle}", e.detail);
    }
    assert_eq!(hooks.list("alice", 1, 20).unwrap().record_count, 0);
}

#[test]
fn users_see_and_change_only_their_own_hooks() {
    let mut hooks = Hooks::default();
    let a = create(&mut hooks, "alice", "ActionCreated");
    let b = create(&mut hooks, "bob", "ActionCreated");
    assert_eq!(hooks.list("alice", 1, 20).unwrap().hooks.len(), 1);
    assert_eq!(hooks.get("alice", &[b]).unwrap_err().status, 404);
    assert_eq!(hooks.delete("alice", &[a, b]).unwrap_err().status, 404);
    assert!(hooks.hook(a).is_some(), "a failed multi-delete deletes nothing");
    let put = json!({"resthooks": {"eventName": "TaskCreated"}});
    assert_eq!(hooks.update("alice", &[b], &put).unwrap_err().status, 404);
    assert_eq!(hooks.update("bob", &[b], &put).unwrap()[0].event_name, "TaskCreated");
    hooks.delete("alice", &[a]).unwrap();
    assert!(hooks.hook(a).is_none());
}

#[test]
fn pages_cover_every_hook_once() {
    let mut hooks = Hooks::default();
    for _ in 0..5 {
        create(&mut hooks, "alice", "ActionCreated");
    }
    let mut seen = Vec::new();
    for page in 1..=3 {
        let p = hooks.list("alice", page, 2).unwrap();
        assert_eq!((p.record_count, p.page_count()), (5, 3));
        seen.extend(p.hooks.iter().map(|h| h.id));
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
    assert!(hooks.list("alice", 4, 2).unwrap().hooks.is_empty());
    assert_eq!(hooks.list("alice", 1, 201).unwrap_err().status, 400);
    assert_eq!(hooks.list("alice", 0, 2).unwrap_err().status, 400);
}

#[test]
fn trigger_calls_each_active_hook_and_counts() {
    let mut hooks = Hooks::default();
    let a = create(&mut hooks, "alice", "ActionCreated");
    let b = create(&mut hooks, "bob", "ActionCreated");
    create(&mut hooks, "bob", "TaskCreated");
    let now = SystemTime::now();
    let calls = hooks.trigger("ActionCreated", now);
    assert_eq!(calls.iter().map(|c| c.hook_id).collect::<Vec<_>>(), vec![a, b]);
    hooks.disable(b);
    let calls = hooks.trigger("ActionCreated", now);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].trigger_count, 2);
    let (ha, hb) = (hooks.hook(a).unwrap(), hooks.hook(b).unwrap());
    assert_eq!((ha.triggered_count, hb.triggered_count), (2, 1));
    assert_eq!(hb.status, Status::Disabled);
    assert_eq!(ha.last_triggered, Some(now));
}

#[test]
fn put_never_re_enables() {
    let mut hooks = Hooks::default();
    let a = create(&mut hooks, "alice", "ActionCreated");
    hooks.disable(a);
    let put = json!({"resthooks": {"targetUrl": "https://elsewhere.example.com/x"}});
    let h = &hooks.update("alice", &[a], &put).unwrap()[0];
    assert_eq!(
        (h.status, h.target_url.as_str()),
        (Status::Disabled, "https://elsewhere.example.com/x")
    );
}

#[test]
fn ids_parse_singly_and_in_lists() {
    assert_eq!(parse_ids("7").unwrap(), vec![7]);
    assert_eq!(parse_ids("7,9").unwrap(), vec![7, 9]);
    assert_eq!(parse_ids("7,x").unwrap_err().status, 400);
}
