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
//! - here: the input document, the two rules that read a program's outputs, and the
//!   [`Shaper`] that dispatch, deliveries and the admin API ask.

pub(crate) mod depth;
pub(crate) mod pool;
pub(crate) mod program;
pub(crate) mod wire;
pub(crate) mod worker;

use std::sync::Arc;
use std::time::Duration;

use jaq_json::Val;

use crate::internal_events::{InternalEvent, ShapeRunStopped};
use crate::metrics::Metrics;
use crate::store::{EventId, EventMeta, FilteredOut};
use pool::{LaneJob, Lanes, Ran, Spawn};
use program::{CompileError, Program};
use wire::{Answer, Job, Role};

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

/// Where every program runs: the relay's shaping processes (`pool.rs`), and what a
/// stopped run costs its program (strikes, then disabled). Owned by the daemon; ended
/// by [`Shaper::close`].
pub(crate) struct Shaper {
    lanes: Lanes,
    metrics: Arc<Metrics>,
}

/// A run's answer and payload, or why there is none.
type Answered = Result<(Answer, Vec<u8>), String>;

/// One program to run on one event, for `destination`.
struct Task {
    destination: String,
    program: Arc<Program>,
    job: Job,
    body: bytes::Bytes,
}

impl Shaper {
    /// The relay's shaper: this binary's `shape-worker` processes, [`pool::LIMIT`] a run.
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Self::with(Spawn::relay(), pool::LIMIT, metrics)
    }

    /// A shaper whose processes are started by `spawn`, each run bounded by `limit`.
    pub(crate) fn with(spawn: Spawn, limit: Duration, metrics: Arc<Metrics>) -> Self {
        Self { lanes: Lanes::new(spawn, limit), metrics }
    }

    /// Ends every process; a run asked after this fails at once.
    pub(crate) async fn close(&self) {
        self.lanes.work.close().await;
        self.lanes.preview.close().await;
    }

    /// Runs `tasks` on the work lane: each answer, or why there is none. A disabled
    /// program is not run; a stopped run strikes its program (`Program::strike`).
    async fn run(&self, tasks: Vec<Task>) -> Vec<Answered> {
        let mut out: Vec<Option<Answered>> = Vec::with_capacity(tasks.len());
        let mut sent = Vec::new();
        let mut jobs = Vec::new();
        for (i, task) in tasks.iter().enumerate() {
            if let Some(why) = too_large(&task.body) {
                out.push(Some(Err(why)));
            } else {
                out.push(None);
                sent.push(i);
                let strikes = Some(task.program.clone());
                jobs.push(LaneJob { job: task.job.clone(), body: task.body.clone(), strikes });
            }
        }
        if !jobs.is_empty() {
            match self.lanes.work.run(jobs, None).await {
                Ok(ran) => {
                    for (i, ran) in sent.into_iter().zip(ran) {
                        let task = &tasks[i];
                        out[i] = Some(self.judged(&task.destination, task.job.role.as_str(), ran));
                    }
                }
                Err(why) => {
                    for i in sent {
                        out[i] = Some(Err(why.clone()));
                    }
                }
            }
        }
        out.into_iter().map(|o| o.unwrap_or_else(|| Err("not run".into()))).collect()
    }

    /// A run's answer; a stop is told (`ShapeRunStopped`).
    fn judged(&self, destination: &str, role: &str, ran: Ran) -> Answered {
        match ran {
            Ran::Answered(answer, payload) => Ok((answer, payload)),
            Ran::Disabled(why) => Err(why),
            Ran::Stopped { cause, reason, disabled } => {
                ShapeRunStopped { destination, role, cause, reason: &reason, disabled }
                    .emit(&self.metrics);
                Err(reason)
            }
        }
    }

    /// For each event, the destinations whose filter does not match it, and why.
    pub(crate) async fn filtered_out(&self, batch: Vec<ToFilter>) -> Vec<Vec<FilteredOut>> {
        let mut tasks = Vec::new();
        let mut shape = Vec::with_capacity(batch.len());
        for e in batch {
            shape.push(e.filters.len());
            for (destination, program) in e.filters {
                let job = job(Role::Filter, &program, e.id, &e.meta);
                tasks.push(Task { destination, program, job, body: e.body.clone() });
            }
        }
        let destinations: Vec<String> = tasks.iter().map(|t| t.destination.clone()).collect();
        let mut answers = self.run(tasks).await.into_iter().zip(destinations);
        shape
            .into_iter()
            .map(|n| {
                answers
                    .by_ref()
                    .take(n)
                    .filter_map(|(answer, destination)| match filter_answer(answer) {
                        FilterVerdict::Matched => None,
                        FilterVerdict::Filtered { reason, error } => {
                            Some(FilteredOut { destination, reason, error })
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// What `transform` of `destination` makes of each event, by claim token.
    pub(crate) async fn bodies_sent(
        &self,
        destination: &str,
        transform: &Arc<Program>,
        events: Vec<ToTransform>,
    ) -> Vec<(u64, Result<Sent, String>)> {
        let tokens: Vec<u64> = events.iter().map(|e| e.token).collect();
        let tasks = events
            .into_iter()
            .map(|e| Task {
                destination: destination.to_owned(),
                program: transform.clone(),
                job: job(Role::Transform, transform, e.id, &e.meta),
                body: e.body,
            })
            .collect();
        tokens.into_iter().zip(self.run(tasks).await.into_iter().map(transform_answer)).collect()
    }

    /// What is sent for event `id`: its body as received, or what `transform` makes of
    /// it (JSON, whatever the callback's content type was).
    pub(crate) async fn body_sent(
        &self,
        destination: &str,
        transform: Option<&Arc<Program>>,
        id: EventId,
        meta: &EventMeta,
        body: &bytes::Bytes,
    ) -> Result<Sent, String> {
        let Some(program) = transform else {
            return Ok((body.clone(), meta.content_type.clone()));
        };
        let event = ToTransform { token: 0, id, meta: meta.clone(), body: body.clone() };
        let mut made = self.bodies_sent(destination, program, vec![event]).await;
        made.pop().map_or_else(|| Err("not run".into()), |(_, sent)| sent)
    }

    /// A preview: the filter's verdict and the body sent, on the preview lane (any
    /// program an operator sends; a stopped one strikes nothing configured).
    pub(crate) async fn preview(
        &self,
        destination: &str,
        filter: Option<&Arc<Program>>,
        transform: Option<&Arc<Program>>,
        id: EventId,
        meta: &EventMeta,
        body: &bytes::Bytes,
    ) -> (FilterVerdict, Result<Sent, String>) {
        if let Some(why) = too_large(body) {
            let verdict = filter.map_or(FilterVerdict::Matched, |_| FilterVerdict::Filtered {
                reason: why.clone(),
                error: true,
            });
            return (verdict, transform.map_or_else(|| Ok(as_received(meta, body)), |_| Err(why)));
        }
        let jobs: Vec<LaneJob> = [(Role::Filter, filter), (Role::Transform, transform)]
            .into_iter()
            .filter_map(|(role, p)| {
                Some(LaneJob { job: job(role, p?, id, meta), body: body.clone(), strikes: None })
            })
            .collect();
        let roles: Vec<Role> = jobs.iter().map(|j| j.job.role).collect();
        let ran = self.lanes.preview.run(jobs, Some(Lanes::PREVIEW_WAIT)).await;
        let mut answers: Vec<(Role, Answered)> = match ran {
            Ok(ran) => roles
                .into_iter()
                .zip(ran)
                .map(|(role, ran)| (role, self.judged(destination, "preview", ran)))
                .collect(),
            Err(why) => roles.into_iter().map(|role| (role, Err(why.clone()))).collect(),
        };
        let transformed = match answers.pop() {
            Some((Role::Transform, answer)) => transform_answer(answer),
            other => {
                answers.extend(other);
                Ok(as_received(meta, body))
            }
        };
        let verdict = match answers.pop() {
            Some((Role::Filter, answer)) => filter_answer(answer),
            _ => FilterVerdict::Matched,
        };
        (verdict, transformed)
    }
}

/// Why a body cannot be shaped at all: larger than a shaping process takes.
fn too_large(body: &[u8]) -> Option<String> {
    (body.len() > wire::MAX_PAYLOAD).then(|| {
        format!(
            "the body is {} bytes, more than the {} MiB a program is given",
            body.len(),
            wire::MAX_PAYLOAD >> 20
        )
    })
}

/// The body sent when there is no transform.
fn as_received(meta: &EventMeta, body: &bytes::Bytes) -> Sent {
    (body.clone(), meta.content_type.clone())
}

/// A filter's verdict from its run's answer.
fn filter_answer(answer: Answered) -> FilterVerdict {
    match answer {
        Ok((Answer::Matched, _)) => FilterVerdict::Matched,
        Ok((Answer::Filtered { reason, error }, _)) => FilterVerdict::Filtered { reason, error },
        Ok((Answer::Transformed | Answer::Failed { .. }, _)) => FilterVerdict::Filtered {
            reason: "the shaping process answered a filter as a transform".into(),
            error: true,
        },
        Err(reason) => FilterVerdict::Filtered { reason, error: true },
    }
}

/// A transform's body from its run's answer.
fn transform_answer(answer: Answered) -> Result<Sent, String> {
    match answer {
        Ok((Answer::Transformed, body)) => Ok((body.into(), Some("application/json".to_owned()))),
        Ok((Answer::Failed { reason }, _)) => Err(reason),
        Ok((Answer::Matched | Answer::Filtered { .. }, _)) => {
            Err("the shaping process answered a transform as a filter".into())
        }
        Err(reason) => Err(reason),
    }
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
