#!/usr/bin/env python3
"""Writes every frame of the fixture captures into fuzz/corpus/TARGET/ (parse_frame by
default) as one file each (named by SHA-1, so re-running is idempotent). For parse_cm_mad,
the 256-byte MAD of each UD SEND to QP1 is written too. The corpus is not committed."""
import hashlib, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
fixtures = os.path.join(here, "..", "tests", "fixtures")
target = sys.argv[1] if len(sys.argv) > 1 else "parse_frame"
out = os.path.join(here, "corpus", target)
os.makedirs(out, exist_ok=True)
n = 0
for name in sorted(os.listdir(fixtures)):
    if not name.endswith(".pcap"):
        continue
    data = open(os.path.join(fixtures, name), "rb").read()
    if struct.unpack("<I", data[:4])[0] != 0xA1B2C3D4:
        sys.exit(f"{name}: expected a little-endian microsecond pcap")
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack("<I", data[off + 8:off + 12])[0]
        frame = data[off + 16:off + 16 + incl]
        off += 16 + incl
        # Large frames add little: keep their first 600 bytes too, fixed up or not.
        seeds = [frame, frame[:600]]
        # A UD SEND (BTH opcode 0x64 at 42) to QP1 (dest QP at 47..50) over IPv4: its MAD.
        if target == "parse_cm_mad" and len(frame) >= 318 and frame[42] == 0x64 \
                and frame[47:50] == b"\x00\x00\x01":
            seeds.append(frame[62:318])
        for f in seeds:
            h = hashlib.sha1(f).hexdigest()
            path = os.path.join(out, h)
            if not os.path.exists(path):
                open(path, "wb").write(f)
                n += 1
print(f"seed_corpus: wrote {n} new frames to {out}")
