//! Shape: what each destination receives of an event, chosen (`filter`) and reshaped
//! (`transform`) by jq programs of its config.
//!
//! Both read one input document (see [`document`]). A filter's verdict is part of
//! dispatch's plan, asked before dispatch's transaction and never on the ack path (nor
//! inside the store's write hop); a transform runs before each attempt, and gives the
//! same bytes on every one (its input is fixed at receive time, and its programs are
//! pure: `program.rs`).
//!
//! - `program.rs`: one jq program, compiled once with jaq when the config loads.
//! - `depth.rs`: how deep a body nests; a body too deep is not JSON to a program.
//! - `pool.rs`: the shaping processes every run happens in, each run bounded on its
//!   own in time and memory; `worker.rs` is such a process, `wire.rs` their language.
//! - `shaper.rs`: the [`Shaper`] that dispatch, deliveries and the admin API ask.
//! - here: the input document and the two rules that read a program's outputs.

pub(crate) mod depth;
pub(crate) mod pool;
pub(crate) mod program;
mod shaper;
pub(crate) mod wire;
pub(crate) mod worker;

use std::sync::Arc;

use jaq_json::Val;

use crate::store::{EventId, EventMeta};
use program::{CompileError, Program};
use wire::{Job, Role};

pub(crate) use shaper::Shaper;

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

/// What is wrong with the destinations' `filter` and `transform` programs, each
/// problem naming its key: the check the daemon's assembly and `check-config` add to
/// the config's own (which knows jq only as text).
pub(crate) fn check(destinations: &[crate::config::DestinationConfig]) -> Vec<String> {
    let mut problems = Vec::new();
    for (i, dest) in destinations.iter().enumerate() {
        if let Err(errors) = Shape::compile(dest.filter.as_deref(), dest.transform.as_deref()) {
            problems.extend(errors.into_iter().map(|(which, e)| {
                format!("destinations[{i}].{which} (destination {:?}): {e}", dest.name)
            }));
        }
    }
    problems
}

/// The document a destination's programs read:
/// `{"id", "event", "source", "resource", "record", "received_at", "body"}`, where
/// `body` is the parsed JSON body (null when it is not JSON, or nests deeper than
/// [`depth::MAX_DEPTH`]: then the second value says so), `resource` is `"type/id"` or
/// null, and `record` the same under its first name.
pub(crate) fn document(job: &Job, body: &[u8]) -> (Val, Option<String>) {
    let text = |s: &str| Val::utf8_str(s.as_bytes().to_vec());
    let resource = job.resource.as_deref().map_or(Val::Null, text);
    let (body, body_error) = if depth::nests_deeper_than(body, depth::MAX_DEPTH) {
        let why = format!("the body nests deeper than {} levels", depth::MAX_DEPTH);
        (Val::Null, Some(why))
    } else {
        (jaq_json::read::parse_single(body).unwrap_or(Val::Null), None)
    };
    let fields = [
        ("id", text(&job.id)),
        ("event", text(&job.event)),
        ("source", text(&job.source)),
        ("resource", resource.clone()),
        ("record", resource),
        ("received_at", text(&job.received_at)),
        ("body", body),
    ];
    (Val::obj(fields.into_iter().map(|(k, v)| (text(k), v)).collect()), body_error)
}

/// The job of running `program` as `role` on event `id`.
pub(crate) fn job(role: Role, program: &Program, id: EventId, meta: &EventMeta) -> Job {
    Job {
        role,
        code: program.code().to_owned(),
        id: id.to_string(),
        event: meta.event.clone(),
        source: meta.source.clone(),
        resource: meta.resource.clone(),
        received_at: crate::timefmt::format_admin(meta.received_at()),
    }
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
/// and the reason says which (and why the body was null, when it was kept from the
/// program: `body_error`).
pub(crate) fn filter_verdict(
    outputs: Result<Vec<Val>, String>,
    body_error: Option<&str>,
) -> FilterVerdict {
    match verdict_of(outputs) {
        FilterVerdict::Filtered { reason, error } => match body_error {
            Some(why) => FilterVerdict::Filtered {
                reason: format!("{reason} (its input's body was null: {why})"),
                error,
            },
            None => FilterVerdict::Filtered { reason, error },
        },
        matched => matched,
    }
}

fn verdict_of(outputs: Result<Vec<Val>, String>) -> FilterVerdict {
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

/// One event to transform for the claim `token`.
pub(crate) struct ToTransform {
    pub(crate) token: u64,
    pub(crate) id: EventId,
    pub(crate) meta: EventMeta,
    pub(crate) body: bytes::Bytes,
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

#[cfg(test)]
mod pool_tests;
