#!/usr/bin/env bash
# MPI over xroce against MPI over the kernel's TCP, side by side in one run on one veth pair
# per MTU (docs/engines.md, "Benchmark"): tools/tests/engines_netns.rs's MPI cases, one after the
# other (no two jobs share the two cores), with longer runs of tests/engines/mpi_check.c.
#
#   sudo benches/engines.sh            # 3 rounds; ROUNDS=N for more
#
# Prints, per round, each case's 8-byte half round trip (lat8_us) and 1 MiB bandwidth with 4
# messages in flight (bw1m_MBps), then the ratios xroce / TCP of each round.
# The machine runs a busy-polling rank on each of its two cores: numbers from a loaded machine
# say little; run it on a quiet one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rounds=${ROUNDS:-3}
cargo build --release --quiet --workspace
all=$(mktemp)
trap 'rm -f "$all"' EXIT
for round in $(seq 1 "$rounds"); do
  echo "== round $round of $rounds"
  XROCE_ENGINES_SERIAL=1 XROCE_ENGINES_ONLY="2 ranks" \
    XROCE_ENGINES_MPI_ARGS="-l 5000 -b 40 -w 4" \
    cargo test --release --quiet --test engines_netns -- --nocapture 2>&1 \
    | grep -E '^engines: MTU [0-9]+: MPI .*: ok' | sed "s/^engines: /round $round: /" | tee -a "$all"
done
echo "== xroce / TCP, per round (latency: lower is better; bandwidth: higher is better)"
awk '
  match($0, /MTU [0-9]+/) { mtu = substr($0, RSTART + 4, RLENGTH - 4) }
  {
    round = $2; sub(":", "", round)
    name = $0; sub(/^round [0-9]+: MTU [0-9]+: MPI /, "", name); sub(/, 2 ranks: ok.*/, "", name)
    match($0, /lat8_us=[0-9.]+/); lat = substr($0, RSTART + 8, RLENGTH - 8)
    match($0, /bw1m_MBps=[0-9.]+/); bw = substr($0, RSTART + 10, RLENGTH - 10)
    key = round "|" mtu
    if (name ~ /TCP baseline/) { tlat[key] = lat; tbw[key] = bw }
    n++; r[n] = key; c[n] = name; l[n] = lat; b[n] = bw
  }
  END {
    printf "%-6s %-5s %-44s %10s %10s %9s %9s\n", "round", "MTU", "case", "lat8 us", "bw MB/s", "lat/TCP", "bw/TCP"
    for (i = 1; i <= n; i++) {
      split(r[i], k, "|")
      printf "%-6s %-5s %-44s %10.2f %10.1f %9.2f %9.2f\n", k[1], k[2], c[i], l[i], b[i], l[i] / tlat[r[i]], b[i] / tbw[r[i]]
    }
  }' "$all"
