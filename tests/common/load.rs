//! Callback load for the crash and outage tests: client tasks post distinct callbacks
//! until stopped, hold the relay to its contract (every answer is 200; a closed
//! connection is the refusal the upstream retries) and keep every acknowledged one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Acknowledged callbacks: the relay's id and the body sent.
pub type Acked = Arc<Mutex<Vec<(String, String)>>>;

/// Running clients; [`Load::stop`] ends them.
pub struct Load {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    pub acked: Acked,
    /// Callbacks that got no answer (refused, reset or closed connections).
    pub unanswered: Arc<std::sync::atomic::AtomicUsize>,
}

impl Load {
    /// `clients` tasks post `body(client, n)` in turn to `urls[(client + n) % len]`,
    /// waiting `pace` after each answer, into `acked`.
    pub fn start(
        clients: usize,
        urls: Vec<String>,
        pace: Duration,
        acked: Acked,
        body: impl Fn(usize, u64) -> String + Send + Sync + 'static,
    ) -> Load {
        Self::start_with(super::client(), clients, urls, pace, acked, body)
    }

    /// Like [`Load::start`], with `client` (one that opens a connection per callback,
    /// as the upstream does, say).
    pub fn start_with(
        client: reqwest::Client,
        clients: usize,
        urls: Vec<String>,
        pace: Duration,
        acked: Acked,
        body: impl Fn(usize, u64) -> String + Send + Sync + 'static,
    ) -> Load {
        let (stop, stopped) = watch::channel(false);
        let unanswered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (urls, body) = (Arc::new(urls), Arc::new(body));
        let tasks = (0..clients)
            .map(|k| {
                let (client, urls, body, acked, stopped) =
                    (client.clone(), urls.clone(), body.clone(), acked.clone(), stopped.clone());
                let unanswered = unanswered.clone();
                tokio::spawn(async move {
                    for n in 0u64.. {
                        if *stopped.borrow() {
                            return;
                        }
                        let text = body(k, n);
                        let url = &urls[(k + n as usize) % urls.len()];
                        let sent = client
                            .post(url)
                            .header("content-type", "application/json")
                            .body(text.clone())
                            .send()
                            .await;
                        match sent {
                            Ok(r) => {
                                // Any answer but 200 to a valid callback breaks the contract.
                                assert_eq!(r.status(), 200, "a valid callback got {}", r.status());
                                let v: serde_json::Value = r.json().await.expect("ack body");
                                let id = v["id"].as_str().expect("ack id").to_owned();
                                acked.lock().unwrap().push((id, text));
                            }
                            // Refused: the connection was closed, the upstream would retry.
                            Err(_) => {
                                unanswered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(10)).await
                            }
                        }
                        tokio::time::sleep(pace).await;
                    }
                })
            })
            .collect();
        Load { stop, tasks, acked, unanswered }
    }

    /// How many callbacks were acknowledged so far.
    pub fn acked_len(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// Stops the clients; panics if one saw an answer other than 200.
    pub async fn stop(self) -> Vec<(String, String)> {
        self.stop.send_replace(true);
        for task in self.tasks {
            task.await.expect("a client saw a non-200 answer");
        }
        self.acked.lock().unwrap().clone()
    }
}

/// Every acknowledged callback is stored with its exact body.
pub async fn check_acked(relay: &super::Relay, acked: &[(String, String)]) {
    use futures_util::StreamExt;
    let bad: Vec<String> = futures_util::stream::iter(acked.iter().cloned())
        .map(|(id, body)| async move {
            let (status, v) = relay.admin_get(&format!("/admin/events/{id}")).await;
            let sent: serde_json::Value = serde_json::from_str(&body).unwrap();
            let stored = v["body"].as_str().and_then(|b| serde_json::from_str(b).ok());
            if status == 200 && stored.as_ref() == Some(&sent) {
                None
            } else {
                Some(format!("{id}: status {status}, body {}", v["body"]))
            }
        })
        .buffer_unordered(8)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    assert!(
        bad.is_empty(),
        "{} of {} acknowledged callbacks lost or damaged, e.g. {:?}",
        bad.len(),
        acked.len(),
        &bad[..bad.len().min(5)]
    );
}

/// Callbacks at a steady rate, whatever the answers take: the upstream's events do not
/// wait for the relay (while it restarts they pile up), so neither does this. One
/// request a tick, each on a connection of its own, as the upstream's hook calls.
pub struct Steady {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    pub acked: Acked,
    /// What went wrong with each callback not answered 200: a refused or reset
    /// connection, a timeout, another status.
    pub failed: Arc<Mutex<Vec<String>>>,
}

impl Steady {
    /// `per_second` callbacks a second to `url`, the `n`th with `body(n)`.
    pub fn start(
        url: String,
        per_second: u32,
        body: impl Fn(u64) -> String + Send + Sync + 'static,
    ) -> Steady {
        let (stop, mut stopped) = watch::channel(false);
        let (acked, failed): (Acked, Arc<Mutex<Vec<String>>>) = Default::default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let (a, f) = (acked.clone(), failed.clone());
        let started = std::time::Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut sent = tokio::task::JoinSet::new();
            for n in 0u64.. {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => break,
                }
                let (client, url, text, acked, failed) =
                    (client.clone(), url.clone(), body(n), a.clone(), f.clone());
                let sent_at = started.elapsed();
                sent.spawn(async move {
                    let answer = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(text.clone())
                        .send()
                        .await;
                    let id = match answer {
                        Ok(r) if r.status() == 200 => r
                            .json::<serde_json::Value>()
                            .await
                            .map_err(|e| format!("ack body: {e}"))
                            .and_then(|v| {
                                v["id"]
                                    .as_str()
                                    .map(str::to_owned)
                                    .ok_or_else(|| format!("ack {v}"))
                            }),
                        Ok(r) => Err(format!("HTTP {}", r.status())),
                        Err(e) => Err(format!("{e:?}")),
                    };
                    match id {
                        Ok(id) => acked.lock().unwrap().push((id, text)),
                        // When it was sent, from the start of the load.
                        Err(why) => failed
                            .lock()
                            .unwrap()
                            .push(format!("{:.2}s: {why}", sent_at.as_secs_f64())),
                    }
                });
                // Reap what is done, so the set stays the size of what is in flight.
                while sent.try_join_next().is_some() {}
            }
            while sent.join_next().await.is_some() {}
        });
        Steady { stop, task, acked, failed }
    }

    /// Stops sending, waits for every callback sent to be answered (or to fail), and
    /// returns those acknowledged.
    pub async fn stop(self) -> Vec<(String, String)> {
        self.stop.send_replace(true);
        self.task.await.expect("the load's task");
        self.acked.lock().unwrap().clone()
    }
}
