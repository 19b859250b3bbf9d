#!/usr/bin/env bash
# One-time set-up of a fresh Debian (bookworm) machine, as root: the system packages xroce
# builds and tests with. Safe to re-run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages)" >&2
  exit 1
fi
PKGS="clang llvm libelf-dev zlib1g-dev pkg-config make m4 iproute2 tcpdump python3 iputils-ping util-linux linux-libc-dev"
# The C ABI libraries' tests (abi/): unmodified verbs programs (perftest, ibverbs-utils,
# rdmacm-utils, pyverbs), rdma-core's libraries and headers to compare with, gcc for C callers
# (tests/c/verbs_tutorial.c is compiled against <infiniband/verbs.h> by the tests).
PKGS="$PKGS ibverbs-utils perftest rdmacm-utils python3-pyverbs libibverbs-dev librdmacm-dev ibverbs-providers gcc binutils"
# libfabric's verbs provider over xroce's libraries (tools/tests/rdmacm_netns.rs).
PKGS="$PKGS libfabric-bin"
# The engines on xroce (tools/tests/engines_netns.rs, docs/engines.md): UCX, Open MPI, MPICH, libfabric.
PKGS="$PKGS ucx-utils libucx0 openmpi-bin libopenmpi-dev mpich libmpich-dev libfabric-bin libfabric-dev"
missing=$(for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
  echo "setup.sh: installing $missing"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
command -v cargo >/dev/null || { echo "setup.sh: cargo not found; install Rust with rustup" >&2; exit 1; }
echo "setup.sh: system packages ready"
# The rxe lab's guest image (tools/tests/interop_rxe.rs boots it). A no-op when the image in
# ${XROCE_LAB_DIR:-/var/tmp/xroce-lab}/image is up to date; about 2 minutes from scratch.
lab/build-image.sh
