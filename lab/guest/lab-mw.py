#!/usr/bin/env python3
"""lab-mw: memory windows checked byte for byte against a peer (pyverbs).

  lab-mw.py server [--size N] [--port P] [--mtu M]         own an N-byte MR and two windows
  lab-mw.py client [--size N] [--port P] [--mtu M] HOST    use them, then be refused

The server's MR (random content, MW_BIND access) is four quarters q0..q3. It has a type 1
window W1 (bound by ibv_bind_mw) over q1, REMOTE_READ|REMOTE_WRITE, and a type 2 window W2
(bound by an IBV_WR_BIND_MW work request on QP 0) over q2, REMOTE_READ|REMOTE_WRITE.
Four RC QPs per side; a refused access ends its QP, so each refusal uses the next one.

Out-of-band exchange on TCP (default port 18515), one JSON line each way, client first:
  client: {"qpns": [4 ints], "psns": [4 ints], "gid": "32 hex digits"}
  server: {"qpns", "psns", "gid", "addr": MR start, "len": N, "quarters": [4 SHA-256 hex],
           "w1": {"rkey", "addr", "len"}, "w2": {"rkey", "addr", "len"}}
Then the client, checking the server's memory after every step with {"op": "digests"}
(answer {"quarters": [...]}: the digest of each quarter as the server's CPU reads it):
  1. QP0: READ W1, its digest must be q1's; WRITE fresh bytes through W2 (q2 changes).
  2. QP0: SEND_WITH_INV of W2's R_Key; {"op": "received"} -> {"status", "invalidated"}: the
     server's receive must report that R_Key invalidated. WRITE through it: REM_ACCESS_ERR,
     no quarter changes.
  3. {"op": "bind2"} -> {"rkey"}: the server binds a type 2 window over q2 again, on QP1
     (xroce: the now free W2; this script: a fresh one, see "bind2" below). WRITE
     through it (q2 changes); {"op": "local_inv"} -> {"ok"}: the server invalidates it with
     IBV_WR_LOCAL_INV; WRITE through it: REM_ACCESS_ERR, nothing changes.
  4. {"op": "bind1"} -> {"rkey", "addr"}: the server rebinds W1 over q0, REMOTE_READ only,
     through QP2. READ it (digest of q0); WRITE through W1's old R_Key: REM_ACCESS_ERR.
  5. QP3: WRITE through the read-only W1: REM_ACCESS_ERR, nothing changes.
  6. {"op": "done"}. Both exit 0 only if every check passed.
RC, GID index 1, port 1, device rxe0.
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
from pyverbs.mr import MR, MW, MWBind, MWBindInfo
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

NQP = 4
MTUS = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
        2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
REMOTE = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
MR_ACCESS = e.IBV_ACCESS_LOCAL_WRITE | REMOTE | e.IBV_ACCESS_MW_BIND


def fail(msg):
    sys.exit(f"lab-mw: {msg}")


def gid_hex(gid):
    return str(gid).replace(":", "")


def gid_from_hex(h):
    return GID(":".join(h[i:i + 4] for i in range(0, 32, 4)))


def inc_rkey(rkey):
    return (rkey & ~0xFF) | ((rkey + 1) & 0xFF)


def sha(data):
    return hashlib.sha256(data).hexdigest()


class Endpoint:
    def __init__(self, size, mtu):
        self.ctx = Context(name="rxe0")
        self.pd = PD(self.ctx)
        self.mr = MR(self.pd, size, MR_ACCESS)
        self.cq = CQ(self.ctx, 256)
        cap = QPCap(max_send_wr=16, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        self.qps = [QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                           cap=cap)) for _ in range(NQP)]
        self.psns = [int.from_bytes(os.urandom(3), "big") for _ in range(NQP)]
        self.size = size
        self.mtu = mtu

    def hello(self):
        return {"qpns": [qp.qp_num for qp in self.qps], "psns": self.psns,
                "gid": gid_hex(self.ctx.query_gid(1, 1))}

    def connect(self, peer):
        for i, qp in enumerate(self.qps):
            attr = QPAttr(port_num=1)
            # MW_BIND on the QP too: some providers want it for ibv_bind_mw.
            attr.qp_access_flags = REMOTE | e.IBV_ACCESS_MW_BIND
            attr.path_mtu = MTUS[self.mtu]
            attr.dest_qp_num = peer["qpns"][i]
            attr.rq_psn = peer["psns"][i]
            attr.max_dest_rd_atomic = 1
            attr.min_rnr_timer = 12
            attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=gid_from_hex(peer["gid"]), sgid_index=1),
                                  is_global=1, port_num=1)
            attr.sq_psn = self.psns[i]
            attr.timeout = 14
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            attr.max_rd_atomic = 1
            qp.to_rts(attr)

    def wait(self, wr_id):
        """The completion of wr_id (flushes of other WRs are skipped)."""
        while True:
            got, wcs = self.cq.poll()
            if got and wcs[0].wr_id == wr_id:
                return wcs[0]

    def post(self, qp, wr):
        self.qps[qp].post_send(wr)

    def quarters(self):
        q = self.size // 4
        data = self.mr.read(self.size, 0)
        return [sha(data[i * q:(i + 1) * q]) for i in range(4)]


def send_line(f, obj):
    f.write((json.dumps(obj) + "\n").encode())
    f.flush()


def recv_line(f):
    line = f.readline()
    if not line:
        fail("peer closed the connection")
    return json.loads(line)


def bind_type2(ep, mw, qp, addr, length, wr_id):
    wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_BIND_MW, num_sge=0)
    wr.set_bind_wr(mw, MWBindInfo(ep.mr, addr, length, REMOTE))
    ep.post(qp, wr)
    wc = ep.wait(wr_id)
    if wc.status != e.IBV_WC_SUCCESS:
        fail(f"type 2 bind completed with status {wc.status}")
    return wr.rkey


def bind_type1(ep, mw, qp, addr, length, access, wr_id):
    ep.qps[qp].bind_mw(mw, MWBind(MWBindInfo(ep.mr, addr, length, access),
                                  e.IBV_SEND_SIGNALED, wr_id))
    wc = ep.wait(wr_id)
    if wc.status != e.IBV_WC_SUCCESS:
        fail(f"type 1 bind completed with status {wc.status}")
    return mw.rkey


def server(a):
    ep = Endpoint(a.size, a.mtu)
    q = a.size // 4
    ep.mr.write(os.urandom(a.size), a.size)
    base = ep.mr.buf
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", a.port))
    ls.listen(1)
    conn, _ = ls.accept()
    f = conn.makefile("rwb")
    peer = recv_line(f)
    ep.connect(peer)
    w1 = MW(ep.pd, e.IBV_MW_TYPE_1)
    w2 = MW(ep.pd, e.IBV_MW_TYPE_2)
    windows = [w1, w2]
    rkey1 = bind_type1(ep, w1, 0, base + q, q, REMOTE, 1)
    rkey2 = bind_type2(ep, w2, 0, base + 2 * q, q, 2)
    # The receive the client's SEND_WITH_INV consumes, in a region of its own (the quarters
    # must change only by the client's WRITEs).
    inbox = MR(ep.pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    ep.qps[0].post_recv(RecvWR(wr_id=100, num_sge=1, sg=[SGE(inbox.buf, 64, inbox.lkey)]))
    send_line(f, dict(ep.hello(), addr=base, len=a.size, quarters=ep.quarters(),
                      w1={"rkey": rkey1, "addr": base + q, "len": q},
                      w2={"rkey": rkey2, "addr": base + 2 * q, "len": q}))
    while True:
        msg = recv_line(f)
        op = msg.get("op")
        if op == "digests":
            send_line(f, {"quarters": ep.quarters()})
        elif op == "received":
            wc = ep.wait(100)
            # rxe (Linux 6.1) puts the kernel's IB_WC_WITH_INVALIDATE (1 << 2) in a user
            # completion, where libibverbs reads IBV_WC_WITH_INV as 1 << 3: take either.
            with_inv = wc.wc_flags & (e.IBV_WC_WITH_INV | (1 << 2))
            print(f"lab-mw server: SEND_WITH_INV receive wc_flags {wc.wc_flags:#x} "
                  f"invalidated_rkey {wc.imm_data:#x}", flush=True)
            send_line(f, {"status": wc.status, "invalidated": wc.imm_data if with_inv else None})
        elif op == "bind2":
            # A fresh type 2 window on QP1: rxe completes a rebind of the invalidated W2 with
            # MW_BIND_ERR (pyverbs can only offer it the same R_Key again).
            w3 = MW(ep.pd, e.IBV_MW_TYPE_2)
            windows.append(w3)
            rkey2 = bind_type2(ep, w3, 1, base + 2 * q, q, 3)
            send_line(f, {"rkey": rkey2})
        elif op == "local_inv":
            wr = SendWR(wr_id=4, opcode=e.IBV_WR_LOCAL_INV, num_sge=0, imm_data=rkey2)
            ep.post(1, wr)
            wc = ep.wait(4)
            send_line(f, {"ok": wc.status == e.IBV_WC_SUCCESS})
        elif op == "bind1":
            rkey1 = bind_type1(ep, w1, 2, base, q, e.IBV_ACCESS_REMOTE_READ, 5)
            send_line(f, {"rkey": rkey1, "addr": base})
        elif op == "done":
            # Windows first: a region with bound windows cannot be deregistered.
            for w in windows:
                w.close()
            print(f"lab-mw server: {a.size} bytes, windows bound, used and invalidated")
            return 0
        else:
            fail(f"unknown request {msg}")


class Client:
    def __init__(self, a):
        self.ep = Endpoint(a.size, a.mtu)
        conn = socket.create_connection((a.host, a.port), timeout=60)
        self.f = conn.makefile("rwb")
        send_line(self.f, self.ep.hello())
        self.peer = recv_line(self.f)
        if self.peer["len"] != a.size:
            fail(f"server MR has {self.peer['len']} bytes, we use --size {a.size}")
        self.ep.connect(self.peer)
        self.expect = list(self.peer["quarters"])
        self.next_id = 10

    def ask(self, obj):
        send_line(self.f, obj)
        return recv_line(self.f)

    def rdma(self, qp, opcode, rkey, addr, length):
        """One READ or WRITE of the local buffer's first `length` bytes; its status."""
        self.next_id += 1
        wr = SendWR(wr_id=self.next_id, opcode=opcode, num_sge=1,
                    sg=[SGE(self.ep.mr.buf, length, self.ep.mr.lkey)])
        wr.set_wr_rdma(rkey, addr)
        self.ep.post(qp, wr)
        return self.ep.wait(self.next_id).status

    def check_memory(self, step):
        got = self.ask({"op": "digests"})["quarters"]
        for i in range(4):
            if got[i] != self.expect[i]:
                fail(f"{step}: quarter {i} of the server's memory is not what it should be")

    def write_ok(self, qp, rkey, addr, quarter, step):
        data = os.urandom(self.ep.size // 4)
        self.ep.mr.write(data, len(data))
        status = self.rdma(qp, e.IBV_WR_RDMA_WRITE, rkey, addr, len(data))
        if status != e.IBV_WC_SUCCESS:
            fail(f"{step}: WRITE through the window completed with status {status}")
        self.expect[quarter] = sha(data)
        self.check_memory(step)

    def write_refused(self, qp, rkey, addr, step):
        self.ep.mr.write(os.urandom(self.ep.size // 4), self.ep.size // 4)
        status = self.rdma(qp, e.IBV_WR_RDMA_WRITE, rkey, addr, self.ep.size // 4)
        if status != e.IBV_WC_REM_ACCESS_ERR:
            fail(f"{step}: WRITE completed with status {status}, not REM_ACCESS_ERR")
        self.check_memory(step)

    def read_ok(self, qp, rkey, addr, quarter, step):
        q = self.ep.size // 4
        status = self.rdma(qp, e.IBV_WR_RDMA_READ, rkey, addr, q)
        if status != e.IBV_WC_SUCCESS:
            fail(f"{step}: READ through the window completed with status {status}")
        if sha(self.ep.mr.read(q, 0)) != self.expect[quarter]:
            fail(f"{step}: READ returned other bytes than quarter {quarter} holds")


def client(a):
    c = Client(a)
    w1, w2 = c.peer["w1"], c.peer["w2"]
    c.read_ok(0, w1["rkey"], w1["addr"], 1, "READ through W1")
    c.write_ok(0, w2["rkey"], w2["addr"], 2, "WRITE through W2")
    c.next_id += 1
    wr = SendWR(wr_id=c.next_id, opcode=e.IBV_WR_SEND_WITH_INV, num_sge=1,
                sg=[SGE(c.ep.mr.buf, 16, c.ep.mr.lkey)], imm_data=w2["rkey"])
    c.ep.post(0, wr)
    if c.ep.wait(c.next_id).status != e.IBV_WC_SUCCESS:
        fail("SEND_WITH_INV failed")
    got = c.ask({"op": "received"})
    if got["status"] != e.IBV_WC_SUCCESS or got["invalidated"] != w2["rkey"]:
        fail(f"the server's receive reported {got}, not R_Key {w2['rkey']:#x} invalidated")
    c.write_refused(0, w2["rkey"], w2["addr"], "WRITE through W2 after SEND_WITH_INV")
    rkey2 = c.ask({"op": "bind2"})["rkey"]
    c.write_ok(1, rkey2, w2["addr"], 2, "WRITE through W2 bound again")
    if not c.ask({"op": "local_inv"})["ok"]:
        fail("the server's LOCAL_INV failed")
    c.write_refused(1, rkey2, w2["addr"], "WRITE through W2 after LOCAL_INV")
    moved = c.ask({"op": "bind1"})
    c.read_ok(2, moved["rkey"], moved["addr"], 0, "READ through W1 rebound")
    c.write_refused(2, w1["rkey"], w1["addr"], "WRITE through W1's old R_Key")
    c.write_refused(3, moved["rkey"], moved["addr"], "WRITE through the read-only W1")
    send_line(c.f, {"op": "done"})
    print("lab-mw client: windows used, invalidated, rebound; every refusal left memory as it was")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("host", nargs="?")
    ap.add_argument("--size", type=int, default=64 << 10)
    ap.add_argument("--port", type=int, default=18515)
    ap.add_argument("--mtu", type=int, default=1024, choices=sorted(MTUS))
    a = ap.parse_intermixed_args()
    if a.role == "client" and not a.host:
        ap.error("client needs HOST")
    if a.size % 4 or a.size < 4096:
        ap.error("--size must be a multiple of 4, at least 4096")
    return server(a) if a.role == "server" else client(a)


if __name__ == "__main__":
    sys.exit(main())
