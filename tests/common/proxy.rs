//! A forwarding proxy in front of the relay's ingress, so that a test can make the
//! relay look broken to the upstream (answer 500) without touching the relay.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

struct State {
    /// 0: forward; anything else: answer that status.
    fail_with: AtomicU16,
    target: Mutex<Option<SocketAddr>>,
    client: reqwest::Client,
}

/// A running proxy.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
}

async fn forward(req: HttpRequest, body: web::Bytes, state: web::Data<State>) -> HttpResponse {
    let status = state.fail_with.load(Ordering::SeqCst);
    if status != 0 {
        return HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
            .body("proxy says no");
    }
    let Some(target) = *state.target.lock().unwrap() else {
        return HttpResponse::BadGateway().body("no target yet");
    };
    let mut out = state.client.post(format!("http://{target}{}", req.uri()));
    if let Some(ct) = req.headers().get("content-type") {
        out = out.header("content-type", ct.to_str().unwrap_or(""));
    }
    match out.body(body.to_vec()).send().await {
        Ok(r) => {
            let code = actix_web::http::StatusCode::from_u16(r.status().as_u16()).unwrap();
            HttpResponse::build(code).body(r.bytes().await.unwrap_or_default())
        }
        Err(_) => HttpResponse::BadGateway().body("relay unreachable"),
    }
}

impl Proxy {
    pub async fn start() -> Proxy {
        let state = Arc::new(State {
            fail_with: AtomicU16::new(0),
            target: Mutex::new(None),
            client: reqwest::Client::new(),
        });
        let data = web::Data::from(state.clone());
        let server = HttpServer::new(move || {
            App::new().app_data(data.clone()).default_service(web::to(forward))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .bind("127.0.0.1:0")
        .unwrap();
        let addr = server.addrs()[0];
        tokio::spawn(server.run());
        Proxy { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn forward_to(&self, target: SocketAddr) {
        *self.state.target.lock().unwrap() = Some(target);
    }

    /// Answer `status` to everything (0: forward again).
    pub fn fail_with(&self, status: u16) {
        self.state.fail_with.store(status, Ordering::SeqCst);
    }
}
