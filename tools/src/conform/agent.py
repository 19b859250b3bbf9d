#!/usr/bin/python3
"""The target agent of `xroce conform` (issue 16): runs on the host of the RoCE stack under
test (an rxe guest, a host with a NIC, or xroce itself through its libibverbs.so.1) and does
there, through pyverbs (rdma-core's Python binding of libibverbs), what the conformance peer
asks: make CQs, QPs and MRs, connect a QP to the peer, post work requests, report
completions, QP states and memory contents.

    agent.py --device DEV [--gid-index N] [--port 1] (--listen HOST:PORT | --unix PATH)

Protocol: one JSON object per line each way. A request is {"id": N, "cmd": NAME, ...}; the
answer {"id": N, "ok": true, ...} or {"id": N, "ok": false, "error": TEXT}. Bytes travel as
hex strings. One client at a time; its objects are destroyed when it disconnects. Commands:

  hello                               device, port, GID and vendor facts
  create_qp  type(rc|ud) [cq_depth max_send_wr max_recv_wr max_rd_atomic]  -> qp, qpn
  reg_mr     size access[local_write remote_write remote_read remote_atomic]  -> mr addr rkey lkey
  write_mem  mr offset hex            read_mem mr offset len -> hex
  connect    qp remote_qpn remote_gid rq_psn sq_psn [mtu timeout retry_cnt rnr_retry
             min_rnr_timer max_rd_atomic max_dest_rd_atomic]   RESET -> INIT -> RTR -> RTS
  ud_ready   qp qkey [sq_psn]          a UD QP RESET -> INIT (Q_Key) -> RTR -> RTS
  modify     qp state(err|reset)      query_qp qp -> state, sq_psn, rq_psn
  post_recv  qp wr_id mr offset len
  post_send  qp wr_id op(send|send_imm|write|write_imm|read|cmp_swap|fetch_add) mr offset len
             [remote_addr rkey imm compare swap add signaled]
  poll       qp [max timeout_ms]      -> wcs [{wr_id status status_name opcode byte_len imm}]
  counters                            -> source, counters {name: value}: the device's counters
                                         (sysfs hw_counters of a kernel device such as rxe, or
                                         xroce_read_counters of xroce's libibverbs), source
                                         null and no counters where the stack has none
  bye

Any failure of a call is an answer with ok false and pyverbs' message, never a crash of the
agent: a conformance case often makes the target fail on purpose.
"""
import argparse
import ctypes
import json
import os
import socket
import sys
import time
import traceback

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

ACCESS = {
    "local_write": e.IBV_ACCESS_LOCAL_WRITE,
    "remote_write": e.IBV_ACCESS_REMOTE_WRITE,
    "remote_read": e.IBV_ACCESS_REMOTE_READ,
    "remote_atomic": e.IBV_ACCESS_REMOTE_ATOMIC,
}
SEND_OPS = {
    "send": e.IBV_WR_SEND,
    "send_imm": e.IBV_WR_SEND_WITH_IMM,
    "write": e.IBV_WR_RDMA_WRITE,
    "write_imm": e.IBV_WR_RDMA_WRITE_WITH_IMM,
    "read": e.IBV_WR_RDMA_READ,
    "cmp_swap": e.IBV_WR_ATOMIC_CMP_AND_SWP,
    "fetch_add": e.IBV_WR_ATOMIC_FETCH_AND_ADD,
}
MTU = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
       2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
STATES = {e.IBV_QPS_RESET: "reset", e.IBV_QPS_INIT: "init", e.IBV_QPS_RTR: "rtr",
          e.IBV_QPS_RTS: "rts", e.IBV_QPS_SQD: "sqd", e.IBV_QPS_SQE: "sqe",
          e.IBV_QPS_ERR: "err"}
WC_STATUS = {v: k for k, v in vars(e).items() if k.startswith("IBV_WC_") and
             k.endswith("_ERR") or k == "IBV_WC_SUCCESS"}
WC_OPCODE = {e.IBV_WC_SEND: "send", e.IBV_WC_RDMA_WRITE: "write", e.IBV_WC_RDMA_READ: "read",
             e.IBV_WC_COMP_SWAP: "cmp_swap", e.IBV_WC_FETCH_ADD: "fetch_add",
             e.IBV_WC_RECV: "recv", e.IBV_WC_RECV_RDMA_WITH_IMM: "recv_rdma_imm"}


class Failed(Exception):
    """A request the agent refuses (bad arguments, unknown object)."""


class Session:
    """One client's objects."""

    def __init__(self, ctx, port, gid_index):
        self.ctx = ctx
        self.port = port
        self.gid_index = gid_index
        self.pd = PD(ctx)
        self.qps = {}  # handle -> (QP, CQ)
        self.mrs = {}  # handle -> MR
        self.next_handle = 1

    def handle(self):
        h = self.next_handle
        self.next_handle += 1
        return h

    def qp(self, req):
        try:
            return self.qps[int(req["qp"])]
        except (KeyError, ValueError, TypeError):
            raise Failed(f"no qp {req.get('qp')!r}")

    def mr(self, req):
        try:
            return self.mrs[int(req["mr"])]
        except (KeyError, ValueError, TypeError):
            raise Failed(f"no mr {req.get('mr')!r}")

    def close(self):
        for qp, cq in self.qps.values():
            qp.close()
            cq.close()
        for mr in self.mrs.values():
            mr.close()
        self.pd.close()


def need(req, key, kind=int):
    if key not in req:
        raise Failed(f"{req.get('cmd')}: missing {key!r}")
    try:
        return kind(req[key])
    except (ValueError, TypeError):
        raise Failed(f"{req.get('cmd')}: {key!r} is not a {kind.__name__}")


def cmd_hello(s, req):
    attr = s.ctx.query_device()
    port = s.ctx.query_port(s.port)
    gid = s.ctx.query_gid(s.port, s.gid_index)
    return {"device": s.ctx.name, "port": s.port, "gid_index": s.gid_index, "gid": str(gid),
            "vendor_id": attr.vendor_id, "vendor_part_id": attr.vendor_part_id,
            "max_qp_rd_atom": attr.max_qp_rd_atom, "active_mtu": 128 << port.active_mtu,
            "pid": os.getpid()}


def cmd_create_qp(s, req):
    kind = req.get("type", "rc")
    qp_type = {"rc": e.IBV_QPT_RC, "ud": e.IBV_QPT_UD}.get(kind)
    if qp_type is None:
        raise Failed(f"create_qp: type {kind!r} (rc or ud)")
    cq = CQ(s.ctx, int(req.get("cq_depth", 64)))
    cap = QPCap(max_send_wr=int(req.get("max_send_wr", 16)),
                max_recv_wr=int(req.get("max_recv_wr", 16)), max_send_sge=1, max_recv_sge=1)
    qp = QP(s.pd, QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=cap))
    h = s.handle()
    s.qps[h] = (qp, cq)
    return {"qp": h, "qpn": qp.qp_num}


def cmd_reg_mr(s, req):
    access = 0
    for name in req.get("access", ["local_write"]):
        if name not in ACCESS:
            raise Failed(f"reg_mr: access {name!r} ({', '.join(ACCESS)})")
        access |= ACCESS[name]
    mr = MR(s.pd, need(req, "size"), access)
    h = s.handle()
    s.mrs[h] = mr
    return {"mr": h, "addr": mr.buf, "rkey": mr.rkey, "lkey": mr.lkey}


def cmd_write_mem(s, req):
    mr = s.mr(req)
    data = bytes.fromhex(need(req, "hex", str))
    offset = need(req, "offset")
    if offset < 0 or offset + len(data) > mr.length:
        raise Failed("write_mem: outside the MR")
    mr.write(data, len(data), offset)
    return {}


def cmd_read_mem(s, req):
    mr = s.mr(req)
    offset, length = need(req, "offset"), need(req, "len")
    if offset < 0 or length < 0 or offset + length > mr.length:
        raise Failed("read_mem: outside the MR")
    return {"hex": bytes(mr.read(length, offset)).hex()}


def cmd_connect(s, req):
    qp, _ = s.qp(req)
    mtu = MTU.get(int(req.get("mtu", 1024)))
    if mtu is None:
        raise Failed(f"connect: mtu {req.get('mtu')} (256 to 4096)")
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index = 0
    attr.port_num = s.port
    attr.qp_access_flags = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                            e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)
    qp.to_init(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR)
    attr.path_mtu = mtu
    attr.dest_qp_num = need(req, "remote_qpn")
    attr.rq_psn = need(req, "rq_psn")
    attr.max_dest_rd_atomic = int(req.get("max_dest_rd_atomic", 16))
    attr.min_rnr_timer = int(req.get("min_rnr_timer", 12))
    gr = GlobalRoute(dgid=GID(need(req, "remote_gid", str)), sgid_index=s.gid_index,
                     hop_limit=64)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=s.port)
    qp.to_rtr(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.sq_psn = need(req, "sq_psn")
    attr.timeout = int(req.get("timeout", 14))
    attr.retry_cnt = int(req.get("retry_cnt", 7))
    attr.rnr_retry = int(req.get("rnr_retry", 7))
    attr.max_rd_atomic = int(req.get("max_rd_atomic", 16))
    qp.to_rts(attr)
    return {}


def cmd_ud_ready(s, req):
    qp, _ = s.qp(req)
    attr = QPAttr(qp_state=e.IBV_QPS_INIT)
    attr.pkey_index = 0
    attr.port_num = s.port
    attr.qkey = need(req, "qkey")
    qp.to_init(attr)
    qp.to_rtr(QPAttr(qp_state=e.IBV_QPS_RTR))
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.sq_psn = int(req.get("sq_psn", 0))
    qp.to_rts(attr)
    return {}


def cmd_modify(s, req):
    qp, _ = s.qp(req)
    state = {"err": e.IBV_QPS_ERR, "reset": e.IBV_QPS_RESET}.get(req.get("state"))
    if state is None:
        raise Failed(f"modify: state {req.get('state')!r} (err or reset)")
    qp.modify(QPAttr(qp_state=state), e.IBV_QP_STATE)
    return {}


def cmd_query_qp(s, req):
    qp, _ = s.qp(req)
    attr, _ = qp.query(e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_RQ_PSN)
    return {"state": STATES.get(attr.qp_state, str(attr.qp_state)), "sq_psn": attr.sq_psn,
            "rq_psn": attr.rq_psn}


def sge(s, req):
    mr = s.mr(req)
    offset, length = need(req, "offset"), need(req, "len")
    return SGE(mr.buf + offset, length, mr.lkey)


def cmd_post_recv(s, req):
    qp, _ = s.qp(req)
    qp.post_recv(RecvWR(wr_id=need(req, "wr_id"), num_sge=1, sg=[sge(s, req)]))
    return {}


def cmd_post_send(s, req):
    qp, _ = s.qp(req)
    op = req.get("op")
    if op not in SEND_OPS:
        raise Failed(f"post_send: op {op!r} ({', '.join(SEND_OPS)})")
    flags = e.IBV_SEND_SIGNALED if req.get("signaled", True) else 0
    wr = SendWR(wr_id=need(req, "wr_id"), opcode=SEND_OPS[op], num_sge=1, sg=[sge(s, req)],
                send_flags=flags, imm_data=int(req.get("imm", 0)))
    if op in ("write", "write_imm", "read"):
        wr.set_wr_rdma(need(req, "rkey"), need(req, "remote_addr"))
    elif op == "cmp_swap":
        wr.set_wr_atomic(need(req, "rkey"), need(req, "remote_addr"), need(req, "compare"),
                         need(req, "swap"))
    elif op == "fetch_add":
        wr.set_wr_atomic(need(req, "rkey"), need(req, "remote_addr"), need(req, "add"), 0)
    qp.post_send(wr)
    return {}


def cmd_poll(s, req):
    _, cq = s.qp(req)
    most = int(req.get("max", 16))
    deadline = time.monotonic() + int(req.get("timeout_ms", 0)) / 1000
    wcs = []
    while True:
        n, got = cq.poll(most - len(wcs))
        for wc in got[:n]:
            wcs.append({"wr_id": wc.wr_id, "status": wc.status,
                        "status_name": WC_STATUS.get(wc.status, str(wc.status)),
                        "opcode": WC_OPCODE.get(wc.opcode, str(wc.opcode)),
                        "byte_len": wc.byte_len, "imm": wc.imm_data})
        if len(wcs) >= most or time.monotonic() >= deadline:
            return {"wcs": wcs}
        time.sleep(0.0005)


def sysfs_counters(device, port):
    """A kernel device's hw_counters (rxe, NICs), or None where it has none."""
    where = f"/sys/class/infiniband/{device}/ports/{port}/hw_counters"
    if not os.path.isdir(where):
        return None
    counters = {}
    for name in sorted(os.listdir(where)):
        try:
            with open(os.path.join(where, name)) as f:
                counters[name] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a counter the driver cannot read now: absent, not zero
    return counters


def xroce_counters(device):
    """xroce's counters through its libibverbs.so.1 (the library pyverbs runs on), or None."""
    try:
        lib = ctypes.CDLL("libibverbs.so.1")
        read = lib.xroce_read_counters
    except (OSError, AttributeError):
        return None  # rdma-core's libibverbs: no such call
    read.restype = ctypes.c_ssize_t
    read.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    need = read(device.encode(), None, 0)
    if need < 0:
        return None
    buf = ctypes.create_string_buffer(need + 1)
    read(device.encode(), buf, need + 1)
    counters = {}
    for line in buf.value.decode().splitlines():
        name, _, value = line.partition(" ")
        counters[name] = int(value)
    return counters


def cmd_counters(s, req):
    found = sysfs_counters(s.ctx.name, s.port)
    if found is not None:
        return {"source": "sysfs hw_counters", "counters": found}
    found = xroce_counters(s.ctx.name)
    if found is not None:
        return {"source": "xroce_read_counters", "counters": found}
    return {"source": None, "counters": {}}


COMMANDS = {name[4:]: f for name, f in globals().items() if name.startswith("cmd_")}


def serve(conn, ctx, args):
    session = Session(ctx, args.port, args.gid_index)
    reader = conn.makefile("r", encoding="utf-8")
    try:
        for line in reader:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                rid = req.get("id")
            except (ValueError, AttributeError):
                req, rid = {}, None
            cmd = req.get("cmd")
            if cmd == "bye":
                conn.sendall(json.dumps({"id": rid, "ok": True}).encode() + b"\n")
                return
            try:
                if cmd not in COMMANDS:
                    raise Failed(f"unknown command {cmd!r} ({', '.join(sorted(COMMANDS))})")
                answer = {"id": rid, "ok": True, **COMMANDS[cmd](session, req)}
            except Failed as err:
                answer = {"id": rid, "ok": False, "error": str(err)}
            except Exception as err:  # pyverbs' errors: the target refused the call
                answer = {"id": rid, "ok": False, "error": f"{type(err).__name__}: {err}"}
            conn.sendall(json.dumps(answer).encode() + b"\n")
    finally:
        session.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", required=True)
    p.add_argument("--gid-index", type=int, default=1)
    p.add_argument("--port", type=int, default=1)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", help="HOST:PORT")
    where.add_argument("--unix", help="a Unix socket path")
    p.add_argument("--once", action="store_true", help="exit after one client")
    args = p.parse_args()
    ctx = Context(name=args.device)
    if args.unix:
        if os.path.exists(args.unix):
            os.unlink(args.unix)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(args.unix)
    else:
        host, _, port = args.listen.rpartition(":")
        srv = socket.create_server((host, int(port)), reuse_port=False)
    srv.listen(1)
    print(f"agent: {args.device} ready on {args.unix or args.listen}", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            try:
                serve(conn, ctx, args)
            except (OSError, ValueError):
                traceback.print_exc()
        if args.once:
            return


if __name__ == "__main__":
    sys.exit(main())
