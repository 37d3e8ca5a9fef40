//! The `hookrelay` binary: everything lives in the library; see `hookrelay --help`.

/// sled and the HTTP stack allocate a lot of short-lived buffers per callback; mimalloc
/// handles that pattern markedly better than glibc's allocator (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    hookrelay::run()
}
