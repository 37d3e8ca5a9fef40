//! `hookrelay journal`.

use serde_json::Value;

use super::*;
use crate::cli::admin::JournalArgs;

pub(in crate::cli) async fn journal(
    client: &AdminClient,
    args: JournalArgs,
) -> anyhow::Result<(Value, String)> {
    let q = query(&[
        ("since", time_arg("since", args.since)?),
        ("until", time_arg("until", args.until)?),
        ("who", args.who),
        ("action", args.action),
        ("limit", Some(args.limit.to_string())),
    ]);
    let v = client.get(&format!("/admin/journal{q}")).await?;
    let page: api::JournalPage = typed(&v)?;
    let rows: Vec<Vec<String>> = page
        .entries
        .iter()
        .map(|e| {
            let who = if e.who.is_empty() { "-".to_owned() } else { e.who.clone() };
            vec![
                e.at.clone(),
                who,
                opt(&e.from),
                e.action.clone(),
                e.target.to_string(),
                e.count.to_string(),
                e.result.clone(),
            ]
        })
        .collect();
    let mut text = table::render(&["AT", "WHO", "FROM", "ACTION", "ON", "COUNT", "RESULT"], &rows);
    if page.next_before.is_some() {
        text.push_str("(more: narrow the window with --until, or raise --limit)\n");
    }
    Ok((v, text))
}
