#!/usr/bin/env bash
# The whole test suite. In CI (XROCE_CI=1, set by .ci/run) every test that needs root or the
# lab must run: a missing privilege is a failure there, never a silent skip.
#
# Order: the cheap static checks first, then every test built with overflow checks and debug
# assertions (profile `checked`: release optimisation, so the timed lab cases keep their
# speed; every test binary runs even after a failure, so one run reports them all), then a short
# run of each fuzz target. XROCE_FUZZ_SECONDS=0 skips the fuzz runs
# (outside CI only; CI always runs them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export XROCE_CI=${XROCE_CI:-0}
fuzz_seconds=${XROCE_FUZZ_SECONDS:-30}
if [ "$XROCE_CI" = 1 ] && [ "$fuzz_seconds" = 0 ]; then
  echo "test.sh: XROCE_FUZZ_SECONDS=0 is not allowed in CI" >&2
  exit 1
fi
step() { echo "== $* ($(date -u +%H:%M:%S))"; }
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings
# Without the xdp feature nothing may need clang: build.rs is pointed at /bin/false and a
# `clang` first on PATH fails loudly, so either one being run breaks the build. clippy runs
# every build script, so its run without the feature proves it for all targets; the tests
# below build (code generation) only what they run.
no_clang=$(mktemp -d)
trap 'rm -rf "$no_clang"' EXIT
printf '#!/bin/sh\necho "clang run by a build without the xdp feature: $*" >&2\nexit 1\n' >"$no_clang/clang"
chmod +x "$no_clang/clang"
step "cargo clippy --no-default-features --all-targets -- -D warnings (clang unavailable)"
CLANG=/bin/false PATH="$no_clang:$PATH" cargo clippy --no-default-features --all-targets -- -D warnings
step "cargo test --profile checked --no-default-features --lib --test cli_without_xdp --test layout (clang unavailable)"
CLANG=/bin/false PATH="$no_clang:$PATH" cargo test --profile checked --no-default-features --lib \
  --test cli_without_xdp --test layout
step "cargo build --profile checked --all-targets (overflow checks, debug assertions)"
cargo build --profile checked --all-targets
step "cargo test --profile checked"
cargo test --profile checked --no-fail-fast -- --test-threads=2
if [ "$fuzz_seconds" != 0 ]; then
  for target in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^xroce-fuzz$'); do
    step "fuzz $target for ${fuzz_seconds}s"
    fuzz/run.sh "$target" "$fuzz_seconds"
  done
else
  echo "== SKIPPED: fuzz runs (XROCE_FUZZ_SECONDS=0)"
fi
step "all tests passed"
