//! The calls that make and move a connection: its QP (and the CQs librdmacm makes for it),
//! connect, accept, reject, disconnect, establish, the QP attributes and options, and
//! moving an id to another channel.
#![allow(clippy::missing_safety_doc)]
use super::*;

rdmacm_export! {
    /// `rdma_create_qp`: a QP on the id (of the id's PD when `pd` is NULL, with CQs of the
    /// library's when the attributes name none), in INIT (UD: RTS); the CM moves it on.
    pub unsafe extern "C" fn rdma_create_qp(
        id: *mut rdma_cm_id,
        pd: *mut ibv_pd,
        qp_init_attr: *mut ibv_qp_init_attr,
    ) -> c_int {
        const CALL: &str = "rdma_create_qp";
        if id.is_null() || qp_init_attr.is_null() {
            return fail_with(CALL, libc::EINVAL, "no id or no attributes");
        }
        // Safety: valid (contract).
        let i = unsafe { &mut *qp_init_attr };
        let args = resources::CreateQp::from_init(pd, i);
        // Safety: per the contract.
        let rc = unsafe { create_qp(CALL, id, args) };
        if rc == 0 {
            // rdma-core writes back the CQs it made.
            // Safety: an id of ours.
            let c = unsafe { &(*id) };
            i.send_cq = c.send_cq;
            i.recv_cq = c.recv_cq;
        }
        rc
    }

    /// `rdma_create_qp_ex`.
    pub unsafe extern "C" fn rdma_create_qp_ex(id: *mut rdma_cm_id, attr: *mut ibv_qp_init_attr_ex) -> c_int {
        const CALL: &str = "rdma_create_qp_ex";
        if id.is_null() || attr.is_null() {
            return fail_with(CALL, libc::EINVAL, "no id or no attributes");
        }
        // Safety: valid (contract).
        let args = match unsafe { resources::create_qp_ex_args(attr) } {
            Ok(a) => a,
            Err(errno) => return fail_with(CALL, errno, "attributes xroce's QPs do not take"),
        };
        // Safety: per the contract.
        unsafe { create_qp(CALL, id, args) }
    }

    /// `rdma_destroy_qp`: the QP, and the CQs the library made for it.
    pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
        // Safety: the program's id, not destroyed meanwhile (contract).
        let Ok(obj) = (unsafe { IdObj::checked("rdma_destroy_qp", id) }) else {
            return;
        };
        obj.id.detach_qp();
        if !obj.c.qp.is_null() {
            // Safety: the id's QP (contract: not destroyed by the program).
            unsafe { crate::capi::resources::ibv_destroy_qp(obj.c.qp) };
            obj.c.qp = std::ptr::null_mut();
        }
        if obj.own_cqs {
            // Safety: the library's own CQs and channels, now without a QP.
            unsafe { destroy_own_cqs(obj) };
        }
    }

    /// `rdma_connect`: REQ (UD: SIDR_REQ); ESTABLISHED follows (CONNECT_RESPONSE when the
    /// id has no QP), or REJECTED / UNREACHABLE / CONNECT_ERROR.
    pub unsafe extern "C" fn rdma_connect(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_connect", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // Safety: per the contract.
        let param = unsafe { conn_param_checked(conn_param, obj) };
        match obj.id.connect(&param) {
            Ok(()) => obj.complete("rdma_connect", false),
            Err(e) => fail("rdma_connect", &e),
        }
    }

    /// `rdma_accept`: REP (UD: SIDR_REP); the QP goes to RTR and RTS.
    pub unsafe extern "C" fn rdma_accept(id: *mut rdma_cm_id, conn_param: *mut rdma_conn_param) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_accept", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        // Safety: per the contract.
        let param = unsafe { conn_param_checked(conn_param, obj) };
        let rc = match obj.id.accept(&param) {
            Ok(()) => 0,
            Err(e) => fail("rdma_accept", &e),
        };
        obj.sync();
        if rc != 0 {
            return rc;
        }
        // A UD accept (SIDR_REP) has no event to wait for.
        if obj.id.port_space() == PortSpace::Udp {
            obj.ack_held_event();
            return 0;
        }
        let rc = obj.complete("rdma_accept", false);
        obj.sync();
        rc
    }

    /// `rdma_reject`: REJ "consumer defined" (IBTA 12.6.7) with the private data.
    pub unsafe extern "C" fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, len: u8) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_reject", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let data = if private_data.is_null() || len == 0 {
            &[][..]
        } else {
            // Safety: valid for len bytes (contract).
            unsafe { std::slice::from_raw_parts(private_data as *const u8, len as usize) }
        };
        match obj.id.reject(data) {
            Ok(()) => 0,
            Err(e) => fail("rdma_reject", &e),
        }
    }

    /// `rdma_disconnect`: the QP to ERR, then DREQ (or DREP after the peer's DREQ).
    pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_disconnect", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let was_over = matches!(obj.id.state(), IdState::Closed | IdState::Idle);
        let rc = match obj.id.disconnect() {
            Ok(()) => 0,
            Err(e) => fail("rdma_disconnect", &e),
        };
        obj.sync();
        if rc != 0 || obj.id.port_space() == PortSpace::Udp {
            return rc;
        }
        // DISCONNECTED follows the DREP (or came with the peer's DREQ).
        obj.complete("rdma_disconnect", was_over)
    }

    /// `rdma_establish` (RDMACM_1.2): the RTU after CONNECT_RESPONSE, for an id without QP.
    pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {

        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked("rdma_establish", id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        match obj.id.establish() {
            Ok(()) => 0,
            Err(e) => fail("rdma_establish", &e),
        }
    }

    /// `rdma_init_qp_attr` (RDMACM_1.2): the attributes that move the program's own QP to
    /// `qp_attr->qp_state` (INIT, RTR or RTS) for this connection.
    pub unsafe extern "C" fn rdma_init_qp_attr(
        id: *mut rdma_cm_id,
        qp_attr: *mut ibv_qp_attr,
        qp_attr_mask: *mut c_int,
    ) -> c_int {
        const CALL: &str = "rdma_init_qp_attr";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return fail_with(CALL, libc::EINVAL, "no attributes or mask");
        }
        // Safety: valid (contract).
        let a = unsafe { &mut *qp_attr };
        let Ok(state) = xroce::verbs::QpState::try_from(a.qp_state) else {
            return fail_with(CALL, libc::EINVAL, &format!("qp_state {}", a.qp_state.0));
        };
        match obj.id.init_qp_attr(state) {
            Ok((attr, mask)) => {
                *a = crate::capi::resources::qp_attr_to_c(
                    &attr,
                    &xroce::verbs::QpCaps {
                        max_send_wr: 0,
                        max_recv_wr: 0,
                        max_send_sge: 0,
                        max_recv_sge: 0,
                        max_inline_data: 0,
                    },
                );
                // Safety: a valid out-pointer.
                unsafe { *qp_attr_mask = mask.bits() as c_int };
                0
            }
            Err(e) => fail(CALL, &e),
        }
    }

    /// `rdma_set_option`: TOS, ACK timeout, REUSEADDR, AFONLY; IB paths are refused.
    pub unsafe extern "C" fn rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        optname: c_int,
        optval: *mut c_void,
        optlen: usize,
    ) -> c_int {
        const CALL: &str = "rdma_set_option";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        if optval.is_null() {
            return fail_with(CALL, libc::EINVAL, "no value");
        }
        let int_opt = || {
            (optlen == std::mem::size_of::<c_int>())
                // Safety: optval holds an int (length checked).
                .then(|| unsafe { *(optval as *const c_int) })
        };
        let u8_opt = || {
            (optlen == 1)
                // Safety: optval holds a byte.
                .then(|| unsafe { *(optval as *const u8) })
        };
        match (level, optname) {
            (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) => match u8_opt() {
                Some(tos) => {
                    obj.id.set_tos(tos);
                    0
                }
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_TOS takes a uint8_t"),
            },
            (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) => match u8_opt() {
                Some(t) => match obj.id.set_ack_timeout(t) {
                    Ok(()) => 0,
                    Err(e) => fail(CALL, &e),
                },
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_ACK_TIMEOUT takes a uint8_t"),
            },
            (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) => match int_opt() {
                Some(v) => {
                    obj.id.set_reuse_addr(v != 0);
                    0
                }
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_REUSEADDR takes an int"),
            },
            // IPv6 ids bound to the unspecified address: xroce binds each family by itself
            // already, so AFONLY changes nothing.
            (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) => match int_opt() {
                Some(_) => 0,
                None => fail_with(CALL, libc::EINVAL, "RDMA_OPTION_ID_AFONLY takes an int"),
            },
            (RDMA_OPTION_IB, RDMA_OPTION_IB_PATH) => {
                refuse(CALL, "RDMA_OPTION_IB_PATH (IB SA path records have no meaning on RoCE)")
            }
            _ => fail_with(CALL, libc::ENOSYS, &format!("level {level} option {optname}")),
        }
    }

    /// `rdma_migrate_id`: the id and its queued events to another channel, once the events
    /// it handed out are acked. As rdma-core's cma.c: a synchronous id's held event is acked
    /// here (only the library can) and its own channel freed, so it becomes asynchronous;
    /// a NULL channel makes the id synchronous on a new channel of its own (EINVAL for an id
    /// that is synchronous already).
    pub unsafe extern "C" fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int {
        const CALL: &str = "rdma_migrate_id";
        // Safety: the program's id, not destroyed meanwhile (contract).
        let obj = match unsafe { IdObj::checked(CALL, id) } {
            Ok(obj) => obj,
            Err(rc) => return rc,
        };
        let to_synchronous = channel.is_null();
        if to_synchronous && obj.synchronous {
            return fail_with(CALL, libc::EINVAL, "the id is synchronous already (NULL channel)");
        }
        let target = if to_synchronous {
            match new_channel(CALL) {
                Ok(own) => own,
                Err(rc) => return rc,
            }
        } else {
            channel
        };
        // Safety: the program's channel (or the new one), not destroyed meanwhile.
        let ch = match unsafe { channel_of(CALL, target) } {
            Ok(ch) => ch,
            Err(rc) => return rc,
        };
        let (old_channel, was_synchronous) = (obj.c.channel, obj.synchronous);
        if was_synchronous {
            obj.ack_held_event();
        }
        obj.id.migrate(&ch.ch);
        obj.c.channel = target;
        obj.synchronous = to_synchronous;
        if was_synchronous && old_channel != target {
            destroy_channel(CALL, old_channel);
        }
        obj.wait_acks();
        0
    }
}

/// A `conn_param` for connect/accept.
///
/// # Safety
/// As [`conn_param`].
pub(super) unsafe fn conn_param_checked(p: *const rdma_conn_param, obj: &IdObj) -> ConnParam {
    // Safety: forwarded.
    unsafe { conn_param(p, obj) }
}

/// The QP of `rdma_create_qp(_ex)`.
///
/// # Safety
/// `id` is ours; the pointers in `args` are null or objects of this library.
pub(super) unsafe fn create_qp(
    call: &str,
    id: *mut rdma_cm_id,
    mut args: resources::CreateQp,
) -> c_int {
    // Safety: the program's id, not destroyed meanwhile (contract).
    let obj = match unsafe { IdObj::checked(call, id) } {
        Ok(obj) => obj,
        Err(rc) => return rc,
    };
    if !obj.c.qp.is_null() {
        return fail(call, &RdmaCmError::QpExists);
    }
    if obj.c.verbs.is_null() {
        return fail_with(
            call,
            libc::EINVAL,
            "the id has no device yet (resolve its address or take it from a connect request)",
        );
    }
    if args.pd.is_null() {
        args.pd = obj.c.pd;
    }
    // Safety: a PD of ours.
    if unsafe { (*args.pd).context } != obj.c.verbs {
        return fail_with(
            call,
            libc::EINVAL,
            "the PD is not on the id's device (id->verbs)",
        );
    }
    if args.send_cq.is_null() || args.recv_cq.is_null() {
        // Safety: args.cap is valid (contract).
        let cap = unsafe { &*args.cap };
        // Safety: the id's context is open.
        if let Err(rc) = unsafe { make_own_cqs(call, obj, cap.max_send_wr, cap.max_recv_wr) } {
            return rc;
        }
        if args.send_cq.is_null() {
            args.send_cq = obj.c.send_cq;
        }
        if args.recv_cq.is_null() {
            args.recv_cq = obj.c.recv_cq;
        }
    } else {
        obj.c.send_cq = args.send_cq;
        obj.c.recv_cq = args.recv_cq;
    }
    if args.qp_context.is_null() {
        args.qp_context = id as *mut c_void;
    }
    let srq: *mut ibv_srq = args.srq;
    // Safety: per the contract.
    let qp = unsafe { resources::create_qp_obj(args, call) };
    if qp.is_null() {
        return -1;
    }
    let qp_obj = qp as *mut QpObj;
    // Safety: just made.
    let handle = unsafe { (*qp_obj).qp.clone() };
    if let Err(e) = obj.id.attach_qp(handle) {
        // Safety: ours, unused.
        unsafe { resources::ibv_destroy_qp(qp) };
        return fail(call, &e);
    }
    obj.c.qp = qp;
    obj.c.srq = srq;
    obj.sync();
    0
}

/// CQs (each with its completion channel, `cq_context` the id) for a QP whose attributes
/// name none, as librdmacm makes them (rdma_server/rdma_client rely on them).
///
/// # Safety
/// The id's context is open.
pub(super) unsafe fn make_own_cqs(
    call: &str,
    obj: &mut IdObj,
    send: u32,
    recv: u32,
) -> Result<(), c_int> {
    let ctx = obj.c.verbs;
    let id_ptr = obj as *mut IdObj as *mut c_void;
    let make = |depth: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        // Safety: an open context.
        let ch = unsafe { resources::ibv_create_comp_channel(ctx) };
        if ch.is_null() {
            return Err(fail_with(call, libc::ENOMEM, "a completion channel"));
        }
        // Safety: as above.
        let cq =
            unsafe { resources::create_cq_obj(ctx, depth.max(1) as c_int, id_ptr, ch, 0, call) };
        if cq.is_null() {
            // Safety: ours, unused.
            unsafe { resources::ibv_destroy_comp_channel(ch) };
            return Err(-1);
        }
        Ok((ch, cq as *mut ibv_cq))
    };
    let (sch, scq) = make(send)?;
    let (rch, rcq) = match make(recv) {
        Ok(x) => x,
        Err(rc) => {
            // Safety: ours, unused.
            unsafe {
                resources::ibv_destroy_cq(scq);
                resources::ibv_destroy_comp_channel(sch);
            }
            return Err(rc);
        }
    };
    obj.c.send_cq_channel = sch;
    obj.c.send_cq = scq;
    obj.c.recv_cq_channel = rch;
    obj.c.recv_cq = rcq;
    obj.own_cqs = true;
    Ok(())
}

/// # Safety
/// The id's own CQs and channels exist and no QP uses them.
pub(super) unsafe fn destroy_own_cqs(obj: &mut IdObj) {
    // Safety: per the contract.
    unsafe {
        resources::ibv_destroy_cq(obj.c.send_cq);
        resources::ibv_destroy_cq(obj.c.recv_cq);
        resources::ibv_destroy_comp_channel(obj.c.send_cq_channel);
        resources::ibv_destroy_comp_channel(obj.c.recv_cq_channel);
    }
    obj.c.send_cq = std::ptr::null_mut();
    obj.c.recv_cq = std::ptr::null_mut();
    obj.c.send_cq_channel = std::ptr::null_mut();
    obj.c.recv_cq_channel = std::ptr::null_mut();
    obj.own_cqs = false;
}
