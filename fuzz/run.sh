#!/usr/bin/env bash
# Runs one cargo-fuzz target for a while.
#   fuzz/run.sh [TARGET] [SECONDS]   TARGET: parse_frame (default), parse_cm_mad,
#                                    engine_frames or engine_sequences; SECONDS default 600
# A crash fails the run (non-zero exit) and leaves the input under fuzz/artifacts/TARGET/.
# cargo-fuzz passes -Zsanitizer and other nightly flags; only stable Rust is installed here,
# so RUSTC_BOOTSTRAP=1 lets stable accept them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
target=${1:-parse_frame}
secs=${2:-600}
# The old form `fuzz/run.sh SECONDS` still runs parse_frame.
if [[ "$target" =~ ^[0-9]+$ && $# -eq 1 ]]; then
    secs=$target
    target=parse_frame
fi
case "$target" in
parse_frame | parse_cm_mad | engine_frames | engine_sequences) ;;
*)
    echo "fuzz/run.sh: unknown target '$target' (parse_frame, parse_cm_mad, engine_frames, engine_sequences)" >&2
    exit 2
    ;;
esac
case "$secs" in
'' | *[!0-9]*)
    echo "fuzz/run.sh: SECONDS must be a whole number, got '$secs'" >&2
    exit 2
    ;;
esac
# A debug build of cargo-fuzz itself (it only drives cargo and the fuzz binary): it compiles
# in about half the time of a release build on a fresh machine.
command -v cargo-fuzz >/dev/null || cargo install --debug cargo-fuzz --locked
mkdir -p "corpus/$target"
if [ "$target" = parse_frame ] || [ "$target" = parse_cm_mad ]; then
    python3 seed_corpus.py "$target"
fi
export RUSTC_BOOTSTRAP=1
# -a: debug assertions and overflow checks, so an overflow on a fuzzed value is a crash.
cargo fuzz build -a "$target"
cargo fuzz run -a "$target" "corpus/$target" -- -max_total_time="$secs" -print_final_stats=1
