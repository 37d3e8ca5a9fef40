//! `hookrelay audit`.

use serde_json::Value;

use super::*;
use crate::cli::admin::AuditArgs;

pub(in crate::cli) async fn audit(
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
