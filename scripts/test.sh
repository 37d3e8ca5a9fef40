#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
# formatting, lints, then unit and integration tests (real sockets, real child
# processes, real sled files, real third-party tools). Needs the Rust toolchain
# (cargo, rustfmt, clippy), python3 with pip, and apt (Debian) for promtool; installs
# the rest itself.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== test tools"
# The Standard Webhooks reference verifier checks our delivery signatures.
if ! python3 -c "import standardwebhooks" 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check standardwebhooks
fi
python3 -c "import standardwebhooks; print('standardwebhooks', 'ok')"
# Prometheus' promtool checks the alert rules and the relay's /metrics output.
if ! command -v promtool >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  install_prometheus() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  }
  install_prometheus || { $sudo apt-get update -qq && install_prometheus; }
fi
promtool --version | head -n 1

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings

echo "== cargo test"
cargo test --locked
