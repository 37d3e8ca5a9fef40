//! `hookrelay events` and `hookrelay dead-letters`.

use serde_json::{json, Value};

use super::*;
use crate::cli::admin::{DeadFilter, DeadLetters, Events};

pub(in crate::cli) async fn events(
    client: &AdminClient,
    cmd: Events,
) -> anyhow::Result<(Value, String)> {
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

pub(in crate::cli) async fn dead_letters(
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
