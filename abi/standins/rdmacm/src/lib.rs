//! Stand-in `librdmacm.so.1`, until xroce has RDMA CM (issue 15).
//!
//! perftest links librdmacm and binds its functions at load time (BIND_NOW), whether or not
//! `-R` (connect through RDMA CM) is asked for; pyverbs' `device` and `cmid` modules do the
//! same. rdma-core's real librdmacm needs the kernel's `/dev/infiniband/rdma_cm` and binds
//! to whichever libibverbs is loaded. Here every function reports itself unsupported (one
//! line on stderr per function), sets `errno` to `EOPNOTSUPP` and fails.
//!
//! The table lists every function rdma-core 44's librdmacm exports (the RDMA CM calls and
//! the rsocket calls), under its version node; return kinds follow `<rdma/rdma_cma.h>`,
//! `<rdma/rdma_verbs.h>` and `<rdma/rsocket.h>` (abi/export's `c_stubs!`): the RDMA CM
//! calls return -1 with errno set, like the sockets calls the rsocket ones mirror.

xroce_abi_export::c_stubs! { why: "RDMA CM is not implemented yet (issue 15)";
    "RDMACM_1.0" {
        rdma_create_event_channel: Null,
        rdma_destroy_event_channel: Void,
        rdma_create_id: MinusOne,
        rdma_create_ep: MinusOne,
        rdma_destroy_ep: Void,
        rdma_destroy_id: MinusOne,
        rdma_bind_addr: MinusOne,
        rdma_resolve_addr: MinusOne,
        rdma_resolve_route: MinusOne,
        rdma_create_qp: MinusOne,
        rdma_create_qp_ex: MinusOne,
        rdma_destroy_qp: Void,
        rdma_create_srq: MinusOne,
        rdma_create_srq_ex: MinusOne,
        rdma_destroy_srq: Void,
        rdma_connect: MinusOne,
        rdma_listen: MinusOne,
        rdma_get_request: MinusOne,
        rdma_accept: MinusOne,
        rdma_reject: MinusOne,
        rdma_notify: MinusOne,
        rdma_disconnect: MinusOne,
        rdma_join_multicast: MinusOne,
        rdma_leave_multicast: MinusOne,
        rdma_get_cm_event: MinusOne,
        rdma_ack_cm_event: MinusOne,
        // __be16 port numbers: 0, no port.
        rdma_get_src_port: Zero16,
        rdma_get_dst_port: Zero16,
        rdma_get_devices: Null,
        rdma_free_devices: Void,
        // A name, never NULL (callers print it): rdma-core's answer for an unknown event.
        rdma_event_str: Str("UNKNOWN EVENT"),
        rdma_set_option: MinusOne,
        rdma_migrate_id: MinusOne,
        rdma_getaddrinfo: MinusOne,
        rdma_freeaddrinfo: Void,
        // rsocket: the sockets API over RDMA, -1 and errno like the calls it mirrors.
        rsocket: MinusOne,
        rbind: MinusOne,
        rlisten: MinusOne,
        raccept: MinusOne,
        rconnect: MinusOne,
        rshutdown: MinusOne,
        rclose: MinusOne,
        rrecv: SsizeMinusOne,
        rrecvfrom: SsizeMinusOne,
        rrecvmsg: SsizeMinusOne,
        rsend: SsizeMinusOne,
        rsendto: SsizeMinusOne,
        rsendmsg: SsizeMinusOne,
        rread: SsizeMinusOne,
        rreadv: SsizeMinusOne,
        rwrite: SsizeMinusOne,
        rwritev: SsizeMinusOne,
        rpoll: MinusOne,
        rselect: MinusOne,
        rgetpeername: MinusOne,
        rgetsockname: MinusOne,
        rsetsockopt: MinusOne,
        rgetsockopt: MinusOne,
        rfcntl: MinusOne,
        // off_t: the mapped offset, or -1.
        riomap: SsizeMinusOne,
        riounmap: MinusOne,
        // size_t: the bytes written; rdma-core returns (size_t)-1 on an error.
        riowrite: SsizeMinusOne,
    }
    "RDMACM_1.1" {
        rdma_join_multicast_ex: MinusOne,
    }
    "RDMACM_1.2" {
        rdma_establish: MinusOne,
        rdma_init_qp_attr: MinusOne,
    }
    "RDMACM_1.3" {
        rdma_set_local_ece: MinusOne,
        rdma_get_remote_ece: MinusOne,
        rdma_reject_ece: MinusOne,
    }
}
