//! One jq program (a destination's `filter` or `transform`), compiled once with jaq
//! and run on one input document at a time.
//!
//! Only pure filters are offered: `env` (the relay's environment holds its tokens),
//! `now` (a transform must give the same bytes on every attempt), `halt`, and the
//! logging filters `debug`, `stderr` and `input(s)` are left out, and modules cannot
//! be read from disk. A program naming one fails to compile, at load time.
//!
//! jaq's parser and compiler recurse once per nesting level, and one byte of source
//! can open a level (`-`, `(`): a program is at most [`MAX_SOURCE`] bytes, compiled on
//! a thread whose stack holds twice that depth (measured: 30,000 levels fit in
//! [`COMPILE_STACK`]). Programs are compiled in the relay only to check them; they run
//! in the shaping processes (`worker.rs`), which compile them again.

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{data, unwrap_valr, Compiler, Ctx, Vars};
use jaq_json::Val;

/// The value type programs run on.
type Data = data::JustLut<Val>;

/// Named filters a program may not use (see the module's doc): the names a program
/// would call, for the hint of the compile error.
const LEFT_OUT: &[&str] =
    &["env", "now", "halt", "halt_error", "debug", "stderr", "input", "inputs"];
/// The native filters behind them, left out of jaq's natives.
const NATIVES_LEFT_OUT: &[&str] = &["env", "now", "halt", "stderr_empty", "debug_empty"];
/// The standard definitions built on those natives, left out with them.
const DEFS_LEFT_OUT: &[&str] = &["stderr", "debug", "halt", "halt_error"];

/// Outputs read from a program: a second one is enough to know it made more than one.
const OUTPUTS_READ: usize = 2;
/// The longest program accepted, in bytes.
pub(crate) const MAX_SOURCE: usize = 16 << 10;
/// The stack a program is compiled on (reserved, touched only as deep as it goes).
const COMPILE_STACK: usize = 256 << 20;
/// Runs in a row that overran or crashed before a program is disabled.
pub(crate) const STRIKES: u32 = 3;
/// Stopped runs within [`STRIKE_WINDOW`] that disable a program whatever ran between:
/// a caller who can make a filter loop on bodies of its choosing, and sends others
/// between, gets at most this many runs of the limit from it (each holds dispatch up),
/// not one every limit for ever.
pub(crate) const STRIKES_IN_WINDOW: usize = 3;
/// See [`STRIKES_IN_WINDOW`].
pub(crate) const STRIKE_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// A program's stopped runs, and the rule that disables it: pure, the clock passed in.
#[derive(Debug, Default)]
pub(crate) struct Strikes {
    in_a_row: u32,
    /// When the last stopped runs were (at most [`STRIKES_IN_WINDOW`]).
    recent: std::collections::VecDeque<std::time::Instant>,
}

impl Strikes {
    /// A run was stopped at `now`: why the program is disabled, if this run disables it.
    pub(crate) fn stopped(&mut self, now: std::time::Instant) -> Option<String> {
        self.in_a_row += 1;
        self.recent.push_back(now);
        while self.recent.len() > STRIKES_IN_WINDOW {
            self.recent.pop_front();
        }
        let in_window = self
            .recent
            .front()
            .is_some_and(|first| now.saturating_duration_since(*first) <= STRIKE_WINDOW);
        if self.in_a_row >= STRIKES {
            Some(format!("{} runs in a row", self.in_a_row))
        } else if self.recent.len() >= STRIKES_IN_WINDOW && in_window {
            Some(format!("{STRIKES_IN_WINDOW} runs within an hour"))
        } else {
            None
        }
    }

    /// A run ended well: the runs in a row start again (the hour's count stays).
    pub(crate) fn cleared(&mut self) {
        self.in_a_row = 0;
    }
}

/// A compiled jq program.
pub(crate) struct Program {
    filter: jaq_core::Filter<Data>,
    /// The source, for `check-config` and the preview.
    code: String,
    /// Its stopped runs (`pool.rs`).
    strikes: std::sync::Mutex<Strikes>,
    /// Set at the [`STRIKES`]th: from then on the relay does not run it, and this is why.
    disabled: std::sync::OnceLock<String>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Program").field(&self.code).finish()
    }
}

/// Why a program does not compile: where, and what was expected or is unknown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub(crate) struct CompileError {
    pub(crate) line: usize,
    pub(crate) column: usize,
    pub(crate) message: String,
}

impl CompileError {
    /// An error at `at`, a slice of `code` (or its end when `at` is not one).
    fn at(code: &str, at: &str, message: String) -> Self {
        let start = code.as_ptr() as usize;
        let offset = (at.as_ptr() as usize)
            .checked_sub(start)
            .filter(|o| *o <= code.len())
            .unwrap_or(code.len());
        let before = &code[..offset];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Self { line, column, message }
    }
}

impl Program {
    /// Compiles `code` on a thread with room for its depth; the first error found, with
    /// its position.
    pub(crate) fn compile(code: &str) -> Result<Self, CompileError> {
        std::thread::scope(|scope| {
            let compiling = std::thread::Builder::new()
                .name("hookrelay-jq-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || Self::compile_here(code));
            match compiling.map(|t| t.join()) {
                Ok(Ok(compiled)) => compiled,
                Ok(Err(_)) => {
                    Err(CompileError::at(code, "", "the compiler failed (a panic in jaq)".into()))
                }
                Err(e) => Err(CompileError::at(
                    code,
                    "",
                    format!("cannot start a thread to compile it: {e}"),
                )),
            }
        })
    }

    /// Compiles `code` on this thread, which must have [`COMPILE_STACK`] of stack (the
    /// shaping process's has).
    pub(crate) fn compile_here(code: &str) -> Result<Self, CompileError> {
        if code.len() > MAX_SOURCE {
            return Err(CompileError::at(
                code,
                "",
                format!(
                    "the program is {} bytes, more than the {} KiB a program may have",
                    code.len(),
                    MAX_SOURCE >> 10
                ),
            ));
        }
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs())
            .filter(|d| !DEFS_LEFT_OUT.contains(&d.name));
        let funs = jaq_core::funs()
            .chain(jaq_std::funs())
            .chain(jaq_json::funs())
            .filter(|(name, _, _)| !NATIVES_LEFT_OUT.contains(name));
        let loader = Loader::new(defs);
        let arena = Arena::default();
        let modules = loader.load(&arena, File { code, path: () }).map_err(|errors| {
            let Some((_, error)) = errors.into_iter().next() else {
                return CompileError::at(code, "", "does not parse".into());
            };
            match error {
                jaq_core::load::Error::Lex(es) => es.into_iter().next().map_or_else(
                    || CompileError::at(code, "", "does not parse".into()),
                    |(expect, at)| {
                        CompileError::at(code, at, format!("expected {}", expect.as_str()))
                    },
                ),
                jaq_core::load::Error::Parse(es) => es.into_iter().next().map_or_else(
                    || CompileError::at(code, "", "does not parse".into()),
                    |(expect, at)| {
                        let found = if at.is_empty() {
                            "the end".to_owned()
                        } else {
                            format!("{:?}", at.chars().take(12).collect::<String>())
                        };
                        CompileError::at(
                            code,
                            at,
                            format!("expected {}, found {found}", expect.as_str()),
                        )
                    },
                ),
                jaq_core::load::Error::Io(es) => CompileError::at(
                    code,
                    es.first().map_or("", |(path, _)| path),
                    "modules cannot be loaded here: write the definitions inline".into(),
                ),
            }
        })?;
        let filter = Compiler::default().with_funs(funs).compile(modules).map_err(|errors| {
            let first = errors.into_iter().next().and_then(|(_, es)| es.into_iter().next());
            match first {
                Some((name, undefined)) => {
                    let hint = if LEFT_OUT.contains(&name.trim_start_matches('$')) || name == "$ENV"
                    {
                        " (not offered: filters are pure and deterministic)"
                    } else {
                        ""
                    };
                    CompileError::at(
                        code,
                        name,
                        format!("unknown {} {name}{hint}", undefined.as_str()),
                    )
                }
                None => CompileError::at(code, "", "does not compile".into()),
            }
        })?;
        Ok(Self {
            filter,
            code: code.to_owned(),
            strikes: std::sync::Mutex::new(Strikes::default()),
            disabled: std::sync::OnceLock::new(),
        })
    }

    /// Why the relay no longer runs it, once it overran or crashed [`STRIKES`] times in
    /// a row, or [`STRIKES_IN_WINDOW`] times within [`STRIKE_WINDOW`].
    pub(crate) fn disabled(&self) -> Option<&str> {
        self.disabled.get().map(String::as_str)
    }

    /// A run overran or crashed, for `reason`: whether this strike disabled it.
    pub(crate) fn strike(&self, reason: &str) -> bool {
        let verdict = crate::lock::lock(&self.strikes).stopped(std::time::Instant::now());
        verdict.is_some_and(|runs| {
            self.disabled
                .set(format!(
                    "disabled after {runs} that were stopped (the last: {reason}): fix the \
                     program, then restart the relay"
                ))
                .is_ok()
        })
    }

    /// A run ended well: the runs in a row start again.
    pub(crate) fn cleared(&self) {
        crate::lock::lock(&self.strikes).cleared();
    }

    /// The source it was compiled from.
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// Runs the program on `input`: its first outputs (at most two, enough to tell
    /// one from several), or the first error.
    pub(crate) fn run(&self, input: Val) -> Result<Vec<Val>, String> {
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
        let mut out = Vec::new();
        for value in self.filter.id.run((ctx, input)).map(unwrap_valr).take(OUTPUTS_READ) {
            out.push(value.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }
}

// Compiled once, shared by the dispatcher and every delivery worker.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<Program>();
};

#[cfg(test)]
mod strike_tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::{Duration, Instant};

    #[test]
    fn three_in_a_row_or_within_an_hour_disable_and_good_runs_between_do_not_save_it() {
        let t0 = Instant::now();
        let mut s = Strikes::default();
        assert_eq!(s.stopped(t0), None);
        assert_eq!(s.stopped(t0), None);
        assert_eq!(s.stopped(t0).as_deref(), Some("3 runs in a row"));
        // Stopped runs with good ones between (a caller interleaving its bodies).
        let mut s = Strikes::default();
        for i in 0..2 {
            assert_eq!(s.stopped(t0 + Duration::from_secs(i)), None, "{i}");
            s.cleared();
        }
        assert_eq!(
            s.stopped(t0 + Duration::from_secs(5)).as_deref(),
            Some("3 runs within an hour")
        );
        // The same, spread over more than an hour: never.
        let mut s = Strikes::default();
        for i in 0..20 {
            assert_eq!(s.stopped(t0 + Duration::from_secs(i * 2000)), None, "{i}");
            s.cleared();
        }
    }

    proptest! {
        /// Whatever the sequence: disabled exactly when the last STRIKES runs were all
        /// stopped, or the last STRIKES_IN_WINDOW stopped runs lie within the window.
        #[test]
        fn the_rule_is_the_two_conditions(steps in proptest::collection::vec((any::<bool>(), 0u64..2_000), 1..60)) {
            let t0 = Instant::now();
            let mut s = Strikes::default();
            let (mut clock, mut row, mut stops) = (0u64, 0u32, Vec::new());
            for (stopped, gap) in steps {
                clock += gap;
                let now = t0 + Duration::from_secs(clock);
                if stopped {
                    row += 1;
                    stops.push(clock);
                    let window = stops.len() >= STRIKES_IN_WINDOW
                        && clock - stops[stops.len() - STRIKES_IN_WINDOW] <= STRIKE_WINDOW.as_secs();
                    let expect = row >= STRIKES || window;
                    prop_assert_eq!(s.stopped(now).is_some(), expect);
                } else {
                    row = 0;
                    s.cleared();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(code: &str, input: &str) -> Result<Vec<String>, String> {
        let p = Program::compile(code).map_err(|e| e.to_string())?;
        let input = jaq_json::read::parse_single(input.as_bytes()).unwrap();
        Ok(p.run(input)?.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn compiles_and_runs_with_the_standard_library() {
        assert_eq!(run(".a | select(. > 1) | tostring", r#"{"a":2}"#), Ok(vec!["\"2\"".into()]));
        assert_eq!(run("[.[] | ascii_downcase]", r#"["A","b"]"#), Ok(vec![r#"["a","b"]"#.into()]));
        assert_eq!(run("test(\"^Act\")", r#""ActionCreated""#), Ok(vec!["true".into()]));
        assert_eq!(run(".[]", "[1,2,3]").map(|v| v.len()), Ok(2), "two outputs read at most");
    }

    #[test]
    fn syntax_errors_say_where() {
        let e = Program::compile(".event == \n  (\"x\"").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("closing parenthesis"), "{e}");
        let e = Program::compile(".a | nosuchthing").unwrap_err();
        assert_eq!((e.line, e.column), (1, 6), "{e}");
        assert!(e.message.contains("unknown filter nosuchthing"), "{e}");
        let e = Program::compile("if . then 1").unwrap_err();
        assert!(e.message.contains("expected"), "{e}");
    }

    #[test]
    fn impure_filters_are_not_offered() {
        for code in ["env", "$ENV", "now", "debug", "halt", "input", "1 | stderr"] {
            let e = Program::compile(code).unwrap_err();
            assert!(e.message.contains("unknown"), "{code}: {e}");
        }
        let e = Program::compile("import \"x\" as x; x::f").unwrap_err();
        assert!(e.message.contains("modules"), "{e}");
    }

    #[test]
    fn runtime_errors_are_errors() {
        let e = run(".a.b", r#"{"a":1}"#).unwrap_err();
        assert!(e.contains("index"), "{e}");
        assert!(run("error(\"boom\")", "null").unwrap_err().contains("boom"));
    }
}
