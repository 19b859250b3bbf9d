#!/usr/bin/env bash
# The whole test suite. In CI (XROCE_CI=1, set by .ci/run) every test that needs root or the
# lab must run: a missing privilege is a failure there, never a silent skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export XROCE_CI=${XROCE_CI:-0}
echo "== cargo build (all targets)"
cargo build --release --all-targets
echo "== cargo test"
cargo test --release -- --test-threads=2
echo "== all tests passed"
