//! `hookrelay reload`.

use serde_json::Value;

use super::*;

/// Asks the relay to read its configuration again (`POST /admin/reload`, as SIGHUP);
/// prints what changed. A reload refused or failed is an error (the API's 409, with
/// why), and nothing changed.
pub(in crate::cli) async fn reload(client: &AdminClient) -> anyhow::Result<(Value, String)> {
    let v = client.post("/admin/reload", None).await?;
    let r: api::Reloaded = typed(&v)?;
    let list = |names: &[String]| if names.is_empty() { "-".to_owned() } else { names.join(", ") };
    let rows = vec![
        vec!["result".to_owned(), r.result.clone()],
        vec!["added".to_owned(), list(&r.added)],
        vec!["changed".to_owned(), list(&r.changed)],
        vec!["removed".to_owned(), list(&r.removed)],
        vec!["sources changed".to_owned(), r.sources.to_string()],
        vec!["tokens changed".to_owned(), r.tokens.to_string()],
        vec!["fingerprint".to_owned(), r.fingerprint.clone()],
    ];
    Ok((v, table::render(&["", ""], &rows)))
}
