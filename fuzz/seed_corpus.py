#!/usr/bin/env python3
"""Writes every frame of the fixture captures into fuzz/corpus/parse_frame/ as one file
each (named by SHA-1, so re-running is idempotent). The corpus is not committed."""
import hashlib, os, struct, sys

here = os.path.dirname(os.path.abspath(__file__))
fixtures = os.path.join(here, "..", "tests", "fixtures")
out = os.path.join(here, "corpus", "parse_frame")
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
        for f in (frame, frame[:600]):
            h = hashlib.sha1(f).hexdigest()
            path = os.path.join(out, h)
            if not os.path.exists(path):
                open(path, "wb").write(f)
                n += 1
print(f"seed_corpus: wrote {n} new frames to {out}")
