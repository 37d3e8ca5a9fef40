//! The OpenAPI 3.1 document of the admin listener, generated from the types of
//! [`crate::api`] (their JSON Schemas, by `schemars`) and the routes below. Served at
//! `GET /admin/openapi.json`, printed by `hookrelay openapi`, committed as
//! `docs/openapi.json` (a test fails when that copy is out of date), and checked
//! against a running relay by schemathesis in CI (`tests/integration/openapi.rs`).

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Map, Value};

use super::{
    Accounts, ApiError, AuditReport, DeadLetterPage, Deleted, DestinationHistory, DestinationList,
    EventDetail, EventPage, EventReplayed, JournalPage, Leased, Overview, Paused, Preview,
    PreviewRequest, Reloaded, ReplayRequest, Replayed, Selection, Settle, Settled,
};
use crate::store::{EventId, EventStatus};

/// Builds the document (deterministic: the committed copy is compared byte for byte).
pub(crate) fn document() -> Value {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    let mut g = SchemaGenerator::new(settings);
    let event_page = subschema::<EventPage>(&mut g);
    let event_detail = subschema::<EventDetail>(&mut g);
    let replay_request = subschema::<ReplayRequest>(&mut g);
    let event_replayed = subschema::<EventReplayed>(&mut g);
    let dead_page = subschema::<DeadLetterPage>(&mut g);
    let deleted = subschema::<Deleted>(&mut g);
    let replayed = subschema::<Replayed>(&mut g);
    let destinations = subschema::<DestinationList>(&mut g);
    let paused = subschema::<Paused>(&mut g);
    let accounts = subschema::<Accounts>(&mut g);
    let overview = subschema::<Overview>(&mut g);
    let selection = subschema::<Selection>(&mut g);
    let preview_request = subschema::<PreviewRequest>(&mut g);
    let preview = subschema::<Preview>(&mut g);
    let audit = subschema::<AuditReport>(&mut g);
    let event_id = subschema::<EventId>(&mut g);
    let status = subschema::<EventStatus>(&mut g);
    let error = subschema::<ApiError>(&mut g);
    let journal = subschema::<JournalPage>(&mut g);
    let reloaded = subschema::<Reloaded>(&mut g);
    let history = subschema::<DestinationHistory>(&mut g);
    let leased = subschema::<Leased>(&mut g);
    let settle_body = subschema::<Settle>(&mut g);
    let settled = subschema::<Settled>(&mut g);
    let schemas: Map<String, Value> = g.take_definitions(true).into_iter().collect();

    let json_body = |schema: &Value, description: &str| json!({ "description": description, "content": { "application/json": { "schema": schema } } });
    let text = |description: &str| json!({ "description": description, "content": { "text/plain": { "schema": { "type": "string" } } } });
    let err = |description: &str| json_body(&error, description);
    // Every `/admin` operation: the token, and what any of them may answer.
    let admin = |summary: &str, params: Vec<Value>, ok: Value, mut more: Map<String, Value>| {
        more.insert("200".into(), ok);
        more.insert("401".into(), err("no or wrong `Authorization: Bearer` admin token"));
        more.insert(
            "403".into(),
            err("the relay has no admin token configured; or the token's role or destinations \
                 do not allow this (the message names the role needed)"),
        );
        more.insert(
            "429".into(),
            err("this client gave too many wrong tokens within a minute (admin or pull \
                 tokens; admin.wrong_tokens_per_minute): refused unread until the minute ends; \
                 `Retry-After` says when"),
        );
        more.insert("500".into(), err("the store could not be read or written"));
        json!({
            "summary": summary,
            "security": [{ "admin_token": [] }],
            "parameters": params,
            "responses": more,
        })
    };
    let query = |name: &str, schema: Value, description: &str| json!({ "name": name, "in": "query", "required": false, "schema": schema, "description": description });
    // The pull API, on the public listener (`ingress.listen`), with a pull
    // destination's own token.
    let public = json!([{ "url": "http://{ingress}", "description": "the public listener (ingress.listen)", "variables": { "ingress": { "default": "127.0.0.1:8080" } } }]);
    let pull_name = json!({ "name": "destination", "in": "path", "required": true, "schema": { "type": "string" }, "description": "a destination with kind = \"pull\"" });
    let pull = |summary: &str,
                params: Vec<Value>,
                body: Option<&Value>,
                ok: Value,
                more: &[(&str, &str)]| {
        let mut responses = Map::new();
        responses.insert("200".into(), ok);
        responses.insert("400".into(), err("a bad query or body, said how"));
        responses.insert(
            "401".into(),
            err("no or wrong `Authorization: Bearer` token of this pull destination"),
        );
        responses.insert("404".into(), err("no pull destination of this name"));
        responses.insert(
            "429".into(),
            err("this client gave too many wrong tokens within a minute (pull or admin \
                 tokens, or names of no pull destination; admin.wrong_tokens_per_minute): \
                 refused unread until the minute ends; `Retry-After` says when"),
        );
        responses.insert("503".into(), err("the store cannot answer now: try again shortly"));
        for (code, why) in more {
            responses.insert((*code).into(), json_body(&settled, why));
        }
        let mut op = json!({ "summary": summary, "security": [{ "pull_token": [] }], "parameters": params, "responses": responses });
        if let Some(body) = body {
            op["requestBody"] =
                json!({ "required": true, "content": { "application/json": { "schema": body } } });
        }
        json!({ "servers": public.clone(), "post": op })
    };
    let path_param = |name: &str, schema: Value, description: &str| json!({ "name": name, "in": "path", "required": true, "schema": schema, "description": description });
    let with = |codes: &[(&str, &str)]| {
        let mut m = Map::new();
        for (code, why) in codes {
            m.insert((*code).into(), err(why));
        }
        m
    };
    let limit = query(
        "limit",
        json!({ "type": "integer", "minimum": 1, "maximum": 1000, "default": 50 }),
        "page size",
    );
    let after = query(
        "after",
        event_id.clone(),
        "continue after this id (the previous page's `next_after`)",
    );
    let name = |what: &str| json!({ "type": "string", "description": what });
    let source = query("source", name("a configured source"), "only events of this source");
    let event = query("event", name("an event name"), "only events with this name");
    let destination = query(
        "destination",
        name("a configured destination"),
        "only deliveries to this destination",
    );
    let id = path_param("id", event_id.clone(), "the event's id");
    let dest_name = path_param("name", name("a configured destination"), "the destination");

    // What a listing or a bulk operation answers to a malformed filter.
    let bad_query = with(&[("400", "a parameter is malformed or out of range")]);
    let mut replay_op = admin(
        "Deliver an event again, to the destinations it was routed to or to those named",
        vec![id.clone()],
        json_body(&event_replayed, "the deliveries scheduled again"),
        with(&[
            ("400", "the id is malformed or a destination is unknown"),
            ("404", "no such event"),
            (
                "409",
                "the event was never dispatched, or routed nowhere and no destination was named",
            ),
        ]),
    );
    replay_op["requestBody"] = json!({ "required": false, "content": { "application/json": { "schema": replay_request } } });
    let since = query(
        "since",
        json!({ "type": "string", "format": "date-time" }),
        "only those of events received at or after this time (RFC 3339)",
    );
    let until = query(
        "until",
        json!({ "type": "string", "format": "date-time" }),
        "only those of events received before this time (RFC 3339)",
    );
    let dead_filters = vec![
        source.clone(),
        event.clone(),
        destination.clone(),
        since.clone(),
        until.clone(),
        after.clone(),
        limit.clone(),
    ];
    let journal_params = vec![
        query(
            "since",
            json!({ "type": "string", "format": "date-time" }),
            "only changes at or after this time (RFC 3339)",
        ),
        query(
            "until",
            json!({ "type": "string", "format": "date-time" }),
            "only changes before this time (RFC 3339)",
        ),
        query("who", name("an admin token's name"), "only this token's changes"),
        query(
            "action",
            json!({ "type": "string", "enum": ["replay", "discard", "pause", "resume", "hook_sync", "sign_in", "sign_out", "sign_in_failed", "reload", "backup"] }),
            "only this kind of change",
        ),
        query(
            "before",
            json!({ "type": "string", "pattern": "^[0-9a-f]{16}-[0-9a-f]{16}$" }),
            "continue after this entry (the previous page's `next_before`)",
        ),
        limit.clone(),
    ];
    let chosen = |summary: &str, answer: &Value, what: &str| {
        let mut op = admin(summary, vec![], json_body(answer, what), bad_query.clone());
        op["requestBody"] =
            json!({ "required": true, "content": { "application/json": { "schema": selection } } });
        op
    };

    let mut preview_op = admin(
        "What a destination would make of a stored event (its filter's verdict, the body its transform gives), with its own jq programs or those given; writes and sends nothing",
        vec![dest_name.clone()],
        json_body(&preview, "the verdict and the body"),
        with(&[
            ("400", "the body is not a preview request, or a program given does not compile (with its position)"),
            ("404", "no such destination or event"),
            ("409", "the event has no body (rejected)"),
        ]),
    );
    preview_op["requestBody"] = json!({ "required": true, "content": { "application/json": { "schema": preview_request } } });

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "hookrelay admin API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The admin listener of a hookrelay relay (`admin.listen`): stored events, deliveries, dead letters, destinations and the upstream hooks. Times are RFC 3339 in UTC with microseconds. Every `/admin` path needs `Authorization: Bearer <admin.token>`.",
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": { "pull_token": { "type": "http", "scheme": "bearer", "description": "the token of the pull destination named in the path (its token, token_file or token_env)" }, "admin_token": { "type": "http", "scheme": "bearer", "description": "admin.token (the admin named `admin`) or one of admin.tokens, each with a role: viewer (reads all but events' bodies and headers), operator (a viewer who may also replay, discard, pause, resume and sync hooks), admin (everything); a viewer or operator may be scoped to some destinations" } },
        },
        "paths": {
            "/healthz": { "get": { "summary": "Liveness: the process serves HTTP", "responses": { "200": text("ok") } } },
            "/readyz": { "get": { "summary": "Readiness: the store is open and recovery done",
                "responses": { "200": text("ready"), "503": text("not ready, and why") } } },
            "/metrics": { "get": { "summary": "Prometheus metrics (text exposition format)",
                "responses": { "200": text("the metrics") } } },
            "/admin/openapi.json": { "get": admin("This document", vec![],
                json!({ "description": "the OpenAPI document", "content": { "application/json": { "schema": { "type": "object" } } } }),
                Map::new()) },
            "/admin/events": { "get": admin("Stored events, newest first",
                vec![source.clone(), event.clone(),
                     query("status", status, "only events in this state"),
                     query("resource", json!({ "type": "string", "pattern": "^[^/]+/.+$" }),
                        "only events about this resource, `type/id` (e.g. `actions/5`), each with its deliveries' states"),
                     json!({ "name": "record", "in": "query", "required": false, "deprecated": true,
                        "schema": { "type": "string", "pattern": "^[^/]+/.+$" },
                        "description": "the name of `resource` in the first builds, still accepted" }),
                     query("since", json!({ "type": "string", "format": "date-time" }),
                        "only events received at or after this time (RFC 3339)"),
                     query("until", json!({ "type": "string", "format": "date-time" }),
                        "only events received before this time (RFC 3339)"),
                     query("delivery", json!({ "type": "string", "enum": ["pending", "retrying", "delivered", "dead", "discarded", "held", "filtered", "superseded"] }),
                        "only events whose most urgent delivery state (`worst_delivery`) is this one; such a page may hold fewer than `limit` events: follow `next_after`"),
                     after.clone(), limit.clone()],
                json_body(&event_page, "one page of events"), bad_query.clone()) },
            "/admin/events/{id}": { "get": admin("One event: headers, body, dedup outcome, deliveries and attempts",
                vec![id.clone()], json_body(&event_detail, "the event"),
                with(&[("400", "the id is malformed"), ("404", "no such event")])) },
            "/admin/events/{id}/replay": { "post": replay_op },
            "/admin/dead-letters": {
                "get": admin("Dead deliveries, newest event first", dead_filters.clone(),
                    json_body(&dead_page, "one page of dead letters"), bad_query.clone()),
                "delete": admin("Delete every matching dead letter (it becomes `discarded`: never retried)",
                    dead_filters.clone(), json_body(&deleted, "how many were deleted"), bad_query.clone()),
            },
            "/admin/dead-letters/replay": { "post": admin("Replay every matching dead letter", dead_filters,
                json_body(&replayed, "how many were replayed"), bad_query.clone()) },
            "/admin/dead-letters/selection/replay": { "post": chosen("Replay the chosen dead letters (those still dead)",
                &replayed, "how many were replayed") },
            "/admin/dead-letters/selection/discard": { "post": chosen("Discard the chosen dead letters (they become `discarded`)",
                &deleted, "how many were discarded") },
            "/admin/audit": { "get": admin("Every callback received in a window accounted for, per source and event and per destination, from the ledger kept as the states change (windows are widened to whole hours of receive time). Right after a restart of the embedded store it answers once the inbox is counted (seconds per million events a flood left undispatched)",
                vec![query("since", json!({ "type": "string", "format": "date-time" }),
                        "events received at or after this time (RFC 3339); default: a day before `until`"),
                     query("until", json!({ "type": "string", "format": "date-time" }),
                        "events received before this time (RFC 3339); default: now"),
                     query("source", json!({ "type": "string" }),
                        "only this source's events (destinations are counted over every source)")],
                json_body(&audit, "the audit and whether it balances"),
                with(&[("400", "a time is malformed, since is not before until, or the window spans over a year")])) },
            "/admin/overview": { "get": admin("Callbacks per source (since this relay started), storage and fleet", vec![],
                json_body(&overview, "the overview"), Map::new()) },
            "/admin/destinations": { "get": admin("Every destination: paused, circuit, queue, its last minute", vec![],
                json_body(&destinations, "the destinations"), Map::new()) },
            "/admin/destinations/history": { "get": admin("Each destination's last hour as this relay sampled it every 10 s (the console's charts): its backlog, how long the oldest of it has waited, its deliveries per minute",
                vec![], json_body(&history, "the samples, oldest first"), Map::new()) },
            "/admin/destinations/{name}/pause": { "post": admin("Hold a destination's deliveries (on every relay sharing the store)",
                vec![dest_name.clone()], json_body(&paused, "paused"), with(&[("404", "no such destination")])) },
            "/admin/destinations/{name}/resume": { "post": admin("Release a paused destination",
                vec![dest_name], json_body(&paused, "resumed"), with(&[("404", "no such destination")])) },
            "/admin/destinations/{name}/preview": { "post": preview_op },
            "/admin/hooks": { "get": admin("The upstream accounts and their hooks, as of the last reconcile by any relay", vec![],
                json_body(&accounts, "the accounts"), Map::new()) },
            "/admin/hooks/sync": { "post": admin("Reconcile every account now", vec![],
                json_body(&accounts, "the accounts after the pass"), Map::new()) },
            "/admin/reload": { "post": admin(
                "Read the configuration file again and put it in force without a restart, as SIGHUP does (admin role): destinations, routes, filters and transforms, retry, rate and circuit settings, sources, upstream accounts, retention, admin tokens and roles. Attempts in flight finish under the settings they started with; a removed destination's deliveries are held. Journalled",
                vec![],
                json_body(&reloaded, "in force (or unchanged)"),
                with(&[("409", "nothing changed: the file does not load or validate (the problems named), or it changes a key only a restart changes (listeners, storage, log, telemetry: the key named); the running configuration stays")])) },
            "/admin/backup": { "get": admin(
                "A backup of the running embedded store (the admin role): one consistent snapshot of every tree, streamed as it is read, ending in its SHA-256 (`hookrelay backup --to FILE` saves and checks it; `hookrelay restore` puts it back). On sled, writes wait while it is read. Journalled",
                vec![],
                json!({ "description": "the backup (docs/deploy.md, \"Backups\")", "content": { "application/octet-stream": { "schema": { "type": "string", "format": "binary" } } } }),
                with(&[("409", "the store is PostgreSQL: use pg_dump")])) },
            "/pull/{destination}/lease": pull(
                "Lease up to `max` due deliveries of a pull destination for `lease` (on the public listener): each resource's next only once its previous one is acknowledged; one not acknowledged by the lease's end is due again and leased anew",
                vec![pull_name.clone(),
                     query("max", json!({ "type": "integer", "minimum": 1, "maximum": 1000, "default": 100 }), "most deliveries to lease"),
                     query("lease", json!({ "type": "string", "default": "30s" }), "how long the lease holds (1s to 1h; `30s`, `5m`)")],
                None,
                json_body(&leased, "the deliveries leased (maybe none)"),
                &[]),
            "/pull/{destination}/ack": pull(
                "Acknowledge leased deliveries: each is delivered. An id whose lease expired is refused (the delivery is due again), the others are still taken",
                vec![pull_name.clone()],
                Some(&settle_body),
                json_body(&settled, "every id recorded"),
                &[("409", "some ids refused, each with why (a lease expired or no longer held, an id no lease gave); the others recorded")]),
            "/pull/{destination}/nack": pull(
                "Give leased deliveries back as failed attempts: each is due again after `delay` (or the destination's backoff), and dead once its retry policy gives up",
                vec![pull_name],
                Some(&settle_body),
                json_body(&settled, "every id recorded"),
                &[("409", "some ids refused, each with why; the others recorded")]),
            "/admin/journal": { "get": admin(
                "Every change made through the admin API or the console (replays, discards, pauses, resumes, hook syncs, reloads, sign-ins), by any relay sharing the store, newest first",
                journal_params,
                json_body(&journal, "a page of the journal"),
                bad_query.clone()) },
        },
    })
}

/// `T`'s schema as a `$ref` into `components/schemas` (where `g` collects it).
fn subschema<T: JsonSchema>(g: &mut SchemaGenerator) -> Value {
    serde_json::to_value(g.subschema_for::<T>()).unwrap_or(Value::Null)
}

/// The document as committed (`docs/openapi.json`): pretty, with a final newline.
pub(crate) fn pretty() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_document_is_up_to_date() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/openapi.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == pretty(),
            "docs/openapi.json is not what this build serves: run `cargo run -- openapi > docs/openapi.json`"
        );
    }

    #[test]
    fn every_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(schemas.contains_key(name), "dangling $ref {name}");
        }
        assert!(schemas.contains_key("EventSummary") && schemas.contains_key("Delivery"));
    }
}
