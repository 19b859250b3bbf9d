#!/usr/bin/env bash
# Builds a Debian package of xroce for the nodes of a cluster: the `xroce` binary in
# /usr/bin and the drop-in libraries in /usr/lib/xroce, where `xroce run` finds them.
#
#   scripts/deb.sh            # cargo build --release, then target/debian/xroce_<version>_<arch>.deb
#   dpkg -i target/debian/xroce_*.deb && xroce run -d eth0 -- ibv_devinfo
#   dpkg -r xroce
#
# The package depends on what the binary and libraries link (libelf, zlib, libc) and
# recommends rdma-core's user tools; it does not replace rdma-core's libibverbs: programs get
# xroce's only when started through `xroce run` (docs/engines.md).
# Env: BUILD_DIR=DIR packages what DIR holds (built already) instead of building target/release.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=${BUILD_DIR:-}
if [ -z "$build" ]; then
  cargo build --release --workspace
  build=target/release
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
out=${OUT_DIR:-target/debian}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/xroce" "$root/usr/share/doc/xroce"
install -m 0755 -s "$build/xroce" "$root/usr/bin/xroce"
for lib in libxroce_ibverbs.so libxroce_rdmacm.so libxroce_mlx5.so libxroce_efa.so; do
  install -m 0644 -s "$build/$lib" "$root/usr/lib/xroce/$lib"
done
# The sonames programs ask for, at one path on every node: `xroce run` puts this folder on
# LD_LIBRARY_PATH, and a launcher that passes its environment to other hosts passes a path
# that exists there too.
install -d "$root/usr/lib/xroce/sonames"
for pair in ibverbs:libibverbs.so.1 rdmacm:librdmacm.so.1 mlx5:libmlx5.so.1 efa:libefa.so.1; do
  ln -s "../libxroce_${pair%%:*}.so" "$root/usr/lib/xroce/sonames/${pair#*:}"
done
install -m 0644 README.md "$root/usr/share/doc/xroce/README.md"
for doc in engines ibverbs rdmacm; do
  install -m 0644 "docs/$doc.md" "$root/usr/share/doc/xroce/$doc.md"
done
size_kib=$(du -sk "$root/usr" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: xroce
Version: $version
Architecture: $arch
Maintainer: xroce developers <xroce@localhost>
Installed-Size: $size_kib
Depends: libc6, libgcc-s1, libelf1, zlib1g
Recommends: ibverbs-utils, rdmacm-utils
Section: net
Priority: optional
Description: userspace RoCEv2 provider over AF_XDP
 xroce talks RDMA (RoCEv2) to hardware HCAs and to Linux soft-RoCE from a machine whose
 NIC has no RDMA: an XDP program steers UDP port 4791 to an AF_XDP socket and a Rust
 engine runs the transport. Unmodified verbs programs, UCX, libfabric and MPI run on its
 drop-in libibverbs.so.1 and librdmacm.so.1 through "xroce run".
EOF
mkdir -p "$out"
deb="$out/xroce_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
