//! The export of traces: spans taken by the receiver, lost with a failed export, or
//! dropped before it.

use super::taxonomy::{self, ErrorType, Stage, ERRORS};
use super::InternalEvent;
use crate::metrics::Metrics;

/// The receiver took a batch of spans.
pub(crate) struct SpansExported {
    pub(crate) spans: usize,
    /// Whether the export before this one had failed.
    pub(crate) recovered: bool,
}

impl InternalEvent for SpansExported {
    const FAMILIES: &'static [&'static str] = &["hookrelay_trace_spans_total"];
    fn emit(self, m: &Metrics) {
        m.relay.trace_spans.with_label_values(&["exported"]).inc_by(self.spans as u64);
        if self.recovered {
            tracing::info!(spans = self.spans, "traces are exported again");
        }
    }
}

/// An export failed three times: its spans are lost (the events are not: traces are
/// a view of them).
pub(crate) struct SpanExportFailed<'a> {
    pub(crate) spans: usize,
    /// The last try's error: a status or a connection error, never the URL.
    pub(crate) why: &'a str,
    /// Whether to log it: the first failure after a success, then one a minute.
    pub(crate) logged: bool,
}

impl InternalEvent for SpanExportFailed<'_> {
    const FAMILIES: &'static [&'static str] = &["hookrelay_trace_spans_total", ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Telemetry, ErrorType::Unreachable);
        m.relay.trace_spans.with_label_values(&["failed"]).inc_by(self.spans as u64);
        if self.logged {
            tracing::warn!(spans = self.spans, error = %self.why,
                "cannot export traces to telemetry.otlp_endpoint; their spans are dropped \
                 (is the receiver up? hookrelay_trace_spans_total counts them)");
        }
    }
}

/// A span found the export queue full (the receiver is slow or down): dropped.
pub(crate) struct SpanDropped;

impl InternalEvent for SpanDropped {
    const FAMILIES: &'static [&'static str] = &["hookrelay_trace_spans_total", ERRORS];
    fn emit(self, m: &Metrics) {
        taxonomy::count(m, Stage::Telemetry, ErrorType::Dropped);
        m.relay.trace_spans.with_label_values(&["dropped"]).inc();
    }
}
