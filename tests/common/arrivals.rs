//! The benchmarks' sink: an actix-web server on its own thread that notes when each
//! `webhook-id` first arrives and answers 200 at once (the test sink, `sink.rs`, keeps
//! whole requests, too slow to stand in for a consumer at benchmark rates).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

/// When each `webhook-id` first arrived.
pub type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

/// Starts the sink, noting arrivals in `arrivals`; its address.
pub fn start_sink(arrivals: Arrivals) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_web::rt::System::new().block_on(async move {
            let data = web::Data::new(arrivals);
            let server = HttpServer::new(move || {
                App::new().app_data(data.clone()).default_service(web::to(
                    |req: HttpRequest, _body: web::Bytes, seen: web::Data<Arrivals>| async move {
                        let now = Instant::now();
                        if let Some(id) =
                            req.headers().get("webhook-id").and_then(|v| v.to_str().ok())
                        {
                            seen.lock().unwrap().entry(id.to_owned()).or_insert(now);
                        }
                        HttpResponse::Ok().finish()
                    },
                ))
            })
            .workers(1)
            .bind("127.0.0.1:0")
            .unwrap();
            tx.send(server.addrs()[0]).unwrap();
            server.run().await.unwrap();
        });
    });
    rx.recv().unwrap()
}

/// A relay under test whose one destination is the sink, and that destination's name.
pub struct Contender {
    pub label: String,
    pub dest: String,
    pub relay: super::Relay,
    _dir: tempfile::TempDir,
}

impl Contender {
    /// Starts `bin` with the destination `dest` to `sink`, `settings` (lines of its
    /// `[[destinations]]` entry) added; the relay logs at info, actix-server at warn.
    pub async fn start(
        label: &str,
        bin: &str,
        sink: std::net::SocketAddr,
        dest: &str,
        settings: &str,
    ) -> Self {
        Self::start_with_storage(label, bin, sink, dest, settings, "").await
    }

    /// As [`Contender::start`], with `storage` (TOML lines) added to `[storage]`: a
    /// setting tried side by side with the shipped default.
    pub async fn start_with_storage(
        label: &str,
        bin: &str,
        sink: std::net::SocketAddr,
        dest: &str,
        settings: &str,
        storage: &str,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tail = format!(
            "\n[[destinations]]\nname = \"{dest}\"\nurl = \"http://{sink}/in\"\n{settings}"
        );
        let text = super::config_with(&dir.path().join("data"), "", &tail)
            .replace("level = \"info\"", "level = \"hookrelay=info,actix_server=warn\"")
            .replace("[storage]\n", &format!("[storage]\n{storage}\n"));
        let relay = super::Relay::start_binary(bin, dir.path(), &text).await;
        Self { label: label.to_owned(), dest: dest.to_owned(), relay, _dir: dir }
    }
}
