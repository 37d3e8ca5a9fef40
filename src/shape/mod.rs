//! Shape: what each destination receives of an event, chosen (`filter`) and reshaped
//! (`transform`) by jq programs of its config.
//!
//! Both read one input document (see [`input`]). A filter's verdict is part of
//! dispatch's plan, so it is written in dispatch's transaction and never on the ack
//! path; a transform runs before each attempt, and gives the same bytes on every one
//! (its input is fixed at receive time, and its programs are pure: `program.rs`).
//!
//! - `program.rs`: one jq program, compiled once with jaq when the config loads.
//! - `bounded.rs`: where programs run: a pool of threads, each run bounded in time.
//! - here: the input document and the two rules that read a program's outputs.

pub(crate) mod bounded;
pub(crate) mod program;

use std::sync::Arc;

use jaq_json::Val;

use crate::store::{EventId, EventMeta, FilteredOut};
use bounded::EVALUATOR;
use program::{CompileError, Program};

/// How much of an unexpected output a reason quotes.
const QUOTED: usize = 80;

/// A destination's programs, compiled.
#[derive(Clone, Debug, Default)]
pub(crate) struct Shape {
    pub(crate) filter: Option<Arc<Program>>,
    pub(crate) transform: Option<Arc<Program>>,
}

impl Shape {
    /// Compiles a destination's `filter` and `transform`: the errors keyed by which.
    pub(crate) fn compile(
        filter: Option<&str>,
        transform: Option<&str>,
    ) -> Result<Self, Vec<(&'static str, CompileError)>> {
        let mut errors = Vec::new();
        let mut compile = |which, code: Option<&str>| {
            code.and_then(|c| match Program::compile(c) {
                Ok(p) => Some(Arc::new(p)),
                Err(e) => {
                    errors.push((which, e));
                    None
                }
            })
        };
        let shape =
            Self { filter: compile("filter", filter), transform: compile("transform", transform) };
        if errors.is_empty() {
            Ok(shape)
        } else {
            Err(errors)
        }
    }
}

/// The document a destination's programs read:
/// `{"id", "event", "source", "resource", "record", "received_at", "body"}`, where
/// `body` is the parsed JSON body (null when it is not JSON), `resource` is
/// `"type/id"` or null, and `record` the same under its first name.
pub(crate) fn input(id: EventId, meta: &EventMeta, body: &[u8]) -> Val {
    let text = |s: &str| Val::utf8_str(s.as_bytes().to_vec());
    let resource = meta.resource.as_deref().map_or(Val::Null, text);
    let body = jaq_json::read::parse_single(body).unwrap_or(Val::Null);
    let received_at = crate::timefmt::format_admin(meta.received_at());
    let fields = [
        ("id", text(&id.to_string())),
        ("event", text(&meta.event)),
        ("source", text(&meta.source)),
        ("resource", resource.clone()),
        ("record", resource),
        ("received_at", text(&received_at)),
        ("body", body),
    ];
    Val::obj(fields.into_iter().map(|(k, v)| (text(k), v)).collect())
}

/// What a filter decided for one destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FilterVerdict {
    /// Its single output was `true`: the event goes to the destination.
    Matched,
    /// Anything else: recorded as the delivery's `filtered` reason.
    Filtered { reason: String, error: bool },
}

/// The verdict of a filter from its outputs (at most two read) or its error: only a
/// single `true` matches; an error, no output, several, or any other value does not,
/// and the reason says which.
pub(crate) fn filter_verdict(outputs: Result<Vec<Val>, String>) -> FilterVerdict {
    let filtered = |reason: String| FilterVerdict::Filtered { reason, error: false };
    match outputs {
        Err(e) => {
            FilterVerdict::Filtered { reason: format!("the filter failed: {e}"), error: true }
        }
        Ok(out) => match out.as_slice() {
            [Val::Bool(true)] => FilterVerdict::Matched,
            [Val::Bool(false)] => filtered("the filter gave false".into()),
            [] => filtered("the filter gave no output".into()),
            [other] => FilterVerdict::Filtered {
                reason: format!("the filter gave {}, not a boolean", quote(other)),
                error: true,
            },
            _ => FilterVerdict::Filtered {
                reason: "the filter gave more than one output".into(),
                error: true,
            },
        },
    }
}

/// The body a transform produced: its single output as compact JSON, or why there
/// is none (an error, no output, several, or a value JSON cannot hold, such as NaN).
pub(crate) fn transformed(outputs: Result<Vec<Val>, String>) -> Result<Vec<u8>, String> {
    let out = outputs.map_err(|e| format!("the transform failed: {e}"))?;
    let [value] = out.as_slice() else {
        return Err(if out.is_empty() {
            "the transform gave no output".into()
        } else {
            "the transform gave more than one output".into()
        });
    };
    let bytes = value.to_string().into_bytes();
    match serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        Ok(_) => Ok(bytes),
        Err(_) => Err(format!("the transform gave {}, which is not JSON", quote(value))),
    }
}

/// A body to send and its content type.
pub(crate) type Sent = (bytes::Bytes, Option<String>);

/// One event and the filters of the destinations it is routed to.
#[derive(Clone)]
pub(crate) struct ToFilter {
    pub(crate) id: EventId,
    pub(crate) meta: EventMeta,
    pub(crate) body: bytes::Bytes,
    pub(crate) filters: Vec<(String, Arc<Program>)>,
}

/// For each event, the destinations whose filter does not match it: all of them asked
/// in one bounded run (`bounded.rs`). A program that overruns fails from then on and
/// the batch is asked again, so the answer always comes.
pub(crate) fn filtered_out(batch: Vec<ToFilter>) -> Vec<Vec<FilteredOut>> {
    let programs = batch.iter().map(|e| e.filters.len()).sum::<usize>();
    // Each overrun disables one program for good: at most one more try each.
    for _ in 0..=programs {
        let events = batch.clone();
        let asked = EVALUATOR.run(move |running| {
            let mut all = Vec::with_capacity(events.len());
            for e in events {
                let doc = input(e.id, &e.meta, &e.body);
                let mut out = Vec::new();
                for (destination, program) in e.filters {
                    if let FilterVerdict::Filtered { reason, error } =
                        filter_verdict(running.run(&program, doc.clone()))
                    {
                        out.push(FilteredOut { destination, reason, error });
                    }
                }
                all.push(out);
            }
            all
        });
        if let Ok(all) = asked {
            return all;
        }
    }
    // Not reached: by then every program fails at once. Still an answer: none match.
    batch
        .iter()
        .map(|e| {
            e.filters
                .iter()
                .map(|(destination, _)| FilteredOut {
                    destination: destination.clone(),
                    reason: "the filter could not be run".into(),
                    error: true,
                })
                .collect()
        })
        .collect()
}

/// What is sent for event `id`: its body as received, or what `transform` makes of it
/// (JSON, whatever the callback's content type was), the run bounded.
pub(crate) async fn body_sent(
    transform: Option<&Arc<Program>>,
    id: EventId,
    meta: &EventMeta,
    body: &bytes::Bytes,
) -> Result<Sent, String> {
    let Some(program) = transform.cloned() else {
        return Ok((body.clone(), meta.content_type.clone()));
    };
    let (meta, body) = (meta.clone(), body.clone());
    let out = EVALUATOR
        .run_async(move |running| transformed(running.run(&program, input(id, &meta, &body))))
        .await
        .and_then(|out| out)?;
    Ok((out.into(), Some("application/json".to_owned())))
}

/// One event to transform for the claim `token`.
pub(crate) struct ToTransform {
    pub(crate) token: u64,
    pub(crate) id: EventId,
    pub(crate) meta: EventMeta,
    pub(crate) body: bytes::Bytes,
}

/// What `transform` makes of each event, by claim token, in one bounded run; nothing
/// when it overruns (each is then made on its own, and the runaway fails at once).
pub(crate) async fn bodies_sent(
    transform: &Arc<Program>,
    events: Vec<ToTransform>,
) -> Vec<(u64, Result<Sent, String>)> {
    let program = transform.clone();
    let made = EVALUATOR
        .run_async(move |running| {
            events
                .into_iter()
                .map(|e| {
                    let out = transformed(running.run(&program, input(e.id, &e.meta, &e.body)));
                    (e.token, out.map(|b| (b.into(), Some("application/json".to_owned()))))
                })
                .collect()
        })
        .await;
    made.unwrap_or_default()
}

/// A filter's verdict on one event, the run bounded (the preview).
pub(crate) async fn verdict(
    filter: &Arc<Program>,
    id: EventId,
    meta: &EventMeta,
    body: &bytes::Bytes,
) -> FilterVerdict {
    let (program, meta, body) = (filter.clone(), meta.clone(), body.clone());
    EVALUATOR
        .run_async(move |running| filter_verdict(running.run(&program, input(id, &meta, &body))))
        .await
        .unwrap_or_else(|reason| FilterVerdict::Filtered { reason, error: true })
}

/// The start of `v`, for a reason.
fn quote(v: &Val) -> String {
    let text = v.to_string();
    match text.char_indices().nth(QUOTED) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests;
