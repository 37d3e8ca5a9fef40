//! `GET /admin/backup`: a backup of the running embedded store, streamed as it is read
//! (`store/backup.rs` is its format; `hookrelay backup --to FILE` saves and checks it).
//! Journalled: a backup holds every body, and who took one is a question with weight.

use std::io::Write;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use bytes::Bytes;
use tokio::sync::{mpsc, watch};

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
    let out = Chunks {
        tx: tx.clone(),
        buf: Vec::with_capacity(CHUNK),
        stopping: state.backups.stop.subscribe(),
        runtime: tokio::runtime::Handle::current(),
    };
    let store = state.store.clone();
    let who = who.into_inner();
    state.backups.tasks.spawn(async move {
        let taken = store.backup(Box::new(out)).await;
        let (count, result) = match &taken {
            Ok((entries, _, _)) => (*entries, Ok(())),
            Err(e) => (0, Err(e.to_string())),
        };
        if let Err(e) = &taken {
            // The response ends without its checksum: the file it makes fails its check.
            // Not waited for: a client that stopped reading has the channel full.
            let _ = tx.try_send(Err(std::io::Error::other(e.to_string())));
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

/// The backups being streamed, with an owner: the relay's stop ends them
/// ([`Backups::stop`]) before it stops the admin listener. Without it, a client that
/// stopped reading held the listener's graceful stop, and so the relay's, for the
/// whole grace, and the backup cut then was never journalled (the store was closed
/// under it).
#[derive(Default)]
pub(crate) struct Backups {
    tasks: crate::store::Tasks,
    /// Set by the stop: each backup's next write fails.
    stop: watch::Sender<bool>,
}

impl Backups {
    /// Ends every backup running (its next write fails, "the relay is stopping", a
    /// write waiting for its client too) and waits up to `within` for each to end and
    /// journal itself; aborts those left. Returns how many were running: their
    /// connections are the caller's to cut (their bodies end without a checksum).
    pub(crate) async fn stop(&self, within: Duration) -> usize {
        self.stop.send_replace(true);
        self.tasks.finish(within).await
    }
}

/// The backup's bytes, handed to the response in chunks; writing fails once the
/// client is gone or the relay stops (the backup stops). Used on the blocking pool
/// only.
struct Chunks {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
    /// The owner's stop ([`Backups::stop`]).
    stopping: watch::Receiver<bool>,
    /// Where a chunk waits for room in the channel, or for the stop.
    runtime: tokio::runtime::Handle,
}

impl Chunks {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        let (tx, stopping) = (&self.tx, &mut self.stopping);
        self.runtime.block_on(async {
            tokio::select! {
                sent = tx.send(Ok(chunk)) => sent.map_err(|_| {
                    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
                }),
                // Not `Interrupted`, which `write_all` retries.
                _ = stopping.wait_for(|stop| *stop) => {
                    Err(std::io::Error::other("the backup was cut: the relay is stopping"))
                }
            }
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
