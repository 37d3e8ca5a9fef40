//! The shaping process: `hookrelay shape-worker`, started by the relay (`pool.rs`),
//! runs jq programs one job at a time on the socket it was given as its stdin.
//!
//! Why a process: jaq can be neither interrupted nor bounded in memory, and a program
//! that recurses for ever overflows any stack. In a process of its own, a run past its
//! time is killed, one past its memory (an address-space rlimit set by the relay) ends
//! in a failed allocation, and a stack overflow ends the process: the relay sees the
//! process gone, blames that one run, and starts another. Nothing a program or a body
//! does reaches the relay.
//!
//! The process keeps every program it has compiled (they are few: one or two per
//! destination), so a job costs one round trip on a local socket.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::os::unix::net::UnixStream;

use super::program::Program;
use super::wire::{blocking, Answer, Job, Role, WireError, MAX_PAYLOAD};
use super::{document, filter_verdict, transformed, FilterVerdict};

/// The stack jq runs on: its recursion is deep (a legitimate program 20,000 calls
/// deep has room; one without end overflows it and ends the process, as meant).
const STACK_BYTES: usize = 256 << 20;
/// Programs kept compiled at most (a preview brings new ones; past this the cache
/// starts again).
const KEPT: usize = 256;

/// Runs jobs from the socket on fd 0 until the relay closes it. Returns the exit code.
pub(crate) fn main() -> std::process::ExitCode {
    use std::os::fd::FromRawFd;
    // SAFETY: fd 0 is the socket the relay gave this process as its stdin (pool.rs),
    // owned by nothing else here; ownership passes to the stream.
    let socket = unsafe { UnixStream::from_raw_fd(0) };
    if !memory_bounded() {
        eprintln!(
            "hookrelay shape-worker: no address-space limit is set (a sandbox refused \
             setrlimit; under systemd allow it: SystemCallFilter=setrlimit prlimit64): a \
             program's memory is bounded only by the service's own limit"
        );
    }
    let ran = std::thread::Builder::new()
        .name("hookrelay-shape".into())
        .stack_size(STACK_BYTES)
        .spawn(move || serve(socket));
    match ran.map(|t| t.join()) {
        Ok(Ok(Ok(()))) => std::process::ExitCode::SUCCESS,
        Ok(Ok(Err(e))) => {
            eprintln!("hookrelay shape-worker: {e}");
            std::process::ExitCode::FAILURE
        }
        Ok(Err(_)) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("hookrelay shape-worker: cannot start its thread: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Whether the relay could bound this process's address space (`pool.rs`).
fn memory_bounded() -> bool {
    let mut limit = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: getrlimit writes into the struct it is given.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) };
    read == 0 && limit.rlim_cur != libc::RLIM_INFINITY
}

/// Answers jobs until the socket closes (`Ok`) or fails.
fn serve(socket: UnixStream) -> Result<(), WireError> {
    let mut reader = BufReader::new(socket.try_clone()?);
    let mut writer = BufWriter::new(socket);
    let mut programs: HashMap<String, Result<Program, String>> = HashMap::new();
    loop {
        let (job, body) = match blocking::read::<Job>(&mut reader) {
            Ok(frame) => frame,
            Err(WireError::Closed) => return Ok(()),
            Err(e) => return Err(e),
        };
        let (answer, payload) = answer(&mut programs, &job, &body);
        blocking::write(&mut writer, &answer, &payload)?;
    }
}

/// Runs `job` on `body`: its answer, and the transformed body.
fn answer(
    programs: &mut HashMap<String, Result<Program, String>>,
    job: &Job,
    body: &[u8],
) -> (Answer, Vec<u8>) {
    if programs.len() >= KEPT && !programs.contains_key(&job.code) {
        programs.clear();
    }
    let program = programs
        .entry(job.code.clone())
        .or_insert_with(|| Program::compile_here(&job.code).map_err(|e| e.to_string()));
    let program = match program {
        Ok(p) => p,
        Err(e) => {
            let reason = format!("the {} does not compile: {e}", job.role.as_str());
            return match job.role {
                Role::Filter => (Answer::Filtered { reason, error: true }, Vec::new()),
                Role::Transform => (Answer::Failed { reason }, Vec::new()),
            };
        }
    };
    let (doc, body_error) = document(job, body);
    let outputs = program.run(doc);
    match job.role {
        Role::Filter => match filter_verdict(outputs, body_error.as_deref()) {
            FilterVerdict::Matched => (Answer::Matched, Vec::new()),
            FilterVerdict::Filtered { reason, error } => {
                (Answer::Filtered { reason, error }, Vec::new())
            }
        },
        Role::Transform => match transformed(outputs) {
            Ok(bytes) if bytes.len() > MAX_PAYLOAD => (
                Answer::Failed {
                    reason: format!(
                        "the transform gave {} bytes, more than the {} MiB a body may have",
                        bytes.len(),
                        MAX_PAYLOAD >> 20
                    ),
                },
                Vec::new(),
            ),
            Ok(bytes) => (Answer::Transformed, bytes),
            Err(reason) => (Answer::Failed { reason }, Vec::new()),
        },
    }
}

#[cfg(test)]
pub(crate) mod tests {
    /// Set by the pool when it starts the unit-test binary as a shaping process.
    pub(crate) const ENTRY_ENV: &str = "HOOKRELAY_SHAPE_WORKER_ENTRY";

    /// The shaping process of the unit tests (`pool::Spawn::unit_tests`): the test
    /// binary started with this one test selected. Ignored in a normal run; run by the
    /// pool, it serves its socket and exits, never returning to the harness.
    #[test]
    #[ignore = "the unit tests' shaping process: started by shape::pool, not run by hand"]
    fn entry() {
        if std::env::var_os(ENTRY_ENV).is_some() {
            let code = super::main();
            std::process::exit(if code == std::process::ExitCode::SUCCESS { 0 } else { 1 });
        }
    }
}
