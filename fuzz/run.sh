#!/usr/bin/env bash
# Runs the cargo-fuzz target for the frame parser.
#   fuzz/run.sh [SECONDS]   (default 600)
# cargo-fuzz passes -Zsanitizer and other nightly flags; only stable Rust is installed here,
# so RUSTC_BOOTSTRAP=1 lets stable accept them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
secs=${1:-600}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
python3 seed_corpus.py
export RUSTC_BOOTSTRAP=1
cargo fuzz build parse_frame
cargo fuzz run parse_frame corpus/parse_frame -- -max_total_time="$secs" -print_final_stats=1
