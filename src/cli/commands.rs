//! Each admin command against the API: its request, and its answer read into the
//! API's types (`crate::api`) and printed as a table.

use anyhow::Context;
use serde_json::{json, Value};

use super::admin::{AuditArgs, DeadFilter, DeadLetters, Destinations, Events, Hooks};
use super::client::{query, AdminClient};
use super::table;
use crate::api;

/// The answer as this CLI's build of the API types (`crate::api`): a relay of another
/// version that answers differently is named, not misprinted.
pub(super) fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> anyhow::Result<T> {
    T::deserialize(v).context(
        "the relay's answer does not match this hookrelay's admin API (a different version?); --json prints it as is",
    )
}

/// An optional value, or `-`.
fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), ToString::to_string)
}

/// A queue's number, `≥n` while the relay still counts the queue after a restart.
fn at_least(n: u64, counting: bool) -> String {
    if counting {
        format!("≥{n}")
    } else {
        n.to_string()
    }
}

/// A value as its JSON word (`dispatched`, `half_open`).
fn word<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Comma-separated words, or `-` for none.
fn words<T: serde::Serialize>(v: &[T]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.iter().map(word).collect::<Vec<_>>().join(",")
    }
}

/// `crm=delivered,erp=retrying`, or `-` for none.
fn delivery_states(v: Option<&[api::DeliveryStatus]>) -> String {
    let states: Vec<String> = v
        .unwrap_or_default()
        .iter()
        .map(|d| format!("{}={}", d.destination, word(&d.state)))
        .collect();
    if states.is_empty() {
        "-".into()
    } else {
        states.join(",")
    }
}

pub(super) async fn events(client: &AdminClient, cmd: Events) -> anyhow::Result<(Value, String)> {
    match cmd {
        Events::List { source, event, status, resource, limit, after } => {
            let by_resource = resource.is_some();
            let q = query(&[
                ("source", source),
                ("event", event),
                ("status", status),
                ("resource", resource),
                ("limit", Some(limit.to_string())),
                ("after", after),
            ]);
            let v = client.get(&format!("/admin/events{q}")).await?;
            let page: api::EventPage = typed(&v)?;
            let rows: Vec<Vec<String>> = page
                .events
                .iter()
                .map(|e| {
                    let mut row = vec![
                        e.id.to_string(),
                        e.received_at.clone(),
                        e.source.clone(),
                        e.event.clone(),
                        word(&e.status),
                        e.size.to_string(),
                        words(&e.flags),
                    ];
                    if by_resource {
                        row.push(delivery_states(e.deliveries.as_deref()));
                    }
                    row
                })
                .collect();
            let mut header = vec!["ID", "RECEIVED", "SOURCE", "EVENT", "STATUS", "SIZE", "FLAGS"];
            if by_resource {
                header.push("DELIVERIES");
            }
            let mut text = table::render(&header, &rows);
            if let Some(next) = page.next_after {
                text.push_str(&format!("more: --after {next}\n"));
            }
            Ok((v, text))
        }
        Events::Show { id } => {
            let v = client.get(&format!("/admin/events/{id}")).await?;
            let e: api::EventDetail = typed(&v)?;
            let m = &e.summary;
            let mut text = format!(
                "event {}  {} from {}  status {}  received {}  {} bytes  flags {}\n",
                m.id,
                m.event,
                m.source,
                word(&m.status),
                m.received_at,
                m.size,
                words(&m.flags)
            );
            if let Some(original) = m.duplicate_of {
                text.push_str(&format!("duplicate of {original}\n"));
            }
            if let Some(resource) = &m.resource {
                text.push_str(&format!("about {resource}\n"));
            }
            let rows: Vec<Vec<String>> = e
                .delivery_records
                .iter()
                .map(|d| {
                    vec![
                        d.destination.clone(),
                        word(&d.state),
                        d.total_attempts.to_string(),
                        opt(&d.last_status),
                        opt(&d.last_error),
                        opt(&d.next_attempt_at),
                    ]
                })
                .collect();
            text.push_str(&table::render(
                &["DESTINATION", "STATE", "ATTEMPTS", "LAST STATUS", "LAST ERROR", "NEXT ATTEMPT"],
                &rows,
            ));
            let encoding = e.body_encoding.as_ref().map_or_else(|| "-".into(), word);
            text.push_str(&format!("body ({encoding}):\n{}\n", opt(&e.body)));
            Ok((v, text))
        }
        Events::Replay { id, destinations } => {
            let request = api::ReplayRequest {
                destinations: (!destinations.is_empty()).then_some(destinations),
            };
            let body = request.destinations.is_some().then(|| json!(request));
            let v = client.post(&format!("/admin/events/{id}/replay"), body).await?;
            let done: api::EventReplayed = typed(&v)?;
            let text = format!("event {id} replayed to {}\n", done.destinations.join(","));
            Ok((v, text))
        }
    }
}

pub(super) async fn dead_letters(
    client: &AdminClient,
    cmd: DeadLetters,
) -> anyhow::Result<(Value, String)> {
    let q = |f: DeadFilter, limit: Option<usize>| {
        query(&[
            ("source", f.source),
            ("event", f.event),
            ("destination", f.destination),
            ("limit", limit.map(|l| l.to_string())),
        ])
    };
    match cmd {
        DeadLetters::List { filter, limit } => {
            let v = client.get(&format!("/admin/dead-letters{}", q(filter, Some(limit)))).await?;
            let page: api::DeadLetterPage = typed(&v)?;
            let rows: Vec<Vec<String>> = page
                .dead_letters
                .iter()
                .map(|d| {
                    vec![
                        d.event.to_string(),
                        d.destination.clone(),
                        d.total_attempts.to_string(),
                        opt(&d.last_status),
                        opt(&d.last_error),
                    ]
                })
                .collect();
            let text = table::render(
                &["EVENT", "DESTINATION", "ATTEMPTS", "LAST STATUS", "LAST ERROR"],
                &rows,
            );
            Ok((v, text))
        }
        DeadLetters::Delete { filter } => {
            let v = client.delete(&format!("/admin/dead-letters{}", q(filter, None))).await?;
            let done: api::Deleted = typed(&v)?;
            Ok((v, format!("{} dead letters deleted\n", done.deleted)))
        }
        DeadLetters::Replay { filter } => {
            let v = client
                .post(&format!("/admin/dead-letters/replay{}", q(filter, None)), None)
                .await?;
            let done: api::Replayed = typed(&v)?;
            Ok((v, format!("{} dead letters replayed\n", done.replayed)))
        }
    }
}

pub(super) async fn destinations(
    client: &AdminClient,
    cmd: Destinations,
) -> anyhow::Result<(Value, String)> {
    match cmd {
        Destinations::List => {
            let v = client.get("/admin/destinations").await?;
            let list: api::DestinationList = typed(&v)?;
            let rows: Vec<Vec<String>> = list
                .destinations
                .iter()
                .map(|d| {
                    vec![
                        d.name.clone(),
                        match (d.paused, d.stalled) {
                            (true, _) => "paused".into(),
                            (false, true) => "STALLED".into(),
                            (false, false) => "active".into(),
                        },
                        word(&d.circuit),
                        d.in_flight.to_string(),
                        at_least(d.queue.pending, d.queue.counting),
                        at_least(d.queue.held, d.queue.counting),
                        at_least(d.queue.retrying, d.queue.counting),
                        at_least(d.queue.dead, d.queue.counting),
                        d.oldest_age_seconds.map_or("-".into(), |a| format!("{a:.0}s")),
                        d.url.clone(),
                    ]
                })
                .collect();
            let text = table::render(
                &[
                    "NAME",
                    "STATE",
                    "CIRCUIT",
                    "IN FLIGHT",
                    "PENDING",
                    "HELD",
                    "RETRYING",
                    "DEAD",
                    "OLDEST",
                    "URL",
                ],
                &rows,
            );
            Ok((v, text))
        }
        Destinations::Pause { name } | Destinations::Resume { name } if name.is_empty() => {
            anyhow::bail!("give a destination name")
        }
        Destinations::Pause { name } => {
            let v = client.post(&format!("/admin/destinations/{name}/pause"), None).await?;
            let done: api::Paused = typed(&v)?;
            Ok((v, format!("{} paused\n", done.name)))
        }
        Destinations::Resume { name } => {
            let v = client.post(&format!("/admin/destinations/{name}/resume"), None).await?;
            let done: api::Paused = typed(&v)?;
            Ok((v, format!("{} resumed\n", done.name)))
        }
        Destinations::Preview { destination, event, filter, transform } => {
            let request =
                serde_json::json!({ "event": event, "filter": filter, "transform": transform });
            let path = format!("/admin/destinations/{destination}/preview");
            let v = client.post(&path, Some(request)).await?;
            let p: api::Preview = typed(&v)?;
            Ok((v, preview_text(&p)))
        }
    }
}

pub(super) async fn hooks(client: &AdminClient, cmd: Hooks) -> anyhow::Result<(Value, String)> {
    let v = match cmd {
        Hooks::List => client.get("/admin/hooks").await?,
        Hooks::Sync => client.post("/admin/hooks/sync", None).await?,
    };
    let accounts: api::Accounts = typed(&v)?;
    if accounts.accounts.is_empty() {
        return Ok((v, "no upstream accounts configured\n".into()));
    }
    let mut text = String::new();
    for a in &accounts.accounts {
        let state = if a.ok { "ok".to_owned() } else { format!("FAILING: {}", a.errors.join(",")) };
        // How old the shown data is, and a warning when no relay reconciles any more.
        let age = match a.age_seconds {
            Some(secs) if a.stale => {
                format!(" ({secs}s ago, STALE: no relay has reconciled since)")
            }
            Some(secs) => format!(" ({secs}s ago)"),
            None => String::new(),
        };
        text.push_str(&format!(
            "{}/{}  {}  last reconcile {}{age}  foreign hooks {}\n",
            a.source,
            a.account,
            state,
            opt(&a.last_reconcile),
            a.foreign_hooks
        ));
        let rows: Vec<Vec<String>> = a
            .hooks
            .iter()
            .map(|h| {
                vec![
                    h.id.clone(),
                    h.event.clone(),
                    h.status.clone(),
                    h.triggered_count.to_string(),
                    opt(&h.last_triggered),
                ]
            })
            .collect();
        // triggeredCount is the upstream's, as the last reconcile listed it: say how old.
        let triggered = match a.age_seconds {
            Some(secs) => format!("TRIGGERED (AS OF {secs}s AGO)"),
            None => "TRIGGERED".to_owned(),
        };
        text.push_str(&table::render(
            &["ID", "EVENT", "STATUS", &triggered, "LAST TRIGGERED"],
            &rows,
        ));
        for c in &a.changes {
            text.push_str(&format!("  {} {} -> hook {}\n", c.action, c.event, c.hook_id));
        }
    }
    Ok((v, text))
}

/// A preview as text: the verdict, the programs, and the body that would be sent.
fn preview_text(p: &api::Preview) -> String {
    let mut out = match &p.reason {
        None => format!("{}: {} (event {})\n", p.destination, p.verdict, p.event),
        Some(reason) => format!("{}: {}: {reason} (event {})\n", p.destination, p.verdict, p.event),
    };
    for (which, code) in [("filter", &p.filter), ("transform", &p.transform)] {
        out.push_str(&format!("{which}: {}\n", code.as_deref().unwrap_or("none")));
    }
    match (&p.body, &p.body_error) {
        (_, Some(e)) => out.push_str(&format!("no body: {e} (the delivery would be dead)\n")),
        (Some(body), None) => {
            out.push_str(&format!(
                "content-type: {}\n\n",
                p.content_type.as_deref().unwrap_or("none")
            ));
            let pretty = serde_json::from_str::<Value>(body)
                .ok()
                .and_then(|v| serde_json::to_string_pretty(&v).ok());
            out.push_str(pretty.as_deref().unwrap_or(body));
            out.push('\n');
        }
        (None, None) => {}
    }
    out
}

/// A time as the CLI takes it: RFC 3339 as is, or a duration (`6h`, `7d`) ago.
fn time_arg(name: &str, text: Option<String>) -> anyhow::Result<Option<String>> {
    let Some(text) = text else { return Ok(None) };
    if crate::timefmt::parse(&text).is_some() {
        return Ok(Some(text));
    }
    let ago = humantime::parse_duration(text.trim()).map_err(|_| {
        anyhow::anyhow!(
            "--{name} {text:?}: give a time such as 2026-06-12T00:00:00Z, or how long ago such as 6h or 7d"
        )
    })?;
    let at = crate::clock::now().checked_sub(ago).unwrap_or(std::time::UNIX_EPOCH);
    Ok(Some(crate::timefmt::format_admin(at)))
}

pub(super) async fn audit(
    client: &AdminClient,
    args: AuditArgs,
) -> anyhow::Result<(Value, String)> {
    let q = query(&[
        ("since", time_arg("since", args.since)?),
        ("until", time_arg("until", args.until)?),
        ("source", args.source),
    ]);
    let v = client.get(&format!("/admin/audit{q}")).await?;
    let r: api::AuditReport = typed(&v)?;
    let verdict = if r.balanced { "balanced" } else { "DOES NOT BALANCE" };
    let mut text =
        format!("callbacks received {} .. {} (whole hours): {verdict}\n", r.since, r.until);
    if let Some(from) = &r.accounted_from {
        text.push_str(&format!(
            "note: the ledger starts at {from}; events received before it are not accounted\n"
        ));
    }
    let ok = |b: bool| if b { "ok".to_owned() } else { "NO".to_owned() };
    let rows: Vec<Vec<String>> = r
        .events
        .iter()
        .map(|e| {
            vec![
                e.source.clone(),
                e.event.clone(),
                e.received.to_string(),
                e.rejected.to_string(),
                e.unrouted.to_string(),
                e.duplicate.to_string(),
                e.routed.to_string(),
                e.waiting.to_string(),
                opt(&e.triggered),
                opt(&e.not_received),
                ok(e.balanced),
            ]
        })
        .collect();
    text.push_str(&table::render(
        &[
            "SOURCE",
            "EVENT",
            "RECEIVED",
            "REJECTED",
            "UNROUTED",
            "DUPLICATE",
            "ROUTED",
            "WAITING",
            "TRIGGERED",
            "NOT RECEIVED",
            "BALANCED",
        ],
        &rows,
    ));
    let rows: Vec<Vec<String>> = r
        .destinations
        .iter()
        .map(|d| {
            let mut row = vec![d.destination.clone(), d.routed.to_string()];
            row.extend(d.states().map(|n| n.to_string()));
            row.push(ok(d.balanced));
            row
        })
        .collect();
    text.push('\n');
    text.push_str(&table::render(
        &[
            "DESTINATION",
            "ROUTED",
            "DELIVERED",
            "FILTERED",
            "SUPERSEDED",
            "DEAD",
            "DISCARDED",
            "PENDING",
            "RETRYING",
            "HELD",
            "BALANCED",
        ],
        &rows,
    ));
    for line in &r.imbalances {
        text.push_str(&format!("does not balance: {line}\n"));
    }
    Ok((v, text))
}
