//! Stand-in `libefa.so.1`: the Amazon EFA direct-verbs library, as far as a program needs it
//! to start.
//!
//! perftest links libefa and binds `efadv_*` at load time (BIND_NOW), so does pyverbs'
//! `providers.efa` module; rdma-core's real libefa in turn needs libibverbs' private
//! provider symbols. xroce's devices are not EFA devices and say so (no vendor id, not the
//! efa driver), so a well-behaved program never calls these; one that does gets
//! `EOPNOTSUPP` and one line on stderr per function.
//!
//! The table lists every function rdma-core 44's libefa exports, under its version node;
//! return kinds follow `<infiniband/efadv.h>` and the man pages (abi/export's `c_stubs!`).

xroce_abi_export::c_stubs! { why: "xroce's devices are not EFA devices";
    "EFA_1.0" {
        efadv_create_driver_qp: Null,
    }
    "EFA_1.1" {
        efadv_create_qp_ex: Null,
        efadv_query_ah: Errno,
        efadv_query_device: NotThisVendorErrno,
    }
    "EFA_1.2" {
        efadv_cq_from_ibv_cq_ex: Null,
        efadv_create_cq: Null,
    }
}
