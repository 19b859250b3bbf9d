#!/usr/bin/env bash
# Builds (or reuses) the lab's guest image: a Debian bookworm kernel and an initramfs holding a
# minimal bookworm with the rdma_rxe modules, rdma-core, ibverbs-utils, perftest and pyverbs.
#
#   $XROCE_LAB_DIR/image/vmlinux      the kernel, uncompressed ELF (boots ~7 s faster under TCG)
#   $XROCE_LAB_DIR/image/vmlinuz      the same kernel as Debian ships it (fallback)
#   $XROCE_LAB_DIR/image/rootfs.cpio  the initramfs (uncompressed: QEMU copies it into RAM anyway)
#   $XROCE_LAB_DIR/image/stamp        what the image was built from; a match makes a rerun a no-op
#
# Needs root and a reachable Debian mirror (the one this host's apt uses; override: MIRROR=).
# Env: FORCE=1 rebuilds everything; SKIP_APT=1 does not install host tools.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$HERE/common.sh"
need_root

GUEST_PKGS=kmod,iproute2,procps,iputils-ping,rdma-core,ibverbs-providers,ibverbs-utils,rdmacm-utils,perftest,python3-pyverbs,libfabric1,libfabric-bin
# Kernel modules the guest loads, with their dependencies resolved below.
GUEST_MODS="virtio_pci virtio_net rdma_rxe ib_uverbs rdma_ucm ib_umad crc32_generic crc32_pclmul
  sch_netem ifb act_mirred cls_matchall sch_ingress"
HOST_PKGS="qemu-system-x86 debootstrap cpio kmod iproute2 python3 tcpdump xz-utils"

W=$LAB_DIR/build
mkdir -p "$W/dl" "$LAB_IMAGE"
t0=$(date +%s)
step() { echo "build-image [+$(( $(date +%s) - t0 ))s] $*"; }

# What the image depends on: these scripts, the package lists, and the kernel ABI. The kernel
# ABI is only looked up when apt's cache is there (no network needed for the no-op case).
kernel_pkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}'; }
stamp_of() {
  { cat "$HERE/build-image.sh" "$HERE"/guest/*; echo "$GUEST_PKGS $GUEST_MODS $1"; } | sha256sum | cut -d' ' -f1
}
KPKG=$(kernel_pkg || true)
if [ "${FORCE:-0}" != 1 ] && [ -n "$KPKG" ] && [ -s "$LAB_IMAGE/rootfs.cpio" ] \
   && [ "$(cat "$LAB_IMAGE/stamp" 2>/dev/null)" = "$(stamp_of "$KPKG")" ]; then
  step "image up to date ($KPKG): $LAB_IMAGE"
  exit 0
fi

# 1. Host tools. qemu-utils is deliberately not in the list: some images carry a backported
#    qemu-utils that conflicts with bookworm's qemu-system-common.
if [ "${SKIP_APT:-0}" != 1 ]; then
  missing=$(for p in $HOST_PKGS; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
  if [ -n "$missing" ] || [ -z "$KPKG" ]; then
    step "apt-get install $missing"
    apt-get update -qq
    # shellcheck disable=SC2086
    [ -z "$missing" ] || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
fi
KPKG=${KPKG:-$(kernel_pkg)}
[ -n "$KPKG" ] || lab_die "cannot find the kernel package linux-image-amd64 depends on (apt-get update?)"
KV=${KPKG#linux-image-}

# The Debian mirror: the first non-security one in this host's apt sources.
detect_mirror() {
  local u
  u=$(grep -h -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  [ -n "$u" ] || u=$(grep -h -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk '{print $2}' | grep -v security | head -n1 || true)
  echo "${u:-http://deb.debian.org/debian}"
}
MIRROR=${MIRROR:-$(detect_mirror)}

# 2. The kernel package, unpacked (never installed on the host).
if [ "${FORCE:-0}" = 1 ] || [ ! -d "$W/kernel/lib/modules/$KV" ]; then
  step "download and unpack $KPKG"
  rm -rf "$W/kernel" && mkdir -p "$W/kernel"
  (cd "$W/dl" && rm -f "${KPKG}"_*.deb && apt-get download "$KPKG" >/dev/null 2>&1) \
    || lab_die "apt-get download $KPKG failed"
  dpkg-deb -x "$W/dl/${KPKG}"_*.deb "$W/kernel"
fi
cp "$W/kernel/boot/vmlinuz-$KV" "$LAB_IMAGE/vmlinuz"
# The bzImage wraps an xz-compressed ELF; QEMU boots the ELF directly (PVH entry), which skips
# the self-decompression that costs seconds under TCG.
python3 - "$LAB_IMAGE/vmlinuz" "$LAB_IMAGE/vmlinux" <<'PY' || { rm -f "$LAB_IMAGE/vmlinux"; step "no ELF kernel extracted; the lab boots vmlinuz"; }
import lzma, sys
data = open(sys.argv[1], "rb").read()
start = data.find(b"\xfd7zXZ\x00")
if start < 0:
    sys.exit("bzImage has no xz payload")
elf = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[start:])
if elf[:4] != b"\x7fELF":
    sys.exit("xz payload is not an ELF image")
open(sys.argv[2], "wb").write(elf)
PY

# 3. Root file system: debootstrap minbase plus the RDMA userspace.
if [ "${FORCE:-0}" = 1 ] || [ ! -f "$W/rootfs.pkgs" ] || [ "$(cat "$W/rootfs.pkgs")" != "$GUEST_PKGS" ]; then
  step "debootstrap bookworm from $MIRROR (log: $W/debootstrap.log)"
  rm -rf "$W/rootfs"
  debootstrap --variant=minbase --include="$GUEST_PKGS" bookworm "$W/rootfs" "$MIRROR" >"$W/debootstrap.log" 2>&1 \
    || { tail -n 20 "$W/debootstrap.log" >&2; lab_die "debootstrap failed"; }
  echo "$GUEST_PKGS" >"$W/rootfs.pkgs"
fi
R=$W/rootfs

# 4. Kernel modules: the dependency closure of $GUEST_MODS, nothing else.
step "kernel modules for $KV"
depmod -b "$W/kernel" "$KV"
rm -rf "$R/lib/modules" && mkdir -p "$R/lib/modules/$KV"
# shellcheck disable=SC2086
for m in $GUEST_MODS; do modprobe -d "$W/kernel" -S "$KV" --show-depends "$m"; done \
  | awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
      rel=${f#*/lib/modules/$KV/}
      mkdir -p "$R/lib/modules/$KV/$(dirname "$rel")"
      cp "$W/kernel/lib/modules/$KV/$rel" "$R/lib/modules/$KV/$rel"
    done
cp "$W/kernel/lib/modules/$KV"/modules.{order,builtin,builtin.modinfo} "$R/lib/modules/$KV/" 2>/dev/null || true
depmod -b "$R" "$KV"

# 5. Trim what is never used at run time (the initramfs lives in guest RAM).
rm -rf "$R"/var/cache/apt/* "$R"/var/lib/apt/lists/* "$R"/usr/share/{doc,man,info,locale}/* \
       "$R"/usr/lib/udev/hwdb.bin "$R"/usr/lib/udev/hwdb.d "$R"/usr/lib/x86_64-linux-gnu/gconv \
       "$R"/var/log/* "$R"/debootstrap 2>/dev/null || true
echo rxe >"$R/etc/hostname"
printf '127.0.0.1 localhost\n' >"$R/etc/hosts"

# 6. The guest's /init and its command channel (see guest/init and guest/lab-ctl).
install -m 755 "$HERE/guest/init" "$R/init"
for f in "$HERE"/guest/*; do
  [ "$(basename "$f")" = init ] || install -D -m 755 "$f" "$R/usr/local/bin/$(basename "$f")"
done

# 7. Pack.
step "pack initramfs"
(cd "$R" && find . -xdev -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$LAB_IMAGE/rootfs.cpio.tmp"
mv "$LAB_IMAGE/rootfs.cpio.tmp" "$LAB_IMAGE/rootfs.cpio"
echo "$KV" >"$LAB_IMAGE/kernel-version"
stamp_of "$KPKG" >"$LAB_IMAGE/stamp"
step "done: $(du -sh "$LAB_IMAGE/rootfs.cpio" | cut -f1) initramfs, kernel $KV, in $LAB_IMAGE"
