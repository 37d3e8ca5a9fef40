#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
# formatting, lints, then unit and integration tests (real sockets, real child
# processes, real sled files, real third-party verifiers). Needs the Rust toolchain
# (cargo, rustfmt, clippy) and python3 with pip; installs the rest itself.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== test tools"
# The Standard Webhooks reference verifier checks our delivery signatures.
if ! python3 -c "import standardwebhooks" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check standardwebhooks
fi
python3 -c "import standardwebhooks; print('standardwebhooks', 'ok')"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings

echo "== cargo test"
cargo test --locked
