//! What the relay tells about itself besides its metrics: log lines ([`logs`]), and a
//! trace of each callback ([`trace`]) exported over OTLP/HTTP ([`export`], encoded by
//! [`otlp`]).
//!
//! A callback is stored by one relay, dispatched by the fleet's leader and attempted
//! by whichever relay claims it, perhaps a day later: no process holds its spans from
//! start to end. So the trace's ids are derived from the event's id ([`ids`]), and each
//! span is built whole once its work is done, by the relay that did it, and exported at
//! once: nothing is stored for a trace.

pub(crate) mod export;
pub(crate) mod ids;
mod logs;
mod otlp;
pub(crate) mod trace;

pub(crate) use export::Tracer;
pub(crate) use logs::init;
