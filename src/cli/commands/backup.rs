//! `hookrelay backup --to FILE` and `--verify FILE`.

use std::path::Path;

use anyhow::Context;
use serde_json::{json, Value};

use super::*;
use crate::store::backup::{self, Summary};

/// Saves the running relay's backup (`GET /admin/backup`) to `to`: written beside it,
/// checked whole (structure, count, SHA-256), made durable, and only then named `to`,
/// so `to` is never a backup that fails its check.
pub(in crate::cli) async fn backup_to(
    client: &AdminClient,
    to: &Path,
) -> anyhow::Result<(Value, String)> {
    let partial = to.with_extension("partial");
    let mut file = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let written = client.download("/admin/backup", &mut file).await;
    let checked = written.and_then(|_| {
        file.sync_all().context("making the backup durable")?;
        let file = std::fs::File::open(&partial)?;
        backup::verify(file).context("the backup received fails its check: take it again")
    });
    let summary = match checked {
        Ok(summary) => summary,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, to).with_context(|| format!("naming it {}", to.display()))?;
    if let Some(dir) = to.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    Ok(described(to, &summary))
}

/// Checks the backup at `path` whole.
pub(in crate::cli) fn verify(path: &Path) -> anyhow::Result<(Value, String)> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let summary =
        backup::verify(file).with_context(|| format!("{} fails its check", path.display()))?;
    Ok(described(path, &summary))
}

/// A checked backup, as JSON and as text.
fn described(path: &Path, s: &Summary) -> (Value, String) {
    let taken = crate::timefmt::format_admin_us(s.header.created_at_us);
    let value = json!({
        "file": path.display().to_string(),
        "taken_at": taken,
        "engine": s.header.engine,
        "schema": s.header.schema,
        "entries": s.entries,
        "bytes": s.bytes,
        "sha256": s.sha256,
    });
    let text = format!(
        "{}: a sound backup of a {} store taken at {}: {} entries ({} bytes), sha256 {}\n",
        path.display(),
        s.header.engine,
        taken,
        s.entries,
        s.bytes,
        s.sha256
    );
    (value, text)
}
