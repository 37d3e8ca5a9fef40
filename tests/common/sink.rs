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
    /// The status the sink answered (or will, for a slow answer).
    pub status: u16,
    /// When the answer went out (or the handler was dropped); `None` while pending.
    pub answered: Option<Instant>,
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
    /// Alternate between this status and 200 every `period` (a flapping consumer).
    Flap {
        status: u16,
        period: Duration,
        since: Instant,
    },
}

#[derive(Default)]
struct State {
    received: Vec<Received>,
    mode: Option<Mode>,
    /// Requests being answered now, and the most there ever were at once.
    in_flight: usize,
    max_in_flight: usize,
    /// Counts requests without keeping them (a bench's millions).
    count_only: bool,
    counted: usize,
}

/// Ends a request's stay in flight when its handler ends or is dropped, and notes
/// when it was answered.
struct InFlight {
    state: web::Data<Mutex<State>>,
    /// Its entry in `received`.
    index: usize,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.state.lock().unwrap();
        s.in_flight -= 1;
        if let Some(r) = s.received.get_mut(self.index) {
            r.answered = Some(Instant::now());
        }
    }
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
    answer(req, body, &state).await
}

async fn answer(
    req: HttpRequest,
    body: web::Bytes,
    state: &web::Data<Mutex<State>>,
) -> HttpResponse {
    let mode = {
        let mut s = state.lock().unwrap();
        let mode = s.mode.clone().unwrap_or(Mode::Ok);
        let status = match &mode {
            Mode::Ok | Mode::Slow(_) => 200,
            Mode::Status(code) => *code,
            Mode::RetryAfter(_) => 429,
            Mode::FailIfContains(text, code) => {
                if String::from_utf8_lossy(&body).contains(text.as_str()) {
                    *code
                } else {
                    200
                }
            }
            Mode::Flap { status, period, since } => {
                let phase = since.elapsed().as_millis() / period.as_millis().max(1);
                if phase % 2 == 0 {
                    *status
                } else {
                    200
                }
            }
        };
        let index = s.received.len();
        if s.count_only {
            // Nothing kept: `index` names no entry, so nothing is noted when answered.
            s.counted += 1;
        } else {
            s.received.push(Received {
                answered: None,
                at: Instant::now(),
                headers: req
                    .headers()
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                    .collect(),
                body: body.to_vec(),
                status,
            });
        }
        let mode = match mode {
            Mode::Flap { .. } => Mode::Status(status),
            other => other,
        };
        (mode, index)
    };
    let (mode, index) = mode;
    let _answered = InFlight { state: state.clone(), index };
    match mode {
        Mode::Ok => HttpResponse::Ok().body("thanks"),
        Mode::Status(s) => HttpResponse::build(actix_web::http::StatusCode::from_u16(s).unwrap())
            .body(format!("sink says {s}")),
        // Resolved to a status when the request arrived.
        Mode::Flap { .. } => HttpResponse::Ok().body("thanks"),
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

    /// Starts a sink that counts what it receives without keeping it (a bench's
    /// millions of requests): [`Sink::count`] and [`Sink::wait_for`] work, `received`
    /// is empty.
    pub async fn start_counting() -> Sink {
        let sink = Self::start().await;
        sink.state.lock().unwrap().count_only = true;
        sink
    }

    /// Starts a sink on `addr` (e.g. the port of a sink that was stopped). A port of
    /// a stopped sink is an ephemeral one, which an outgoing connection may hold for a
    /// moment as its local port (the relay's own retries to the stopped sink among
    /// them): the bind is tried again for up to 10 s before the test fails.
    pub async fn start_on(addr: SocketAddr) -> Sink {
        let state = Arc::new(Mutex::new(State::default()));
        let deadline = Instant::now() + Duration::from_secs(10);
        let server = loop {
            // The server is not `Send`: it lives in this block only, not across the
            // wait below.
            let e = {
                let data = web::Data::from(state.clone());
                let bound = HttpServer::new(move || {
                    App::new()
                        .app_data(data.clone())
                        .app_data(web::PayloadConfig::new(64 << 20))
                        .default_service(web::to(handle))
                })
                .workers(1)
                .disable_signals()
                .shutdown_timeout(1)
                .bind(addr);
                match bound {
                    Ok(server) => break server,
                    Err(e) => e,
                }
            };
            assert!(
                addr.port() != 0 && Instant::now() < deadline,
                "the sink cannot listen on {addr}: {e}"
            );
            eprintln!("the sink's port {addr} is taken ({e}); trying again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
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
        let s = self.state.lock().unwrap();
        s.received.len() + s.counted
    }

    /// Stops listening without giving up what it received (read it afterwards).
    pub async fn halt(&self) {
        self.handle.stop(false).await;
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

/// A loopback port that refuses connections for as long as the test process lives:
/// a socket bound to it and never listening holds it, so no other test's server can
/// take it meanwhile ([`closed_port`] only knows it was free once).
pub fn refused_port() -> SocketAddr {
    // SAFETY: plain socket calls on a descriptor this function owns; it is leaked on
    // purpose (the port stays reserved until the process ends).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let mut addr: libc::sockaddr_in = std::mem::zeroed();
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let rc = libc::bind(fd, std::ptr::addr_of!(addr).cast(), len);
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        let mut bound: libc::sockaddr_in = std::mem::zeroed();
        let mut blen = len;
        let rc = libc::getsockname(fd, std::ptr::addr_of_mut!(bound).cast(), &mut blen);
        assert_eq!(rc, 0, "getsockname: {}", std::io::Error::last_os_error());
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, u16::from_be(bound.sin_port)))
    }
}

/// A loopback port nobody listens on (bound, then released: a test that starts a
/// server on it later may; another test's server may take it too, see [`refused_port`]).
pub fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}
