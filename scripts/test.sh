#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
# formatting, lints, then unit and integration tests (real sockets, real child
# processes, real sled files). Needs only the Rust toolchain (cargo, rustfmt, clippy).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings

echo "== cargo test"
cargo test --locked
