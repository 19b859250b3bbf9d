#!/usr/bin/env bash
# Runs one cargo-fuzz target.
#   fuzz/run.sh [TARGET] [SECONDS]   (default: parse_frame for 600 s)
# A crash fails the run (non-zero exit) and leaves the input under fuzz/artifacts/TARGET/.
# cargo-fuzz passes -Zsanitizer and other nightly flags; only stable Rust is installed here,
# so RUSTC_BOOTSTRAP=1 lets stable accept them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
target=${1:-parse_frame}
secs=${2:-600}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
python3 seed_corpus.py
mkdir -p "corpus/$target"
# Every target starts from the capture frames (the engine targets read them as raw frames).
if [ "$target" != parse_frame ]; then cp -n corpus/parse_frame/* "corpus/$target/" 2>/dev/null || true; fi
export RUSTC_BOOTSTRAP=1
# -a: debug assertions and overflow checks, so an overflow on a fuzzed value is a crash.
cargo fuzz build -a "$target"
cargo fuzz run -a "$target" "corpus/$target" -- -max_total_time="$secs" -print_final_stats=1
