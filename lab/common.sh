# Shared settings for the xroce rxe lab scripts (sourced, never run).
# Every path the lab writes is under $XROCE_LAB_DIR; the scripts themselves may be read-only
# (the `xroce` binary extracts its embedded copy of them to $XROCE_LAB_DIR/scripts).

# Work directory: guest image, per-lab state, per-run captures and logs.
LAB_DIR=${XROCE_LAB_DIR:-/var/tmp/xroce-lab}
# Name of the lab's network namespace; several labs can run at once under different names.
LAB_NS=${XROCE_LAB_NS:-xroce-lab}
# State of the running lab named $LAB_NS: pidfiles, control sockets, settings.
LAB_STATE=$LAB_DIR/state/$LAB_NS
# The guest image (kernel + initramfs), built by build-image.sh.
LAB_IMAGE=$LAB_DIR/image

# Addresses: everything lives in 198.18.0.0/24 inside the lab's own namespaces.
LAB_NET=198.18.0
LAB_BRIDGE_IP=$LAB_NET.1
guest_ip() { echo "$LAB_NET.$((10 + $1))"; }

lab_log() { echo "lab: $*" >&2; }
lab_die() { echo "lab: error: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || lab_die "needs root (network namespaces, tap devices, QEMU on a bridge); rerun with sudo"
}

ns_exists() { [ -e "/run/netns/$1" ]; }

# True if PID is alive and its command line mentions MARK (guards against a reused PID:
# the lab only ever signals processes it started itself).
pid_is_ours() {
  local pid=$1 mark=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr "\\0" " " 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$mark"
}

# True while PID runs: a zombie has ended (whoever reaps it may take a while; on some
# machines PID 1 reaps orphans only every second or two).
pid_runs() {
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# Stop PID (if it is ours): TERM, wait up to 3 s, then KILL.
stop_pid() {
  local pid=$1 mark=$2 i
  pid_is_ours "$pid" "$mark" || return 0
  kill "$pid" 2>/dev/null || true
  for i in $(seq 1 60); do pid_runs "$pid" || return 0; sleep 0.05; done
  kill -9 "$pid" 2>/dev/null || true
}

# Whether a capture holds every packet of its case, from tcpdump's exit counts (CAPTURED,
# RECEIVED by filter, DROPPED by kernel) and ALL_WRITTEN_AT: the count at which tcpdump, asked
# after the case ended, had written all it had received (empty if never). Packets are written
# in the order they arrive, so packets received but not written arrived after that moment.
capture_whole() {
  local captured=$1 received=$2 dropped=$3 all_written_at=$4
  [ -n "$captured" ] && [ -n "$received" ] && [ "${dropped:-0}" = 0 ] || return 1
  [ "$captured" = "$received" ] && return 0
  [ -n "$all_written_at" ] && [ "$captured" -ge "$all_written_at" ]
}
