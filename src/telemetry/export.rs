//! The [`Tracer`] every part of the relay hands its finished spans to, and the task
//! that exports them over OTLP/HTTP in batches.
//!
//! Tracing never slows or fails the relay's work: a span goes into a bounded queue
//! without waiting (a full queue drops it, counted), and the export runs on its own
//! task; an export that fails three times loses its spans, counted and logged once a
//! minute. Traces are a view of the events, which are stored whatever happens here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::ids::{Salt, SpanId, TraceParent, SALT_KEY};
use super::otlp::{self, Resource};
use super::trace::{Span, Value};
use crate::config::TelemetryConfig;
use crate::internal_events::{InternalEvent, SpanDropped, SpanExportFailed, SpansExported};
use crate::metrics::Metrics;
use crate::store::{EventId, SharedStore, StoreError};

/// Spans waiting for export at most: about a second of a busy relay's spans, or a
/// receiver's pause of a few seconds at a quieter one.
const QUEUE: usize = 8192;
/// Spans per export request at most (the OpenTelemetry SDKs' default).
const MAX_BATCH: usize = 512;
/// How long the first span of a batch waits for others.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Tries of one export, and the pause before the second (doubled before the third).
const TRIES: u32 = 3;
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// A failing export is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Where the relay's spans go.
pub(crate) struct Tracer {
    salt: Salt,
    /// `None`: nothing is exported (no `telemetry.otlp_endpoint`).
    queue: Option<mpsc::Sender<Span>>,
    metrics: Arc<Metrics>,
}

impl Tracer {
    /// A tracer that exports nothing: deliveries still carry a `traceparent`.
    pub(crate) fn silent(salt: Salt, metrics: Arc<Metrics>) -> Self {
        Self { salt, queue: None, metrics }
    }

    /// Whether spans are exported (the `traceparent`'s sampled flag says so).
    pub(crate) fn exporting(&self) -> bool {
        self.queue.is_some()
    }

    /// Hands the span `make` builds to the export, if there is one (otherwise it is
    /// not built). Never waits.
    pub(crate) fn record(&self, make: impl FnOnce(Salt) -> Span) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(make(self.salt)).is_err() {
            SpanDropped.emit(&self.metrics);
        }
    }

    /// The `traceparent` of an attempt whose span will be `span`: the consumer's
    /// spans become its children.
    pub(crate) fn traceparent(&self, event: EventId, span: SpanId) -> TraceParent {
        TraceParent { trace: self.salt.trace(event), span, sampled: self.exporting() }
    }
}

/// The store's salt of trace ids: read, or made and stored by the first relay to ask
/// (one at a time: relays of a fleet starting together agree on one).
pub(crate) async fn salt(store: &SharedStore) -> Result<Salt, StoreError> {
    let _hold = store.exclusive(SALT_KEY).await?;
    if let Some(salt) = store.upstream_get(SALT_KEY).await?.as_deref().and_then(Salt::from_stored) {
        return Ok(salt);
    }
    let salt = Salt::random();
    store.upstream_put(SALT_KEY, Some(salt.stored())).await?;
    Ok(salt)
}

/// The running export: [`Export::finish`] sends what is queued and ends it.
pub(crate) struct Export {
    close: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Export {
    /// Exports what is queued and ends the task, waiting at most `within`. Called once
    /// nothing records spans any more (the delivery workers have stopped).
    pub(crate) async fn finish(self, within: Duration, metrics: &Metrics) {
        let _ = self.close.send(());
        if tokio::time::timeout(within, self.task).await.is_err() {
            crate::internal_events::taxonomy::degraded(
                metrics,
                crate::internal_events::taxonomy::Stage::Telemetry,
                crate::internal_events::taxonomy::ErrorType::Unreachable,
                "the last traces were not exported before shutdown; their spans are dropped",
                &format_args!("the receiver took longer than {within:?}"),
            );
        }
    }
}

/// The relay's tracer, and its export when `config` names a receiver. `instance`
/// names this relay (`service.instance.id`).
pub(crate) fn start(
    config: &TelemetryConfig,
    salt: Salt,
    instance: &str,
    metrics: Arc<Metrics>,
) -> anyhow::Result<(Arc<Tracer>, Option<Export>)> {
    let Some(url) = config.traces_url() else {
        return Ok((Arc::new(Tracer::silent(salt, metrics)), None));
    };
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &config.otlp_headers {
        // Checked with the config; the value is a secret, never in the message.
        let value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
            anyhow::anyhow!("telemetry.otlp_headers.{name}: not a valid header value")
        })?;
        headers.insert(reqwest::header::HeaderName::from_bytes(name.as_bytes())?, value);
    }
    headers.insert(
        reqwest::header::CONTENT_TYPE,
        reqwest::header::HeaderValue::from_static("application/x-protobuf"),
    );
    let client = reqwest::Client::builder()
        .timeout(config.otlp_timeout)
        .default_headers(headers)
        .user_agent(concat!("hookrelay/", env!("CARGO_PKG_VERSION")))
        .build()?;
    let resource: Resource = vec![
        ("service.name", Value::Str(config.service_name.clone())),
        ("service.version", Value::Str(env!("CARGO_PKG_VERSION").into())),
        ("service.instance.id", Value::Str(instance.to_owned())),
    ];
    let (tx, rx) = mpsc::channel(QUEUE);
    let (close, closed) = oneshot::channel();
    let exporter = Exporter { client, url, resource, metrics: metrics.clone(), failing: None };
    let task = tokio::spawn(exporter.run(rx, closed));
    tracing::info!(endpoint = %crate::config::mask_url(&config.traces_url().unwrap_or_default()),
        "exporting traces over OTLP/HTTP");
    Ok((Arc::new(Tracer { salt, queue: Some(tx), metrics }), Some(Export { close, task })))
}

/// The export task's state.
struct Exporter {
    client: reqwest::Client,
    url: String,
    resource: Resource,
    metrics: Arc<Metrics>,
    /// While exports fail: when a failure was last logged.
    failing: Option<Instant>,
}

impl Exporter {
    /// Exports batches until `closed`, then what is left in the queue.
    async fn run(mut self, mut rx: mpsc::Receiver<Span>, mut closed: oneshot::Receiver<()>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            tokio::select! {
                span = rx.recv() => match span {
                    Some(span) => batch.push(span),
                    None => break,
                },
                _ = &mut closed => break,
            }
            let deadline = tokio::time::Instant::now() + BATCH_DELAY;
            let mut closing = false;
            while batch.len() < MAX_BATCH && !closing {
                tokio::select! {
                    span = rx.recv() => match span {
                        Some(span) => batch.push(span),
                        None => closing = true,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = &mut closed => closing = true,
                }
            }
            self.export(std::mem::take(&mut batch)).await;
            if closing {
                break;
            }
        }
        // The last spans: what the stopping relay recorded before it closed the export.
        rx.close();
        while let Some(span) = rx.recv().await {
            batch.push(span);
            if batch.len() == MAX_BATCH {
                self.export(std::mem::take(&mut batch)).await;
            }
        }
        if !batch.is_empty() {
            self.export(batch).await;
        }
    }

    /// One export of `spans`, tried up to [`TRIES`] times when the failure may pass
    /// (no answer, 429, 502, 503, 504: OTLP's retryable ones).
    async fn export(&mut self, spans: Vec<Span>) {
        let body = bytes::Bytes::from(otlp::export_request(&self.resource, &spans));
        let mut pause = RETRY_PAUSE;
        let mut why = String::new();
        for attempt in 1..=TRIES {
            let sent = self.client.post(&self.url).body(body.clone()).send().await;
            let retryable = match sent {
                Ok(resp) if resp.status().is_success() => {
                    let recovered = self.failing.take().is_some();
                    SpansExported { spans: spans.len(), recovered }.emit(&self.metrics);
                    return;
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    why = format!("the receiver answered HTTP {status}");
                    matches!(status, 429 | 502 | 503 | 504)
                }
                Err(e) => {
                    // The URL may hold credentials: never part of the message.
                    why = format!("{}", e.without_url());
                    true
                }
            };
            if !retryable || attempt == TRIES {
                break;
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
        let now = Instant::now();
        let logged = self.failing.is_none_or(|last| now.duration_since(last) >= LOG_EVERY);
        if logged {
            self.failing = Some(now);
        }
        SpanExportFailed { spans: spans.len(), why: &why, logged }.emit(&self.metrics);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::fixtures;
    use crate::store::postgres::test_server;

    /// Relays starting together agree on one trace salt: a fleet derives one trace per
    /// callback, whichever relay attempts it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relays_starting_together_agree_on_one_trace_salt() {
        let url = tokio::task::spawn_blocking(|| {
            test_server::shared().database(&test_server::unique_database("salt"))
        })
        .await
        .unwrap();
        let a: SharedStore = Arc::new(fixtures::postgres(&url).await);
        let b: SharedStore = Arc::new(fixtures::postgres(&url).await);
        for _ in 0..5 {
            a.upstream_put(SALT_KEY, None).await.unwrap();
            let (x, y) = tokio::join!(salt(&a), salt(&b));
            let (x, y) = (x.unwrap(), y.unwrap());
            assert_eq!(x, y, "two salts for one store");
            assert_eq!(salt(&b).await.unwrap(), x, "the salt is kept");
        }
    }
}
