//! A downstream consumer for tests: a real HTTP server on loopback that records what
//! it receives and answers as told (200, an error status, slowly, 429 + Retry-After).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};

/// One request the sink received.
#[derive(Clone, Debug)]
pub struct Received {
    pub at: Instant,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// How the sink answers.
#[derive(Clone, Debug)]
pub enum Mode {
    Ok,
    Status(u16),
    /// Answer 429 with this `Retry-After` (seconds).
    RetryAfter(u64),
    /// Answer 200 after this long.
    Slow(Duration),
    /// Answer this status to requests whose body contains the text, 200 to others.
    FailIfContains(String, u16),
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    mode: Option<Mode>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: usize,
    max_in_flight: usize,
}

/// A running sink.
pub struct Sink {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    handle: actix_web::dev::ServerHandle,
}

async fn handle(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<Mutex<State>>,
) -> HttpResponse {
    {
        let mut s = state.lock().unwrap();
        s.in_flight += 1;
        s.max_in_flight = s.max_in_flight.max(s.in_flight);
    }
    let response = answer(req, body, &state).await;
    state.lock().unwrap().in_flight -= 1;
    response
}

async fn answer(req: HttpRequest, body: web::Bytes, state: &Mutex<State>) -> HttpResponse {
    let mode = {
        let mut s = state.lock().unwrap();
        s.received.push(Received {
            at: Instant::now(),
            headers: req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                .collect(),
            body: body.to_vec(),
        });
        s.mode.clone().unwrap_or(Mode::Ok)
    };
    match mode {
        Mode::Ok => HttpResponse::Ok().body("thanks"),
        Mode::Status(s) => HttpResponse::build(actix_web::http::StatusCode::from_u16(s).unwrap())
            .body(format!("sink says {s}")),
        Mode::RetryAfter(secs) => HttpResponse::TooManyRequests()
            .insert_header(("retry-after", secs.to_string()))
            .body("slow down"),
        Mode::FailIfContains(text, status) if String::from_utf8_lossy(&body).contains(&text) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).finish()
        }
        Mode::FailIfContains(..) => HttpResponse::Ok().body("thanks"),
        Mode::Slow(d) => {
            tokio::time::sleep(d).await;
            HttpResponse::Ok().body("thanks, eventually")
        }
    }
}

impl Sink {
    /// Starts a sink on a free port.
    pub async fn start() -> Sink {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts a sink on `addr` (e.g. the port of a sink that was stopped).
    pub async fn start_on(addr: SocketAddr) -> Sink {
        let state = Arc::new(Mutex::new(State::default()));
        let data = web::Data::from(state.clone());
        let server = HttpServer::new(move || {
            App::new().app_data(data.clone()).default_service(web::to(handle))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .bind(addr)
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        tokio::spawn(server);
        Sink { addr, state, handle }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.state.lock().unwrap().mode = Some(mode);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// The most requests the sink was answering at the same time.
    pub fn max_in_flight(&self) -> usize {
        self.state.lock().unwrap().max_in_flight
    }

    pub fn count(&self) -> usize {
        self.state.lock().unwrap().received.len()
    }

    /// Stops listening: afterwards connections to its port are refused.
    pub async fn stop(self) -> SocketAddr {
        self.handle.stop(false).await;
        self.addr
    }

    /// Waits until at least `n` requests arrived (panics after `timeout`).
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            // Counted, not copied, while waiting: a copy of every request every 10 ms
            // took a core of its own once a bench's sink held 100,000 of them.
            let got = self.count();
            if got >= n {
                return self.received();
            }
            assert!(Instant::now() < deadline, "sink got {got} of {n} requests in {timeout:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A loopback port nobody listens on (bound, then released).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}
