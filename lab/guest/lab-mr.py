#!/usr/bin/env python3
"""lab-mr: check RDMA WRITE and READ byte for byte against a registered buffer (pyverbs).

  lab-mr.py server [--size N] [--port P] [--mtu M]         expose an N-byte MR (random content)
  lab-mr.py client [--size N] [--port P] [--mtu M] HOST    READ it, WRITE new data, READ it back

Out-of-band exchange on TCP (default port 18515), one JSON line each way, client first:
  {"qpn": int, "psn": int, "gid": "32 hex digits", "addr": int, "rkey": int, "len": int,
   "sha256": "hex digest of the MR's current content" (server only)}
Then the client:
  1. READs the whole server MR and checks its SHA-256 against the server's line;
  2. WRITEs N random bytes to it, sends {"op": "written"}; the server replies
     {"sha256": digest of its MR now}, which must equal the digest of what was written;
  3. READs the MR back and compares it byte for byte with what it wrote;
  4. sends {"op": "done"}. Both exit 0 only if every check passed.
Transfers are split into WRs of at most 1 MiB. RC, GID index 1, port 1, device rxe0.
"""
import argparse
import hashlib
import json
import os
import socket
import sys

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

CHUNK = 1 << 20
MTUS = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
        2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def gid_hex(gid):
    return str(gid).replace(":", "")


def gid_from_hex(h):
    return GID(":".join(h[i:i + 4] for i in range(0, 32, 4)))


class Endpoint:
    def __init__(self, size, mtu):
        self.ctx = Context(name="rxe0")
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, size, ACCESS)
        self.cq = CQ(self.ctx, 64)
        cap = QPCap(max_send_wr=16, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        self.psn = int.from_bytes(os.urandom(3), "big")
        self.size = size
        self.mtu = mtu

    def hello(self):
        return {"qpn": self.qp.qp_num, "psn": self.psn, "gid": gid_hex(self.ctx.query_gid(1, 1)),
                "addr": self.mr.buf, "rkey": self.mr.rkey, "len": self.size}

    def connect(self, peer):
        attr = QPAttr(port_num=1)
        attr.qp_access_flags = ACCESS
        attr.path_mtu = MTUS[self.mtu]
        attr.dest_qp_num = peer["qpn"]
        attr.rq_psn = peer["psn"]
        attr.max_dest_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid_from_hex(peer["gid"]), sgid_index=1),
                              is_global=1, port_num=1)
        attr.sq_psn = self.psn
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.max_rd_atomic = 1
        self.qp.to_rts(attr)

    def transfer(self, opcode, peer):
        """READ or WRITE the whole buffer from/to the peer's MR, one WR per chunk."""
        for off in range(0, self.size, CHUNK):
            n = min(CHUNK, self.size - off)
            wr = SendWR(opcode=opcode, num_sge=1, sg=[SGE(self.mr.buf + off, n, self.mr.lkey)],
                        send_flags=e.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(peer["rkey"], peer["addr"] + off)
            self.qp.post_send(wr)
            while True:
                got, wcs = self.cq.poll()
                if got:
                    if wcs[0].status != e.IBV_WC_SUCCESS:
                        sys.exit(f"lab-mr: work completion status {wcs[0].status} at offset {off}")
                    break

    def content(self):
        return self.mr.read(self.size, 0)


def send_line(f, obj):
    f.write((json.dumps(obj) + "\n").encode())
    f.flush()


def recv_line(f):
    line = f.readline()
    if not line:
        sys.exit("lab-mr: peer closed the connection")
    return json.loads(line)


def server(a):
    ep = Endpoint(a.size, a.mtu)
    ep.mr.write(os.urandom(a.size), a.size)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", a.port))
    ls.listen(1)
    conn, _ = ls.accept()
    f = conn.makefile("rwb")
    peer = recv_line(f)
    ep.connect(peer)
    send_line(f, dict(ep.hello(), sha256=hashlib.sha256(ep.content()).hexdigest()))
    while True:
        msg = recv_line(f)
        if msg.get("op") == "written":
            send_line(f, {"sha256": hashlib.sha256(ep.content()).hexdigest()})
        elif msg.get("op") == "done":
            print(f"lab-mr server: {a.size} bytes exposed, peer finished")
            return 0


def client(a):
    ep = Endpoint(a.size, a.mtu)
    conn = socket.create_connection((a.host, a.port), timeout=60)
    f = conn.makefile("rwb")
    send_line(f, ep.hello())
    peer = recv_line(f)
    if peer["len"] < a.size:
        sys.exit(f"lab-mr: server MR has {peer['len']} bytes, need {a.size}")
    ep.connect(peer)
    ep.transfer(e.IBV_WR_RDMA_READ, peer)
    if hashlib.sha256(ep.content()).hexdigest() != peer["sha256"]:
        sys.exit("lab-mr: READ returned different bytes than the server's MR holds")
    data = os.urandom(a.size)
    ep.mr.write(data, a.size)
    ep.transfer(e.IBV_WR_RDMA_WRITE, peer)
    send_line(f, {"op": "written"})
    if recv_line(f)["sha256"] != hashlib.sha256(data).hexdigest():
        sys.exit("lab-mr: after the WRITE the server's MR differs from what was written")
    ep.mr.write(bytes(a.size), a.size)
    ep.transfer(e.IBV_WR_RDMA_READ, peer)
    back = ep.content()
    if back != data:
        first = next(i for i in range(a.size) if back[i] != data[i])
        sys.exit(f"lab-mr: READ back differs from the WRITE first at byte {first}")
    send_line(f, {"op": "done"})
    print(f"lab-mr client: READ {a.size} B ok, WRITE {a.size} B ok (server digest), READ back ok")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("host", nargs="?")
    ap.add_argument("--size", type=int, default=4 << 20)
    ap.add_argument("--port", type=int, default=18515)
    ap.add_argument("--mtu", type=int, default=1024, choices=sorted(MTUS))
    a = ap.parse_intermixed_args()
    if a.role == "client" and not a.host:
        ap.error("client needs HOST")
    return server(a) if a.role == "server" else client(a)


if __name__ == "__main__":
    sys.exit(main())
