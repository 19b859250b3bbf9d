//! xroce's `librdmacm.so.1`: the RDMA CM calls, forwarded to xroce's `libibverbs.so.1`.
//!
//! An rdma_cm id hands out objects of libibverbs (`id->verbs`, `id->pd`, `id->qp`), and the
//! CM must drive the same xroce device and QP the program posts to; each shared object links
//! its own copy of the xroce crate, so the CM lives in libibverbs (abi/ibverbs/src/rdmacm)
//! and is exported there as `xroce_rdmacm_<name>@@XROCE_RDMACM_PRIVATE`. Each function here
//! looks its twin up once (`dlvsym` in the loaded `libibverbs.so.1`) and calls it. If the
//! loaded libibverbs is not xroce's, a call says so once on stderr and fails as a stub does.
//!
//! `rdma_event_str` needs nothing of the CM and is answered here. What xroce's CM does not
//! do stays a stub of the `c_stubs!` table below (one line on stderr, `errno` EOPNOTSUPP,
//! the failure value): SRQs through the CM, multicast, ECE, `rdma_notify` and the rsocket calls. Every function
//! rdma-core 44's librdmacm exports is exported, under its version node (programs are linked
//! BIND_NOW: docs/rdmacm-abi.md §1).

mod forward;

xroce_abi_export::c_stubs! { why: "xroce's RDMA CM does not implement it (docs/rdmacm.md)";
    "RDMACM_1.0" {
        rdma_create_srq: MinusOne,
        rdma_create_srq_ex: MinusOne,
        rdma_destroy_srq: Void,
        rdma_notify: MinusOne,
        rdma_join_multicast: MinusOne,
        rdma_leave_multicast: MinusOne,
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
    "RDMACM_1.3" {
        rdma_set_local_ece: MinusOne,
        rdma_get_remote_ece: MinusOne,
        rdma_reject_ece: MinusOne,
    }
}
