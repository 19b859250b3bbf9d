//! Memory windows (IBTA 10.6.7): allocate, bind, deallocate, and the send queue's local
//! operations, BIND_MW and LOCAL_INV.
//!
//! A window is a slot of the device's key table ([`super::mr::MrTable`]), so every shard
//! resolves its R_Key. Both local operations run in send queue order when the requester
//! reaches them (after the WQEs before them were transmitted, not necessarily acknowledged;
//! `SendFlags::FENCE` waits for earlier READs and atomics, IBTA 10.8.3). They send no packet
//! and complete in order with the WQEs around them; a refused one completes in error
//! (`MW_BIND_ERR` for a bind, `LOC_QP_OP_ERR` for an invalidation, as rxe reports them) and
//! the QP enters ERR.
use super::mr::BindFault;
use super::qp::Qp;
use super::types::{
    inc_rkey, Access, EngineError, MwBindInfo, MwId, MwType, PdId, QpType, SendFlags, SendWrRef,
    WcStatus, WrOp,
};
use super::{DeviceState, Engine};

/// A memory window as the caller sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MwInfo {
    /// The handle (the index part of its R_Keys).
    pub id: MwId,
    /// The R_Key in force (a bind posted but not executed yet has not changed it).
    pub rkey: u32,
    /// Type 1 or 2.
    pub mw_type: MwType,
    /// Its PD.
    pub pd: PdId,
    /// What it covers now, if bound.
    pub bound: Option<MwBindInfo>,
    /// Type 2: the QP it is bound to (the only one it serves).
    pub bound_qp: Option<u32>,
}

impl Engine {
    /// Allocate a memory window of PD `pd` (`ibv_alloc_mw`). A type 2 window starts free
    /// (unbound); a type 1 window starts valid, covering nothing.
    pub fn alloc_mw(&mut self, pd: PdId, mw_type: MwType) -> Result<MwInfo, EngineError> {
        self.check_pd(pd)?;
        let (id, _) = self.sh.mrs.alloc_window(pd, mw_type).ok_or_else(|| {
            EngineError::InvalidArgument("no more memory windows: the key space is used up".into())
        })?;
        self.query_mw(id)
    }

    /// Deallocate a window (`ibv_dealloc_mw`); a bound one stops serving at once.
    pub fn dealloc_mw(&mut self, mw: MwId) -> Result<(), EngineError> {
        if self.sh.mrs.dealloc_window(mw) {
            Ok(())
        } else {
            Err(EngineError::UnknownMw(mw))
        }
    }

    /// The window's R_Key, type and binding.
    pub fn query_mw(&self, mw: MwId) -> Result<MwInfo, EngineError> {
        let f = self
            .sh
            .mrs
            .window_facts(mw)
            .ok_or(EngineError::UnknownMw(mw))?;
        Ok(MwInfo {
            id: mw,
            rkey: f.rkey,
            mw_type: f.mw_type,
            pd: f.pd,
            bound: f
                .bound
                .map(|(mr_lkey, addr, length, access, _)| MwBindInfo {
                    mr_lkey,
                    addr,
                    length,
                    access,
                }),
            bound_qp: f.bound.and_then(|b| b.4),
        })
    }

    /// Bind a type 1 window through the QP `qpn` (`ibv_bind_mw`, IBTA 10.6.7.2.1): posted on
    /// its send queue as a bind WR with the window's next R_Key, which is returned now and
    /// is in force once the bind executes (its completion, opcode `BindMw`, comes if
    /// `flags` has SIGNALED or the QP signals all). Length 0 unbinds.
    pub fn bind_mw(
        &mut self,
        qpn: u32,
        wr_id: u64,
        flags: SendFlags,
        mw: MwId,
        bind: MwBindInfo,
    ) -> Result<u32, EngineError> {
        let f = self
            .sh
            .mrs
            .window_facts(mw)
            .ok_or(EngineError::UnknownMw(mw))?;
        if f.mw_type != MwType::Type1 {
            return Err(EngineError::InvalidWr(
                "bind_mw binds type 1 windows; a type 2 window is bound by a BindMw WR".into(),
            ));
        }
        let rkey = inc_rkey(f.posted_rkey);
        let wr = SendWrRef {
            wr_id,
            op: WrOp::BindMw { mw, rkey, bind },
            sg_list: &[],
            flags,
            ud: None,
        };
        self.post_send_checked(qpn, &wr, None, true)?;
        self.sh.mrs.set_posted_rkey(mw, rkey);
        Ok(rkey)
    }
}

/// Post-time checks of a local operation: the QP type, no SGEs or inline data, and for a
/// bind the window, its type (`via_verb`: type 1 through [`Engine::bind_mw`], type 2 by WR),
/// the R_Key's index part and the rights asked for. What can change before the bind executes
/// (the window's state, the region) is checked when it does.
pub(crate) fn check_local_wr(
    qp: &Qp,
    sh: &DeviceState,
    wr: &SendWrRef<'_>,
    data: Option<&[u8]>,
    via_verb: bool,
) -> Result<(), EngineError> {
    if qp.qp_type == QpType::Ud {
        return Err(EngineError::UnsupportedOperation {
            op: wr.op.name(),
            qp_type: qp.qp_type,
        });
    }
    if !wr.sg_list.is_empty() || data.is_some() || wr.flags.contains(SendFlags::INLINE) {
        return Err(EngineError::InvalidWr(format!(
            "{} takes no SGEs and no inline data",
            wr.op.name()
        )));
    }
    let WrOp::BindMw { mw, rkey, bind } = wr.op else {
        return Ok(());
    };
    let f = sh.mrs.window_facts(mw).ok_or(EngineError::UnknownMw(mw))?;
    let wanted = if via_verb {
        MwType::Type1
    } else {
        MwType::Type2
    };
    if f.mw_type != wanted {
        return Err(EngineError::InvalidWr(
            "a type 1 window is bound by bind_mw, a type 2 window by a BindMw WR (IBTA 10.6.7.2)"
                .into(),
        ));
    }
    if rkey >> 8 != mw.0 {
        return Err(EngineError::InvalidWr(format!(
            "R_Key {rkey:#x} does not carry the window's index {:#x}",
            mw.0
        )));
    }
    if !Access::WINDOW_RIGHTS.contains(bind.access) {
        return Err(EngineError::InvalidWr(format!(
            "a window grants remote rights only, not {:?}",
            bind.access
        )));
    }
    Ok(())
}

/// Execute a local operation of `qp`'s send queue; the error is the WQE's completion status.
pub(crate) fn execute_local(qp: &Qp, sh: &DeviceState, op: &WrOp) -> Result<(), WcStatus> {
    match *op {
        WrOp::BindMw { mw, rkey, bind } => sh
            .mrs
            .bind_window(mw, rkey, &bind, qp.pd, qp.qpn)
            .map_err(|_: BindFault| WcStatus::MwBindErr),
        WrOp::LocalInv { rkey } => {
            if sh.mrs.invalidate(rkey, qp.pd, None) {
                Ok(())
            } else {
                Err(WcStatus::LocQpOpErr)
            }
        }
        _ => Ok(()),
    }
}
