//! `GET /admin/backup`: a backup of the running embedded store, streamed as it is read
//! (`store/backup.rs` is its format; `hookrelay backup --to FILE` saves and checks it).
//! Journalled: a backup holds every body, and who took one is a question with weight.

use std::io::Write;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use bytes::Bytes;
use tokio::sync::mpsc;

use super::AdminState;
use crate::access::journal::Action;
use crate::api::error;

/// Bytes handed to the response at a time.
const CHUNK: usize = 256 * 1024;

/// The store's backup, as it is read; 409 on a store that is not embedded.
pub(super) async fn download(state: web::Data<AdminState>, who: super::Who) -> HttpResponse {
    if !state.backend.is_embedded() {
        return error(
            StatusCode::CONFLICT,
            "a backup is taken of the embedded store: on PostgreSQL use pg_dump (docs/deploy.md)",
        );
    }
    let (tx, mut rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let out = Chunks { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) };
    let store = state.store.clone();
    let who = who.into_inner();
    tokio::spawn(async move {
        let taken = store.backup(Box::new(out)).await;
        let (count, result) = match &taken {
            Ok((entries, _, _)) => (*entries, Ok(())),
            Err(e) => (0, Err(e.to_string())),
        };
        if let Err(e) = &taken {
            // The response ends without its checksum: the file it makes fails its check.
            let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
        }
        let target = match &taken {
            Ok((_, bytes, sha256)) => serde_json::json!({ "bytes": bytes, "sha256": sha256 }),
            Err(_) => serde_json::json!({}),
        };
        who.record(Action::Backup, target, count, result).await;
    });
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let name = format!("attachment; filename=\"hookrelay-{}.backup\"", crate::clock::now_us());
    HttpResponse::Ok()
        .content_type("application/octet-stream")
        .insert_header(("Content-Disposition", name))
        .streaming(body)
}

/// The backup's bytes, handed to the response in chunks; writing fails once the
/// client is gone (the backup stops). Used on the blocking pool only.
struct Chunks {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Chunks {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx.blocking_send(Ok(chunk)).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
        })
    }
}

impl Write for Chunks {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}
