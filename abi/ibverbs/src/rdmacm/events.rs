//! Events: an [`RdmaCmEvent`] as the `rdma_cm_event` the program reads, holding its
//! private data until `rdma_ack_cm_event`.
#![allow(clippy::missing_safety_doc)]
use super::*;

/// The C event for an xroce event; `None` if it is for an id the program destroyed.
pub(super) fn c_event(ev: RdmaCmEvent) -> Option<*mut rdma_cm_event> {
    let (id_obj, listen_obj, owner) = if ev.kind == EventKind::ConnectRequest {
        let listener = ev.listen_id.as_ref()?;
        let Some(l) = lock(ids()).get(&listener.key()).copied() else {
            // The listener is gone: refuse the request (IBTA 12.6.7, consumer reject).
            let _ = ev.id.reject(&[]);
            ev.id.destroy();
            return None;
        };
        let l: *mut IdObj = l.ptr();
        // Safety: a live id (in the registry).
        let (channel, context, synchronous) =
            unsafe { ((*l).c.channel, (*l).c.context, (*l).synchronous) };
        // A synchronous listener's connections are synchronous ids too, each on a channel
        // of its own (librdmacm migrates them so).
        let child = if synchronous {
            let Ok(own) = new_channel("rdma_get_request") else {
                let _ = ev.id.reject(&[]);
                ev.id.destroy();
                return None;
            };
            // Safety: just made and handed out.
            ev.id.migrate(unsafe { &(*(own as *const ChannelObj)).ch });
            let child = IdObj::new(ev.id.clone(), own, context);
            // Safety: just made.
            unsafe { (*child).synchronous = true };
            child
        } else {
            IdObj::new(ev.id.clone(), channel, context)
        };
        (child, l, l)
    } else {
        let obj: *mut IdObj = lock(ids()).get(&ev.id.key())?.ptr();
        (obj, std::ptr::null_mut(), obj)
    };
    // Safety: live ids.
    unsafe {
        (*id_obj).sync();
        *lock(&(*owner).unacked) += 1;
    }
    let mut data = Vec::new();
    // Safety: all-zero is a valid param (null pointers, zero numbers).
    let mut param: rdma_cm_event_param = unsafe { std::mem::zeroed() };
    match &ev.param {
        EventParam::None => {}
        EventParam::Conn(p) => {
            data = p.private_data.clone();
            param.conn = rdma_conn_param {
                private_data: std::ptr::null(),
                private_data_len: data.len().min(255) as u8,
                responder_resources: p.responder_resources,
                initiator_depth: p.initiator_depth,
                flow_control: p.flow_control as u8,
                retry_count: p.retry_count,
                rnr_retry_count: p.rnr_retry_count,
                srq: p.srq as u8,
                _pad: 0,
                qp_num: p.qp_num,
            };
        }
        EventParam::Ud(p) => {
            data = p.private_data.clone();
            let mut ah = ibv_ah_attr::from(p.ah_attr);
            ah.port_num = 1;
            param.ud = rdma_ud_param {
                private_data: std::ptr::null(),
                private_data_len: data.len().min(255) as u8,
                _pad: [0; 7],
                ah_attr: ah,
                qp_num: p.qp_num,
                qkey: p.qkey,
            };
        }
    }
    let mut obj = Box::new(EventObj {
        c: rdma_cm_event {
            id: id_obj as *mut rdma_cm_id,
            listen_id: listen_obj as *mut rdma_cm_id,
            event: ev.kind.code(),
            status: ev.status,
            param,
        },
        _data: data,
        owner,
    });
    if !obj._data.is_empty() {
        // Both union members start with private_data (the Vec's heap buffer does not move).
        obj.c.param.conn.private_data = obj._data.as_ptr() as *const c_void;
    }
    Some(hand_out(Handed::Event, Box::into_raw(obj)) as *mut rdma_cm_event)
}

pub(super) fn nonblocking(fd: c_int) -> bool {
    // Safety: F_GETFL on an fd has no memory arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}
