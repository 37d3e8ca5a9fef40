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

/// A compiled jq program.
pub(crate) struct Program {
    filter: jaq_core::Filter<Data>,
    /// The source, for `check-config` and the preview.
    code: String,
    /// Runs in a row that overran or crashed (`pool.rs`); a run that ends well resets it.
    strikes: std::sync::atomic::AtomicU32,
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
            strikes: std::sync::atomic::AtomicU32::new(0),
            disabled: std::sync::OnceLock::new(),
        })
    }

    /// Why the relay no longer runs it, once it overran or crashed [`STRIKES`] times in
    /// a row.
    pub(crate) fn disabled(&self) -> Option<&str> {
        self.disabled.get().map(String::as_str)
    }

    /// A run overran or crashed, for `reason`: whether this strike disabled it.
    pub(crate) fn strike(&self, reason: &str) -> bool {
        use std::sync::atomic::Ordering;
        let strikes = self.strikes.fetch_add(1, Ordering::SeqCst) + 1;
        strikes >= STRIKES
            && self
                .disabled
                .set(format!(
                    "disabled after {strikes} runs in a row that were stopped (the last: \
                     {reason}): fix the program, then restart the relay"
                ))
                .is_ok()
    }

    /// A run ended well: the strikes start again from 0.
    pub(crate) fn cleared(&self) {
        self.strikes.store(0, std::sync::atomic::Ordering::SeqCst);
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
