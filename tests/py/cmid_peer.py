#!/usr/bin/python3
"""One end of a pyverbs CMID exchange (python3-pyverbs: rdma-core's Python binding of
librdmacm), for tools/tests/rdmacm_netns.rs: run unmodified pyverbs on xroce's librdmacm.so.1.

    cmid_peer.py server|client MODE ADDRESS

MODE:
  sync    synchronous ids (CMID from an AddrInfo: rdma_create_ep, rdma_get_request, calls
          that wait for their own event); the server sends the addresses and rkeys of two
          buffers, the client RDMA WRITEs one and READs the other, then SENDs "done".
  async   an event channel: ADDR_RESOLVED, ROUTE_RESOLVED, CONNECT_REQUEST, ESTABLISHED
          each checked, a SEND each way, the client disconnects, both see DISCONNECTED.
  ud      the same over RDMA_PS_UDP (SIDR): the client's AH from ESTABLISHED's UD
          parameters, the server answers through an AH made from the work completion.
  reject  the server rejects with private data (a REJ "consumer defined", IBTA 12.6.7.2);
          the client sees REJECTED carrying that private data.

Prints "cmid_peer: <role> <mode> ok" at the end; any failure raises (exit status 1).
"""
import struct
import sys

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.addr import AH
from pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam, UDParam
from pyverbs.qp import QPCap, QPInitAttr

PORT = "7471"
SIZE = 4096  # four packets at a 1024-byte path MTU
UD_SIZE = 512  # a UD message is one packet, so at most the path MTU
GRH = 40  # a UD receive starts with the sender's GRH (IBTA 11.4.1.1)
REJECT_DATA = b"xroce-cmid-reject"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def init_attr(qp_type=e.IBV_QPT_RC):
    cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
    return QPInitAttr(qp_type=qp_type, cap=cap, sq_sig_all=1)


def expect(channel, want):
    event = CMEvent(channel)
    got = event.event_type
    if got != want:
        raise AssertionError(f"cm event {event.event_str()}, want {want}")
    return event


def sync_server(addr):
    ai = AddrInfo(src=addr, src_service=PORT, port_space=ce.RDMA_PS_TCP, flags=ce.RAI_PASSIVE)
    listener = CMID(creator=ai, qp_init_attr=init_attr())
    listener.listen()
    conn = listener.get_request()
    inbox = conn.reg_msgs(SIZE)
    conn.post_recv(inbox, SIZE)
    conn.accept()
    readable = conn.reg_read(SIZE)
    readable.write(b"R" * SIZE, SIZE)
    writable = conn.reg_write(SIZE)
    keys = conn.reg_msgs(64)
    keys.write(struct.pack("!QIQI", readable.buf, readable.rkey, writable.buf, writable.rkey), 24)
    conn.post_send(keys, e.IBV_SEND_SIGNALED, 24)
    conn.get_send_comp()
    conn.get_recv_comp()
    check(inbox.read(4, 0) == b"done", f"the client's message is {inbox.read(4, 0)!r}")
    check(writable.read(SIZE, 0) == b"W" * SIZE, "the client's RDMA WRITE did not land")
    conn.disconnect()


def sync_client(addr):
    ai = AddrInfo(dst=addr, dst_service=PORT, port_space=ce.RDMA_PS_TCP)
    cmid = CMID(creator=ai, qp_init_attr=init_attr())
    keys = cmid.reg_msgs(64)
    cmid.post_recv(keys, 64)
    cmid.connect()
    cmid.get_recv_comp()
    read_addr, read_rkey, write_addr, write_rkey = struct.unpack("!QIQI", keys.read(24, 0))
    local = cmid.reg_msgs(SIZE)
    local.write(b"W" * SIZE, SIZE)
    cmid.post_write(local, SIZE, write_addr, write_rkey, e.IBV_SEND_SIGNALED)
    cmid.get_send_comp()
    local.write(b"x" * SIZE, SIZE)
    cmid.post_read(local, SIZE, read_addr, read_rkey, e.IBV_SEND_SIGNALED)
    cmid.get_send_comp()
    check(local.read(SIZE, 0) == b"R" * SIZE, "the RDMA READ brought other bytes")
    local.write(b"done", 4)
    cmid.post_send(local, e.IBV_SEND_SIGNALED, 4)
    cmid.get_send_comp()
    cmid.disconnect()


def qp_with_inbox(cmid, port_space):
    """The id's QP (UD for RDMA_PS_UDP, else RC) with one receive posted: (ud, message
    size, the receive buffer)."""
    ud = port_space == ce.RDMA_PS_UDP
    size = UD_SIZE if ud else SIZE
    cmid.create_qp(init_attr(e.IBV_QPT_UD if ud else e.IBV_QPT_RC))
    inbox = cmid.reg_msgs(size + GRH)
    cmid.post_recv(inbox, size + GRH)
    return ud, size, inbox


def async_server(addr, port_space, reject):
    channel = CMEventChannel()
    listener = CMID(creator=channel, port_space=port_space)
    listener.bind_addr(
        AddrInfo(src=addr, src_service=PORT, port_space=port_space, flags=ce.RAI_PASSIVE)
    )
    listener.listen()
    request = expect(channel, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=request, listen_id=listener)
    request.ack_cm_event()
    if reject:
        child.reject(REJECT_DATA)
        return
    ud, size, inbox = qp_with_inbox(child, port_space)
    child.accept(ConnParam(qp_num=child.qpn) if ud else ConnParam())
    if not ud:
        expect(channel, ce.RDMA_CM_EVENT_ESTABLISHED).ack_cm_event()
    wc = child.get_recv_comp()
    offset = GRH if ud else 0
    check(inbox.read(size, offset) == b"c" * size, "the client's SEND brought other bytes")
    reply = child.reg_msgs(size)
    reply.write(b"s" * size, size)
    if ud:
        ah = AH(child.pd, wc=wc, port_num=1, grh=inbox.buf)
        child.post_ud_send(reply, ah, rqpn=wc.src_qp, length=size)
    else:
        child.post_send(reply, e.IBV_SEND_SIGNALED, size)
    child.get_send_comp()
    if not ud:
        expect(channel, ce.RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()


def async_client(addr, port_space, reject):
    channel = CMEventChannel()
    cmid = CMID(creator=channel, port_space=port_space)
    cmid.resolve_addr(AddrInfo(dst=addr, dst_service=PORT, port_space=port_space), 2000)
    expect(channel, ce.RDMA_CM_EVENT_ADDR_RESOLVED).ack_cm_event()
    cmid.resolve_route(2000)
    expect(channel, ce.RDMA_CM_EVENT_ROUTE_RESOLVED).ack_cm_event()
    ud, size, inbox = qp_with_inbox(cmid, port_space)
    cmid.connect(ConnParam(qp_num=cmid.qpn) if ud else ConnParam())
    if reject:
        event = expect(channel, ce.RDMA_CM_EVENT_REJECTED)
        data = event.private_data
        check(data is not None and bytes(data[: len(REJECT_DATA)]) == REJECT_DATA,
              f"REJECTED carries {data!r}, want it to start with {REJECT_DATA!r}")
        event.ack_cm_event()
        return
    established = expect(channel, ce.RDMA_CM_EVENT_ESTABLISHED)
    out = cmid.reg_msgs(size)
    out.write(b"c" * size, size)
    if ud:
        peer = UDParam(established)
        ah = AH(cmid.pd, attr=peer.ah_attr)
        cmid.post_ud_send(out, ah, rqpn=peer.qp_num, length=size)
    else:
        cmid.post_send(out, e.IBV_SEND_SIGNALED, size)
    established.ack_cm_event()
    cmid.get_send_comp()
    cmid.get_recv_comp()
    offset = GRH if ud else 0
    check(inbox.read(size, offset) == b"s" * size, "the server's answer brought other bytes")
    if not ud:
        cmid.disconnect()
        expect(channel, ce.RDMA_CM_EVENT_DISCONNECTED).ack_cm_event()


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("server", "client"):
        sys.exit(__doc__)
    role, mode, addr = sys.argv[1:]
    server = role == "server"
    if mode == "sync":
        (sync_server if server else sync_client)(addr)
    elif mode in ("async", "ud", "reject"):
        space = ce.RDMA_PS_UDP if mode == "ud" else ce.RDMA_PS_TCP
        (async_server if server else async_client)(addr, space, mode == "reject")
    else:
        sys.exit(f"unknown mode {mode!r}\n{__doc__}")
    print(f"cmid_peer: {role} {mode} ok", flush=True)


if __name__ == "__main__":
    main()
