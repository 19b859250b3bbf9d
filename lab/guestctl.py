#!/usr/bin/env python3
"""Run a bash script inside a lab guest over its serial command channel.

usage: guestctl.py SOCKET [-t TIMEOUT] [--wait] SCRIPT

SOCKET is the QEMU unix-socket chardev behind the guest's /dev/ttyS1. With --wait, first poll
until the guest's shell answers (boot), within the same TIMEOUT. Prints the script's combined
output and exits with its status; 124 on timeout, 125 if the guest (QEMU) is gone.

Protocol (guest side: guest/lab-ctl): send "@@CMD <nonce> <base64 script>\\n", read until
"\\n@@<nonce>:<status>@@\\n". Base64 makes any quoting and multi-line script safe on the wire.
"""
import argparse
import base64
import os
import re
import socket
import sys
import time

EXIT_TIMEOUT = 124
EXIT_GONE = 125


def connect(path, deadline):
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def run(sock, script, deadline):
    """Returns (output bytes, exit status or None on timeout/disconnect)."""
    nonce = os.urandom(6).hex()
    sock.sendall(b"@@CMD %s %s\n" % (nonce.encode(), base64.b64encode(script.encode())))
    end = re.compile(rb"\n@@" + nonce.encode() + rb":(\d+)@@\n")
    buf = b""
    while True:
        m = end.search(buf)
        if m:
            return buf[: m.start()], int(m.group(1))
        left = deadline - time.time()
        if left <= 0:
            return buf, None
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            return buf, None
        buf += chunk


def main():
    ap = argparse.ArgumentParser(description="run a script in a lab guest")
    ap.add_argument("socket")
    ap.add_argument("script")
    ap.add_argument("-t", "--timeout", type=float, default=120.0)
    ap.add_argument("--wait", action="store_true", help="wait for the guest shell first")
    a = ap.parse_args()
    deadline = time.time() + a.timeout
    try:
        s = connect(a.socket, deadline)
        if a.wait:
            while True:
                _, rc = run(s, "true", min(deadline, time.time() + 2))
                if rc == 0:
                    break
                if time.time() > deadline:
                    print("guestctl: the guest shell did not answer", file=sys.stderr)
                    return EXIT_TIMEOUT
        out, rc = run(s, a.script, deadline)
    except OSError as e:
        print(f"guestctl: {a.socket}: {e} (is the guest running?)", file=sys.stderr)
        return EXIT_GONE
    sys.stdout.buffer.write(out)
    if out and not out.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    if rc is None:
        print(f"guestctl: no answer within {a.timeout:.0f}s", file=sys.stderr)
        return EXIT_TIMEOUT
    return rc


if __name__ == "__main__":
    sys.exit(main())
