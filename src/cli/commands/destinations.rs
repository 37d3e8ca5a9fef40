//! `hookrelay destinations` (with a preview) and `hookrelay hooks`.

use serde_json::Value;

use super::*;
use crate::cli::admin::{Destinations, Hooks};

pub(in crate::cli) async fn destinations(
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

pub(in crate::cli) async fn hooks(
    client: &AdminClient,
    cmd: Hooks,
) -> anyhow::Result<(Value, String)> {
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
