#!/usr/bin/env bash
# The xroce rxe lab: QEMU guests running Linux soft-RoCE (rdma_rxe) on a bridge inside a
# network namespace, plus host-side endpoint namespaces attached to that bridge by veth pairs.
#
#   lab.sh up [N]                boot N guests (default 2): g1 = 198.18.0.11, g2 = .12, ...
#   lab.sh down                  stop everything this lab started; keeps the run's captures
#   lab.sh status                what is really running (exit 0 healthy, 1 down, 2 degraded)
#   lab.sh exec G SCRIPT         run a bash script in guest G; exit status is the script's
#   lab.sh netem G ARGS|off      tc netem on both directions of guest G's link
#   lab.sh mtu M                 change the link MTU of the bridge, guests and endpoints
#   lab.sh attach NAME [IP]      endpoint namespace <lab>-NAME, interface eth0 (198.18.0.2, .3...)
#   lab.sh attach-routed NAME [IP]   the same behind a router: namespace <lab>-NAME-rt holds
#                                the router (IP on the bridge, 198.19.K.1 towards the endpoint,
#                                K = IP's last byte), <lab>-NAME has eth0 = 198.19.K.2; the
#                                guests get a route to 198.19.K.0/24 via IP
#   lab.sh detach NAME
#   lab.sh capture start|stop NAME [IP...]   tcpdump on the bridge into <run>/pcaps/NAME.pcap;
#                                with IPs, only the traffic between them (cases run at once)
#   lab.sh run-dir               print this lab's run directory (captures, logs)
#
# Env: XROCE_LAB_DIR (/var/tmp/xroce-lab), XROCE_LAB_NS (xroce-lab), XROCE_LAB_MTU (1500),
#      XROCE_LAB_MEM (MiB per guest, 512), XROCE_LAB_ACCEL (tcg), XROCE_LAB_BOOT_TIMEOUT (300),
#      XROCE_LAB_EXEC_TIMEOUT (120), XROCE_LAB_KEEP_RUNS (10), XROCE_LAB_OWNER (a PID: when it is gone, the next `up`
#      of any lab tears this one down).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/common.sh"

NSX() { ip netns exec "$LAB_NS" "$@"; }
guestctl() { python3 "$HERE/guestctl.py" "$@"; }
guests() { cat "$LAB_STATE/guests" 2>/dev/null || echo 0; }
run_dir() { cat "$LAB_STATE/run-dir" 2>/dev/null || true; }

# --- teardown -------------------------------------------------------------------------------
# Tears down the lab whose state is in $1 and whose namespace is $2. Safe on partial state
# (a failed `up`, a killed run): each step checks what exists.
teardown() {
  local state=$1 ns=$2 p pid name
  shopt -s nullglob
  for p in "$state"/capture-*.pid; do
    pid=$(cat "$p"); stop_pid "$pid" "tcpdump"; rm -f "$p"
  done
  for p in "$state"/g*.pid; do
    pid=$(cat "$p"); stop_pid "$pid" "-pidfile $p"; rm -f "$p"
  done
  # A QEMU whose pidfile was lost (killed mid-`up`): find it by the state path in its command line.
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    case $(tr "\\0" " " 2>/dev/null <"$p/cmdline") in
      qemu-system*"$state/g"*) stop_pid "$pid" "$state/g" ;;
    esac
  done
  for p in "$state"/attached/*; do
    name=$(basename "$p")
    ip netns del "$ns-$name" 2>/dev/null || true
    ip netns del "$ns-$name-rt" 2>/dev/null || true
    rm -f "$p"
  done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$state"
}

# Labs left behind by a killed owner process (see XROCE_LAB_OWNER).
sweep_orphans() {
  local s owner ns
  shopt -s nullglob
  for s in "$LAB_DIR"/state/*/; do
    s=${s%/}
    owner=$(cat "$s/owner" 2>/dev/null || true)
    [ -n "$owner" ] || continue
    kill -0 "$owner" 2>/dev/null && continue
    ns=$(basename "$s")
    lab_log "removing lab '$ns' left behind by process $owner"
    teardown "$s" "$ns"
  done
}

# Keeps the newest $XROCE_LAB_KEEP_RUNS run directories (default 10; a full interop run
# captures several hundred MB) and any that a running lab still uses.
prune_runs() {
  local keep=${XROCE_LAB_KEEP_RUNS:-10} d in_use
  in_use=$(cat "$LAB_DIR"/state/*/run-dir 2>/dev/null || true)
  [ -d "$LAB_DIR/runs" ] || return 0
  ls -1d "$LAB_DIR"/runs/*/ 2>/dev/null | sort -r | tail -n +"$keep" | while read -r d; do
    d=${d%/}
    case $'\n'"$in_use"$'\n' in *$'\n'"$d"$'\n'*) continue ;; esac
    rm -rf "$d"
  done || true
}

down() {
  local rd; rd=$(run_dir)
  if [ ! -d "$LAB_STATE" ] && ! ns_exists "$LAB_NS"; then
    lab_log "lab '$LAB_NS' is not up"
    return 0
  fi
  teardown "$LAB_STATE" "$LAB_NS"
  lab_log "lab '$LAB_NS' is down${rd:+; captures and logs kept in $rd}"
}

# --- up -------------------------------------------------------------------------------------
up() {
  local n=${1:-2} mtu=${XROCE_LAB_MTU:-1500} mem=${XROCE_LAB_MEM:-512} accel=${XROCE_LAB_ACCEL:-tcg}
  [[ $n =~ ^[1-9]$ ]] || lab_die "guest count must be 1..9, got '$n'"
  [[ $mtu =~ ^[0-9]+$ ]] && [ "$mtu" -ge 1280 ] && [ "$mtu" -le 9000 ] || lab_die "MTU must be 1280..9000, got '$mtu'"
  [ -s "$LAB_IMAGE/rootfs.cpio" ] || lab_die "no guest image in $LAB_IMAGE: run 'xroce lab build' (or lab/build-image.sh) first"
  command -v qemu-system-x86_64 >/dev/null || lab_die "qemu-system-x86_64 not found: run 'xroce lab build' (installs it)"
  [ -c /dev/net/tun ] || lab_die "/dev/net/tun is missing (needed for the guests' tap devices)"
  sweep_orphans
  if [ -d "$LAB_STATE" ] || ns_exists "$LAB_NS"; then
    lab_log "removing stale lab '$LAB_NS' (a previous run did not finish)"
    teardown "$LAB_STATE" "$LAB_NS"
  fi
  prune_runs
  local rd; rd=$LAB_DIR/runs/$(date -u +%Y%m%d-%H%M%S)-$LAB_NS
  mkdir -p "$LAB_STATE/attached" "$rd/pcaps" "$rd/logs"
  echo "$rd" >"$LAB_STATE/run-dir"
  echo "$n" >"$LAB_STATE/guests"
  echo "$mtu" >"$LAB_STATE/mtu"
  [ -z "${XROCE_LAB_OWNER:-}" ] || echo "$XROCE_LAB_OWNER" >"$LAB_STATE/owner"
  # From here on, a failure (or Ctrl-C) tears down whatever was created.
  UP_DONE=0
  trap '[ "$UP_DONE" = 1 ] || { lab_log "up failed; tearing down"; teardown "$LAB_STATE" "$LAB_NS"; }' EXIT

  ip netns add "$LAB_NS"
  NSX ip link set lo up
  NSX ip link add br0 type bridge
  NSX ip link set br0 mtu "$mtu" up
  NSX ip addr add "$LAB_BRIDGE_IP/24" dev br0
  # No forwarding and no default route: lab traffic never leaves the namespace.
  NSX sysctl -qw net.ipv4.ip_forward=0
  local g
  for g in $(seq 1 "$n"); do
    NSX ip tuntap add "tap$g" mode tap
    NSX ip link set "tap$g" mtu "$mtu" master br0 up
  done
  local kernel=$LAB_IMAGE/vmlinux; [ -s "$kernel" ] || kernel=$LAB_IMAGE/vmlinuz
  local t0; t0=$(date +%s.%N)
  for g in $(seq 1 "$n"); do
    NSX qemu-system-x86_64 -accel "$accel" -m "$mem" -smp 1 \
      -nodefaults -no-user-config -display none -no-reboot \
      -kernel "$kernel" -initrd "$LAB_IMAGE/rootfs.cpio" \
      -append "console=ttyS0 rdinit=/init quiet panic=-1 lab.name=g$g lab.ip=$(guest_ip "$g")/24 lab.mtu=$mtu" \
      -chardev "file,id=con,path=$rd/logs/g$g.console" -serial chardev:con \
      -chardev "socket,id=ctl,path=$LAB_STATE/g$g.ctl,server=on,wait=off" -serial chardev:ctl \
      -netdev "tap,id=n0,ifname=tap$g,script=no,downscript=no" \
      -device "virtio-net-pci,netdev=n0,mac=52:54:00:18:00:$(printf %02x $((10 + g)))" \
      -daemonize -pidfile "$LAB_STATE/g$g.pid"
  done
  for g in $(seq 1 "$n"); do
    if ! guestctl -t "${XROCE_LAB_BOOT_TIMEOUT:-300}" --wait "$LAB_STATE/g$g.ctl" true; then
      lab_log "guest g$g did not answer; last console lines ($rd/logs/g$g.console):"
      tail -n 15 "$rd/logs/g$g.console" >&2 || true
      false
    fi
    local ready; ready=$(grep -a -m1 'lab-guest:' "$rd/logs/g$g.console" || true)
    echo "g$g $(guest_ip "$g") up after $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")s: ${ready#lab-guest: }"
  done
  UP_DONE=1
  echo "lab '$LAB_NS' up: $n guest(s), bridge br0 $LAB_BRIDGE_IP/24, MTU $mtu; run directory $rd"
}

# --- exec, netem, mtu -----------------------------------------------------------------------
check_guest() {
  local g=$1
  [[ $g =~ ^[1-9]$ ]] || lab_die "guest must be a number 1..$(guests), got '$g'"
  [ -S "$LAB_STATE/g$g.ctl" ] || lab_die "guest g$g of lab '$LAB_NS' is not running (lab.sh status)"
}

guest_exec() {
  local g=$1; shift
  check_guest "$g"
  guestctl -t "${XROCE_LAB_EXEC_TIMEOUT:-120}" "$LAB_STATE/g$g.ctl" "$*"
}

netem() {
  local g=$1; shift
  local args="$*" script
  [ -n "$args" ] || lab_die "netem needs netem arguments (e.g. 'loss 1% delay 1ms reorder 5%') or 'off'"
  if [ "$args" = off ]; then
    script='tc qdisc del dev eth0 root 2>/dev/null; tc qdisc del dev eth0 ingress 2>/dev/null
      tc qdisc del dev ifb0 root 2>/dev/null; echo "netem off on $(hostname)"; true'
  else
    # Egress: netem as eth0's root qdisc. Ingress: redirect everything eth0 receives to ifb0
    # and impair ifb0's egress. (The host kernel here has no netem; the guests' kernel has.)
    script="set -e
      modprobe sch_netem; modprobe ifb; modprobe act_mirred; modprobe cls_matchall; modprobe sch_ingress
      ip link show ifb0 >/dev/null 2>&1 || ip link add ifb0 type ifb
      ip link set ifb0 up
      tc qdisc replace dev eth0 root netem $args
      tc qdisc del dev eth0 ingress 2>/dev/null || true
      tc qdisc add dev eth0 handle ffff: ingress
      tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0
      tc qdisc replace dev ifb0 root netem $args
      echo \"netem on \$(hostname) eth0 (egress) and ifb0 (ingress): $args\""
  fi
  guest_exec "$g" "$script"
}

set_mtu() {
  local mtu=$1 g p name
  [[ $mtu =~ ^[0-9]+$ ]] && [ "$mtu" -ge 1280 ] && [ "$mtu" -le 9000 ] || lab_die "MTU must be 1280..9000, got '$mtu'"
  ns_exists "$LAB_NS" || lab_die "lab '$LAB_NS' is not up"
  # Raise: ports before the bridge... a bridge takes the smallest port MTU, so set all.
  for g in $(seq 1 "$(guests)"); do guest_exec "$g" "ip link set eth0 mtu $mtu" >/dev/null; done
  for p in $(NSX ls /sys/class/net); do
    case $p in lo) ;; *) NSX ip link set "$p" mtu "$mtu" ;; esac
  done
  shopt -s nullglob
  for p in "$LAB_STATE"/attached/*; do
    name=$(basename "$p"); ip -n "$LAB_NS-$name" link set eth0 mtu "$mtu"
    if ns_exists "$LAB_NS-$name-rt"; then
      ip -n "$LAB_NS-$name-rt" link set eth0 mtu "$mtu"
      ip -n "$LAB_NS-$name-rt" link set rt0 mtu "$mtu"
    fi
  done
  echo "$mtu" >"$LAB_STATE/mtu"
  # rxe follows its netdev's MTU (path MTU = largest IB MTU <= MTU - 80).
  for g in $(seq 1 "$(guests)"); do
    echo "g$g: $(guest_exec "$g" "ibv_devinfo -d rxe0 | grep -o 'active_mtu:.*'")"
  done
}

# --- endpoints --------------------------------------------------------------------------------
# Checks NAME and prints the bridge address to use: IP, or the first free of .2 to .9. The
# state file's last field is the endpoint's address on the bridge (its router's when routed).
bridge_address() {
  local name=${1:-} ip=${2:-}
  [[ $name =~ ^[a-z0-9]{1,8}$ ]] || lab_die "endpoint name must be 1-8 of [a-z0-9], got '$name'"
  ns_exists "$LAB_NS" || lab_die "lab '$LAB_NS' is not up"
  [ ! -e "$LAB_STATE/attached/$name" ] || lab_die "endpoint '$name' is already attached (detach it first)"
  if [ -z "$ip" ]; then
    local i f used=""
    for f in "$LAB_STATE"/attached/*; do [ -e "$f" ] && used="$used $(awk '{print $NF}' "$f")"; done
    for i in 2 3 4 5 6 7 8 9; do
      case " $used " in *" $LAB_NET.$i "*) ;; *) ip=$LAB_NET.$i; break ;; esac
    done
    [ -n "$ip" ] || lab_die "no free endpoint address in $LAB_NET.2-9"
  fi
  [[ $ip =~ ^198\.18\.0\.([2-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-4])$ ]] || lab_die "endpoint address must be in $LAB_NET.0/24, got '$ip'"
  echo "$ip"
}

attach() {
  local name=${1:-} ip
  ip=$(bridge_address "$name" "${2:-}")
  local ens=$LAB_NS-$name port=ep-$name mtu; mtu=$(cat "$LAB_STATE/mtu")
  ip netns add "$ens"
  echo "$ip $ens $port $ip" >"$LAB_STATE/attached/$name"
  # Create the pair inside the lab namespace and move one end: no name ever lives in the
  # host's own namespace, so parallel labs cannot collide.
  NSX ip link add "$port" mtu "$mtu" type veth peer name eth0 netns "$ens"
  NSX ip link set "$port" master br0 up
  ip -n "$ens" link set lo up
  ip -n "$ens" link set eth0 mtu "$mtu" up
  ip -n "$ens" addr add "$ip/24" dev eth0
  echo "attached '$name': namespace $ens, interface eth0, $ip/24, MTU $mtu (run: ip netns exec $ens COMMAND)"
}

# An endpoint reached through a router namespace: RoCE between it and the guests is routed
# (the frames carry the router's MAC, TTL is decremented), as across a data-centre fabric.
attach_routed() {
  local name=${1:-} rip
  rip=$(bridge_address "$name" "${2:-}")
  local k=${rip##*.} ens=$LAB_NS-$name rns=$LAB_NS-$name-rt port=ep-$name mtu g
  mtu=$(cat "$LAB_STATE/mtu")
  local eip=198.19.$k.2 gip=198.19.$k.1
  ip netns add "$rns"
  ip netns add "$ens"
  echo "$eip $ens $port $rns $rip" >"$LAB_STATE/attached/$name"
  NSX ip link add "$port" mtu "$mtu" type veth peer name eth0 netns "$rns"
  NSX ip link set "$port" master br0 up
  ip -n "$rns" link set lo up
  ip -n "$rns" link set eth0 mtu "$mtu" up
  ip -n "$rns" addr add "$rip/24" dev eth0
  ip -n "$rns" link add rt0 mtu "$mtu" type veth peer name eth0 netns "$ens"
  ip -n "$rns" addr add "$gip/24" dev rt0
  ip -n "$rns" link set rt0 up
  ip netns exec "$rns" sysctl -qw net.ipv4.ip_forward=1
  ip -n "$ens" link set lo up
  ip -n "$ens" link set eth0 mtu "$mtu" up
  ip -n "$ens" addr add "$eip/24" dev eth0
  ip -n "$ens" route add "$LAB_NET.0/24" via "$gip"
  for g in $(seq 1 "$(guests)"); do
    guest_exec "$g" "ip route replace 198.19.$k.0/24 via $rip" >/dev/null
  done
  echo "attached '$name' behind router $rns ($rip on the bridge, $gip towards it): namespace $ens, interface eth0, $eip/24, MTU $mtu (run: ip netns exec $ens COMMAND)"
}

detach() {
  local name=${1:-}
  [ -e "$LAB_STATE/attached/$name" ] || lab_die "no endpoint '$name' attached to lab '$LAB_NS'"
  ip netns del "$LAB_NS-$name" 2>/dev/null || true
  if ns_exists "$LAB_NS-$name-rt"; then
    local k g; k=$(awk '{print $NF}' "$LAB_STATE/attached/$name"); k=${k##*.}
    for g in $(seq 1 "$(guests)"); do guest_exec "$g" "ip route del 198.19.$k.0/24" >/dev/null 2>&1 || true; done
    ip netns del "$LAB_NS-$name-rt" 2>/dev/null || true
  fi
  rm -f "$LAB_STATE/attached/$name"
  echo "detached '$name'"
}

# --- capture ----------------------------------------------------------------------------------
capture() {
  local action=${1:-} name=${2:-} filter='(udp port 4791 or tcp)' ip
  [[ $name =~ ^[A-Za-z0-9_.-]{1,64}$ ]] || lab_die "capture name must be 1-64 of [A-Za-z0-9_.-], got '$name'"
  # Addresses after the name: only frames that have each of them as source or destination.
  for ip in "${@:3}"; do
    [[ $ip =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || lab_die "capture addresses must be IPv4, got '$ip'"
    [ "$action" = start ] || lab_die "addresses are given to capture start only"
    filter="$filter and host $ip"
  done
  local rd; rd=$(run_dir); [ -n "$rd" ] || lab_die "lab '$LAB_NS' is not up"
  local pidf=$LAB_STATE/capture-$name.pid pcap=$rd/pcaps/$name.pcap
  case $action in
    start)
      [ ! -e "$pidf" ] || lab_die "capture '$name' is already running"
      # -U: write each packet as it arrives, so a killed run still leaves a readable file.
      # `ip netns exec` execs tcpdump, so $! is tcpdump's own PID. -B: a 64 MiB ring, so bursts
      # (READ retransmission storms reach 300k frames) are not dropped.
      ip netns exec "$LAB_NS" tcpdump -i br0 -B 65536 -U -s 0 -w "$pcap" "$filter" \
        >"$rd/logs/tcpdump-$name.log" 2>&1 </dev/null &
      echo $! >"$pidf"
      # tcpdump prints "listening on" once the capture is really running.
      local i
      for i in $(seq 1 50); do grep -q 'listening on' "$rd/logs/tcpdump-$name.log" && break; sleep 0.1; done
      grep -q 'listening on' "$rd/logs/tcpdump-$name.log" || { cat "$rd/logs/tcpdump-$name.log" >&2; lab_die "tcpdump did not start"; }
      echo "$pcap" ;;
    stop)
      [ -e "$pidf" ] || lab_die "no capture '$name' running"
      local pid; pid=$(cat "$pidf")
      # The kernel hands packets to tcpdump in ring blocks, a block at the latest 1 s after its
      # first packet; a packet in an unfinished block when tcpdump exits is counted "received
      # by filter" but never written. So ask tcpdump for its counts (SIGUSR1) until it has
      # written all it received (the kernel counts a packet when it enters the ring), and only
      # then stop it.
      local log=$rd/logs/tcpdump-$name.log i counts seen all_written_at=
      for i in $(seq 1 50); do
        seen=$(grep -c 'received by filter' "$log" || true)
        kill -USR1 "$pid" 2>/dev/null || break
        # Wait for this signal's line (tcpdump prints it from its loop).
        local j
        for j in $(seq 1 20); do
          [ "$(grep -c 'received by filter' "$log" || true)" -gt "$seen" ] && break
          sleep 0.02
        done
        counts=$(sed -n 's/^tcpdump: \([0-9]*\) packets\{0,1\} captured, \([0-9]*\) packets\{0,1\} received by filter.*/\1 \2/p' "$log" | tail -n 1)
        if [ -n "$counts" ] && [ "${counts% *}" = "${counts#* }" ]; then
          all_written_at=${counts% *}
          break
        fi
        sleep 0.1
      done
      stop_pid "$pid" tcpdump
      rm -f "$pidf"
      echo "$pcap"
      # tcpdump's exit statistics: a capture that lost packets cannot vouch for every frame.
      # Once tcpdump had written all it had received (all_written_at), the capture is whole up
      # to that moment, which is after the case ended; a packet arriving between then and
      # tcpdump's exit (a late TCP ACK, a resend) is counted but not written: reported, not
      # failed (capture_whole).
      local captured received dropped
      captured=$(sed -n 's/^\([0-9]*\) packets\{0,1\} captured.*/\1/p' "$log")
      received=$(sed -n 's/^\([0-9]*\) packets\{0,1\} received by filter.*/\1/p' "$log")
      dropped=$(sed -n 's/^\([0-9]*\) packets\{0,1\} dropped by kernel.*/\1/p' "$log")
      if ! capture_whole "$captured" "$received" "$dropped" "$all_written_at"; then
        lab_die "capture '$name' is incomplete: tcpdump captured ${captured:-?} of ${received:-?} packets, ${dropped:-?} dropped by the kernel ($log)"
      fi
      if [ "$captured" != "$received" ]; then
        echo "capture '$name': $((received - captured)) packet(s) arrived after the case ended and were not written (all $all_written_at before were)" >&2
      fi ;;
    *) lab_die "capture start|stop NAME [IP...]" ;;
  esac
}

# --- status -------------------------------------------------------------------------------------
status() {
  if ! ns_exists "$LAB_NS" && [ ! -d "$LAB_STATE" ]; then
    echo "lab '$LAB_NS': down"
    return 1
  fi
  local bad=0 g pid p
  if ns_exists "$LAB_NS"; then
    echo "lab '$LAB_NS': namespace present, bridge: $(NSX ip -br addr show br0 2>/dev/null | awk '{print $2, $3}') MTU $(cat "$LAB_STATE/mtu" 2>/dev/null || echo ?)"
  else
    echo "lab '$LAB_NS': namespace MISSING (stale state; run down or up)"; bad=1
  fi
  echo "run directory: $(run_dir)"
  for g in $(seq 1 "$(guests)"); do
    pid=$(cat "$LAB_STATE/g$g.pid" 2>/dev/null || true)
    if ! pid_is_ours "$pid" "-pidfile $LAB_STATE/g$g.pid"; then
      echo "g$g $(guest_ip "$g"): QEMU NOT RUNNING"; bad=1; continue
    fi
    local info
    if info=$(guestctl -t 5 "$LAB_STATE/g$g.ctl" \
        "echo \$(rdma link show rxe0/1 | awk '{print \$4}') \$(ibv_devinfo -d rxe0 | awk '/active_mtu/{print \$2}') \$(tc qdisc show dev eth0 | grep -o 'netem.*' || echo no-netem)" 2>/dev/null); then
      echo "g$g $(guest_ip "$g"): QEMU pid $pid, rxe0 port $info"
    else
      echo "g$g $(guest_ip "$g"): QEMU pid $pid, shell NOT ANSWERING"; bad=1
    fi
  done
  shopt -s nullglob
  for p in "$LAB_STATE"/attached/*; do
    local name ip ens; name=$(basename "$p"); read -r ip ens _ <"$p"
    if ns_exists "$ens"; then echo "endpoint $name: $ip in namespace $ens"; else echo "endpoint $name: namespace $ens MISSING"; bad=1; fi
  done
  for p in "$LAB_STATE"/capture-*.pid; do
    local c=${p##*/capture-}; c=${c%.pid}
    if pid_is_ours "$(cat "$p")" tcpdump; then echo "capture $c: running"; else echo "capture $c: tcpdump DEAD"; bad=1; fi
  done
  [ "$bad" = 0 ] || return 2
}

need_root
cmd=${1:-}; shift || true
case $cmd in
  up) up "${1:-2}" ;;
  down) down ;;
  status) status ;;
  exec) [ $# -ge 2 ] || lab_die "exec G SCRIPT"; guest_exec "$@" ;;
  netem) [ $# -ge 2 ] || lab_die "netem G ARGS|off"; netem "$@" ;;
  mtu) [ $# -eq 1 ] || lab_die "mtu M"; set_mtu "$1" ;;
  attach) attach "$@" ;;
  attach-routed) attach_routed "$@" ;;
  detach) detach "$@" ;;
  capture) capture "$@" ;;
  run-dir) d=$(run_dir); [ -n "$d" ] || lab_die "lab '$LAB_NS' is not up"; echo "$d" ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
