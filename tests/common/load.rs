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
        let (stop, stopped) = watch::channel(false);
        let client = super::client();
        let (urls, body) = (Arc::new(urls), Arc::new(body));
        let tasks = (0..clients)
            .map(|k| {
                let (client, urls, body, acked, stopped) =
                    (client.clone(), urls.clone(), body.clone(), acked.clone(), stopped.clone());
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
                            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                        }
                        tokio::time::sleep(pace).await;
                    }
                })
            })
            .collect();
        Load { stop, tasks, acked }
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
