//! Queue pairs: create with capabilities, modify through the state machine, post work.
use std::sync::Arc;

use crate::engine::{
    Access, Mtu, MwBindInfo, QpAttr, QpAttrMask, QpCaps, QpInit, QpState, QpType, RecvWr,
    SendFlags, SendWr, SendWrRef, Sge,
};
use crate::wire::addr::Gid;

use super::attr::limits;
use super::cq::{Cq, CqInner};
use super::device::{Device, ObjectKind, ObjectSlot};
use super::error::{Result, VerbsError};
use super::pd::{AhAttr, Mw, Pd, PdInner};
use super::srq::{Srq, SrqInner};

/// Arguments of [`Pd::create_qp`] (`ibv_qp_init_attr`).
#[derive(Clone, Debug)]
pub struct QpInitAttr<'a> {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Where send completions go.
    pub send_cq: &'a Cq,
    /// Where receive completions go.
    pub recv_cq: &'a Cq,
    /// Queue sizes; checked against the device limits.
    pub cap: QpCaps,
    /// Every send WR completes (otherwise only those with `SendFlags::SIGNALED`).
    pub sq_sig_all: bool,
    /// Take every receive from this shared receive queue (`ibv_qp_init_attr.srq`); the
    /// QP's own receive queue is then unused (`cap.max_recv_wr` and `max_recv_sge` are not
    /// checked) and [`Qp::post_recv`] is refused.
    pub srq: Option<&'a Srq>,
}

impl<'a> QpInitAttr<'a> {
    /// An RC QP with default capabilities, all sends signaled.
    pub fn rc(send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        QpInitAttr {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq,
            cap: QpCaps::default(),
            sq_sig_all: true,
            srq: None,
        }
    }

    /// A UC QP with default capabilities, all sends signaled: SEND and RDMA WRITE only, no
    /// ACKs, a message lost in part is lost whole (IBTA 9.8).
    pub fn uc(send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        QpInitAttr {
            qp_type: QpType::Uc,
            ..QpInitAttr::rc(send_cq, recv_cq)
        }
    }

    /// A UD QP with default capabilities, all sends signaled.
    pub fn ud(send_cq: &'a Cq, recv_cq: &'a Cq) -> Self {
        QpInitAttr {
            qp_type: QpType::Ud,
            ..QpInitAttr::rc(send_cq, recv_cq)
        }
    }
}

/// Inline data is kept in send-queue slots of [`INLINE_SLOT`] bytes.
pub const INLINE_SLOT: u32 = 64;

/// The inline room a QP gets for `requested` bytes: a whole number of slots, at least the
/// room its SGE list would take (as rxe sizes a WQE), at most the device's limit. The QP
/// reports it in `cap.max_inline_data` and accepts that much, as rxe and mlx5 do (libfabric
/// asks for 16 and then sends 32 when the QP says it may).
pub fn inline_room(requested: u32, max_send_sge: u32) -> u32 {
    let wqe = requested.max(max_send_sge.saturating_mul(16));
    wqe.div_ceil(INLINE_SLOT)
        .saturating_mul(INLINE_SLOT)
        .min(limits::MAX_INLINE_DATA)
}

fn check_cap(what: &'static str, requested: u32, max: u32, zero_ok: bool) -> Result<()> {
    if requested == 0 && !zero_ok {
        return Err(VerbsError::Zero { what });
    }
    if requested > max {
        return Err(VerbsError::LimitExceeded {
            what,
            requested: requested as u64,
            max: max as u64,
        });
    }
    Ok(())
}

struct QpInner {
    _slot: ObjectSlot,
    pd: Arc<PdInner>,
    qpn: u32,
    shard: usize,
    qp_type: QpType,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    _srq: Option<Arc<SrqInner>>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        let runtime = &self.pd.core.runtime;
        // What posts and polls left for the poller goes out while the QP still exists (the
        // ACK of the last message a poll handed over: perftest's write_lat server destroys
        // its QP right after its last poll).
        let _ = runtime.transmit_waiting_posts(self.shard);
        let _ = runtime.with_engine(self.shard, true, |e| e.destroy_qp(self.qpn));
    }
}

/// A queue pair (`ibv_qp`). Clone to post from several threads.
#[derive(Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("qpn", &format_args!("{:#x}", self.inner.qpn))
            .field("type", &self.inner.qp_type)
            .finish()
    }
}

/// What one side of an RC connection tells the other (the out-of-band exchange).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcPeer {
    /// The peer's QP number.
    pub qpn: u32,
    /// The first PSN the peer will send.
    pub psn: u32,
    /// The peer's GID.
    pub gid: Gid,
}

/// The local choices of an RC connection (defaults are ibv_rc_pingpong's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcOptions {
    /// Local GID index (selects the source address).
    pub sgid_index: u8,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// First PSN this side sends.
    pub sq_psn: u32,
    /// What the peer may do to our memory through this QP.
    pub access: Access,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Transport retries, 0..=7, then RETRY_EXC_ERR (7 is finite, unlike rxe's "forever").
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Advertised RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC as initiator and as responder.
    pub max_rd_atomic: u8,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
}

impl Default for RcOptions {
    fn default() -> Self {
        RcOptions {
            sgid_index: 0,
            path_mtu: Mtu::Mtu1024,
            sq_psn: 0,
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            hop_limit: 64,
        }
    }
}

impl Qp {
    pub(crate) fn create(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        Qp::create_with(pd, init, |e, engine_init| e.create_qp(engine_init))
    }

    /// The GSI, QP1, in RTS (see [`crate::engine::Engine::create_gsi`]).
    pub(crate) fn create_gsi(pd: &Pd, init: &QpInitAttr<'_>) -> Result<Qp> {
        Qp::create_with(pd, init, |e, engine_init| e.create_gsi(engine_init))
    }

    fn create_with(
        pd: &Pd,
        init: &QpInitAttr<'_>,
        make: impl FnOnce(
            &mut crate::engine::Engine,
            QpInit,
        ) -> std::result::Result<u32, crate::engine::EngineError>,
    ) -> Result<Qp> {
        let same = |cq: &Cq| Arc::ptr_eq(&cq.inner.core, &pd.inner.core);
        if !same(init.send_cq) || !same(init.recv_cq) {
            return Err(VerbsError::WrongDevice {
                what: "completion queue",
            });
        }
        if let Some(srq) = init.srq {
            if !Arc::ptr_eq(&srq.inner.pd.core, &pd.inner.core) {
                return Err(VerbsError::WrongDevice {
                    what: "shared receive queue",
                });
            }
        }
        let mut cap = init.cap;
        check_cap("max_send_wr", cap.max_send_wr, limits::MAX_QP_WR, false)?;
        check_cap("max_send_sge", cap.max_send_sge, limits::MAX_SGE, true)?;
        if init.srq.is_some() {
            // ibv_create_qp ignores them with an SRQ (perftest and ibv_srq_pingpong pass 0).
            cap.max_recv_wr = 0;
            cap.max_recv_sge = 0;
        } else {
            // 0 makes a send-only QP (rxe and mlx5 accept it; a SEND to it meets RNR).
            check_cap("max_recv_wr", cap.max_recv_wr, limits::MAX_QP_WR, true)?;
            check_cap("max_recv_sge", cap.max_recv_sge, limits::MAX_SGE, true)?;
        }
        check_cap(
            "max_inline_data",
            cap.max_inline_data,
            limits::MAX_INLINE_DATA,
            true,
        )?;
        cap.max_inline_data = inline_room(cap.max_inline_data, cap.max_send_sge);
        let slot = ObjectSlot::take(&pd.inner.core, ObjectKind::Qp)?;
        let engine_init = QpInit {
            qp_type: init.qp_type,
            pd: pd.inner.id,
            send_cq: init.send_cq.inner.id,
            recv_cq: init.recv_cq.inner.id,
            caps: cap,
            sq_sig_all: init.sq_sig_all,
            srq: init.srq.map(|s| s.inner.id),
        };
        // A QP lives on its send CQ's shard: a thread that owns a CQ and its QPs owns a shard.
        let shard = init.send_cq.inner.home;
        let qpn = pd
            .inner
            .core
            .runtime
            .with_engine(shard, false, |e| make(e, engine_init))??;
        init.recv_cq.inner.add_shard(shard);
        Ok(Qp {
            inner: Arc::new(QpInner {
                _slot: slot,
                pd: pd.inner.clone(),
                qpn,
                shard,
                qp_type: init.qp_type,
                _send_cq: init.send_cq.inner.clone(),
                _recv_cq: init.recv_cq.inner.clone(),
                _srq: init.srq.map(|s| s.inner.clone()),
            }),
        })
    }

    fn device(&self) -> Device {
        Device {
            core: self.inner.pd.core.clone(),
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.inner.qpn
    }

    /// The engine shard it lives on (its send CQ's; see [`super::DeviceConfig::shards`]).
    pub fn shard(&self) -> u32 {
        self.inner.shard as u32
    }

    /// RC, UC or UD.
    pub fn qp_type(&self) -> QpType {
        self.inner.qp_type
    }

    /// Modifies the QP (`ibv_modify_qp`): the fields of `attr` named by `mask` are applied;
    /// a state change must follow the IBTA state table with exactly the required and
    /// optional attributes of that transition, otherwise the error names the attribute.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        if mask.contains(QpAttrMask::AV) {
            if let Some(av) = &attr.ah_attr {
                let table_len = self.device().gid_table().len() as u32;
                if av.sgid_index as u32 >= table_len {
                    return Err(VerbsError::NoSuchGid {
                        index: av.sgid_index as u32,
                        device: self.device().name().to_string(),
                        len: table_len,
                    });
                }
            }
        }
        let qpn = self.inner.qpn;
        // What posts and polls left for the poller leaves under the state it was made in (a
        // move to ERR would drop the ACK of the last message a poll handed over).
        self.inner
            .pd
            .core
            .runtime
            .transmit_waiting_posts(self.inner.shard)?;
        Ok(self.on_engine(true, |e| e.modify_qp(qpn, attr, mask))??)
    }

    /// The attributes in force and the capabilities (`ibv_query_qp`).
    pub fn query(&self) -> Result<(QpAttr, QpCaps)> {
        let qpn = self.inner.qpn;
        Ok(self.on_engine(false, |e| e.query_qp(qpn))??)
    }

    /// The current state.
    pub fn state(&self) -> Result<QpState> {
        Ok(self.query()?.0.cur_qp_state)
    }

    /// Runs `f` on the engine of this QP's shard (see `Runtime::with_engine`; `posted`:
    /// `f` may produce frames to transmit).
    fn on_engine<R>(
        &self,
        posted: bool,
        f: impl FnOnce(&mut crate::engine::Engine) -> R,
    ) -> Result<R> {
        self.inner
            .pd
            .core
            .runtime
            .with_engine(self.inner.shard, posted, f)
    }

    /// Runs `f`, which posts send WRs, on the engine of this QP's shard: as
    /// [`Qp::on_engine`] with `posted`, but a post in a burst may leave its frames for the
    /// burst's batch (`Runtime::post_to_engine`), except on the GSI (QP1), whose MADs the CM
    /// waits for.
    fn post_on_engine<R>(&self, f: impl FnOnce(&mut crate::engine::Engine) -> R) -> Result<R> {
        let may_join_burst = self.inner.qpn != crate::engine::GSI_QPN;
        self.inner
            .pd
            .core
            .runtime
            .post_to_engine(self.inner.shard, may_join_burst, f)
    }

    /// Posts one send WR (`ibv_post_send`). Its frame leaves before this returns, unless
    /// a poller's next round sends it (a thread polls this device), or it is deep in a
    /// burst of posts (closer than [`crate::verbs::POST_BURST_GAP`], after the burst's first
    /// [`crate::verbs::BURST_POSTS_SENT_AT_ONCE`]): then it leaves with a batch, at the
    /// latest when the burst ends.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        let qpn = self.inner.qpn;
        Ok(self.post_on_engine(|e| e.post_send(qpn, wr))??)
    }

    /// Posts a SEND or WRITE whose payload is `data`, copied now (`IBV_SEND_INLINE`): `data`
    /// may be reused as soon as this returns, and it need not be in a memory region.
    /// `wr.sg_list` is ignored. More than the QP's `max_inline_data` bytes is refused
    /// ([`crate::engine::EngineError::LimitExceeded`]), as is a READ or atomic.
    ///
    /// `SendFlags::INLINE` with [`Qp::post_send`] does the same with the bytes the SGEs
    /// address (their lkeys unchecked, as libibverbs does for inline sends).
    pub fn post_send_inline(&self, wr: &SendWr, data: &[u8]) -> Result<()> {
        let qpn = self.inner.qpn;
        Ok(self.post_on_engine(|e| e.post_send_inline(qpn, &wr.borrowed(), data))??)
    }

    /// Binds a type 1 memory window through this QP (`ibv_bind_mw`, IBTA 10.6.7.2.1): a bind
    /// WR goes on the send queue and the window's next R_Key is returned at once; it is in
    /// force (the old one refused) once the bind executes, in send queue order. A bind the
    /// checks refuse completes with `MwBindErr` and the QP enters ERR. `bind.length` 0
    /// unbinds. Type 2 windows are bound with a [`crate::engine::WrOp::BindMw`] WR.
    pub fn bind_mw(&self, mw: &Mw, wr_id: u64, flags: SendFlags, bind: MwBindInfo) -> Result<u32> {
        if !Arc::ptr_eq(&mw.inner.pd.core, &self.inner.pd.core) {
            return Err(VerbsError::WrongDevice {
                what: "memory window",
            });
        }
        let (qpn, id) = (self.inner.qpn, mw.id());
        Ok(self.on_engine(true, |e| e.bind_mw(qpn, wr_id, flags, id, bind))??)
    }

    /// Posts a chain of send WRs under one engine lock and in one progress round
    /// (`ibv_post_send` with a list): `walk` is handed a poster and calls it once per WR,
    /// in order, with the WR's bytes for an inline one; a refusal (the engine's, or one
    /// `walk` makes itself) ends the walk and is returned, the WRs before it stay posted.
    /// Borrowed WRs: nothing is allocated per WR.
    pub fn post_send_chain(
        &self,
        walk: impl FnOnce(&mut dyn FnMut(&SendWrRef<'_>, Option<&[u8]>) -> Result<()>) -> Result<()>,
    ) -> Result<()> {
        let qpn = self.inner.qpn;
        self.post_on_engine(|e| {
            walk(&mut |wr, inline| {
                Ok(match inline {
                    Some(data) => e.post_send_inline(qpn, wr, data),
                    None => e.post_send_ref(qpn, wr),
                }?)
            })
        })?
    }

    /// Posts a chain of receive WRs (wr_id, SGEs) under one engine lock, as
    /// [`Qp::post_send_chain`] does sends.
    pub fn post_recv_chain(
        &self,
        walk: impl FnOnce(&mut dyn FnMut(u64, &[Sge]) -> Result<()>) -> Result<()>,
    ) -> Result<()> {
        let qpn = self.inner.qpn;
        self.on_engine(false, |e| {
            walk(&mut |wr_id, sges| Ok(e.post_recv_sges(qpn, wr_id, sges)?))
        })?
    }

    /// Posts send WRs in order; on the first refusal, stops and says which (the ones before
    /// it are posted), like `ibv_post_send`'s `bad_wr`.
    pub fn post_send_batch(&self, wrs: &[SendWr]) -> Result<()> {
        self.post_batch(true, wrs, |wr| wr.wr_id, |e, qpn, wr| e.post_send(qpn, wr))
    }

    /// Posts one receive WR (`ibv_post_recv`).
    ///
    /// It does not wake the progress thread: a posted receive creates no frame to send and
    /// arms no timer (after an RNR NAK it is the peer's retry that brings the message,
    /// IBTA 9.7.5.2.8), and a flush completion in the error state is delivered here.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let qpn = self.inner.qpn;
        Ok(self.on_engine(false, |e| e.post_recv(qpn, wr))??)
    }

    /// Posts receive WRs in order; stops at the first refusal (see [`Qp::post_send_batch`]).
    /// Like [`Qp::post_recv`], it does not wake the progress thread.
    pub fn post_recv_batch(&self, wrs: &[RecvWr]) -> Result<()> {
        self.post_batch(false, wrs, |wr| wr.wr_id, |e, qpn, wr| e.post_recv(qpn, wr))
    }

    /// Posts WRs in order under one engine lock; the first refusal stops the batch and is
    /// reported with its index and wr_id (the WRs before it stay posted). `wake`: whether the
    /// progress thread has new work (sends do; receives do not).
    fn post_batch<W>(
        &self,
        wake: bool,
        wrs: &[W],
        wr_id: impl Fn(&W) -> u64,
        post: impl Fn(
            &mut crate::engine::Engine,
            u32,
            &W,
        ) -> std::result::Result<(), crate::engine::EngineError>,
    ) -> Result<()> {
        let qpn = self.inner.qpn;
        let refused = self.on_engine(wake, |e| {
            for (index, wr) in wrs.iter().enumerate() {
                if let Err(err) = post(e, qpn, wr) {
                    return Some((index, wr_id(wr), err));
                }
            }
            None
        })?;
        match refused {
            None => Ok(()),
            Some((index, wr_id, err)) => Err(VerbsError::PostFailed {
                index,
                wr_id,
                source: Box::new(err.into()),
            }),
        }
    }

    /// RESET → INIT with port 1, P_Key index 0 and `access` (for UD: Q_Key `qkey`).
    pub fn to_init(&self, access: Access, qkey: u32) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: access,
            qkey,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        let mask = match self.inner.qp_type {
            QpType::Rc | QpType::Uc => mask | QpAttrMask::ACCESS_FLAGS,
            QpType::Ud => mask | QpAttrMask::QKEY,
        };
        self.modify(&attr, mask)
    }

    /// Connects an RC QP to `peer`: RESET → INIT → RTR → RTS with `opts`, resolving the
    /// peer's MAC (what ibv_rc_pingpong does after the out-of-band exchange).
    pub fn connect_rc(&self, peer: &RcPeer, opts: &RcOptions) -> Result<()> {
        self.expect_type("connect_rc", QpType::Rc)?;
        self.connect(peer, opts)
    }

    /// Connects a UC QP to `peer` (what ibv_uc_pingpong does): RESET → INIT → RTR → RTS with
    /// the connection attributes of `opts` (GID index, path MTU, first PSN, access, hop
    /// limit). Its ACK timeout, retry counts, RNR timer and READ/ATOMIC depth are RC's only
    /// and are not used: a UC transition refuses them (IBTA 9.8, Linux's state table).
    pub fn connect_uc(&self, peer: &RcPeer, opts: &RcOptions) -> Result<()> {
        self.expect_type("connect_uc", QpType::Uc)?;
        self.connect(peer, opts)
    }

    fn expect_type(&self, call: &'static str, expected: QpType) -> Result<()> {
        let actual = self.inner.qp_type;
        if actual != expected {
            return Err(VerbsError::WrongQpType {
                call,
                expected,
                actual,
            });
        }
        Ok(())
    }

    /// RC or UC: RESET → INIT → RTR → RTS with the attributes the QP type takes.
    fn connect(&self, peer: &RcPeer, opts: &RcOptions) -> Result<()> {
        let rc = self.inner.qp_type == QpType::Rc;
        let device = self.device();
        let mut ah = AhAttr::new(peer.gid, opts.sgid_index);
        ah.hop_limit = opts.hop_limit;
        let av = device.resolve_av(&ah)?;
        if self.state()? == QpState::Reset {
            self.to_init(opts.access, 0)?;
        }
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: opts.path_mtu,
            dest_qp_num: peer.qpn,
            rq_psn: peer.psn,
            max_dest_rd_atomic: opts.max_rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            ah_attr: Some(av),
            ..QpAttr::default()
        };
        let mut rtr_mask = QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN;
        if rc {
            rtr_mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
        }
        self.modify(&rtr, rtr_mask)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: opts.sq_psn,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: opts.max_rd_atomic,
            ..QpAttr::default()
        };
        let mut rts_mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
        if rc {
            rts_mask |= QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(&rts, rts_mask)
    }

    /// Brings a UD QP to RTS (RESET → INIT → RTR → RTS) with Q_Key `qkey`, first PSN `sq_psn`.
    pub fn ready_ud(&self, qkey: u32, sq_psn: u32) -> Result<()> {
        self.expect_type("ready_ud", QpType::Ud)?;
        if self.state()? == QpState::Reset {
            self.to_init(Access::NONE, qkey)?;
        }
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        self.modify(&rtr, QpAttrMask::STATE)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn,
            ..QpAttr::default()
        };
        self.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    }
}

#[cfg(test)]
mod tests {
    use super::{inline_room, INLINE_SLOT};
    use crate::engine::limits;

    #[test]
    fn inline_room_is_whole_slots_within_the_limit() {
        // libfabric asks for 16 and then sends up to what the QP reports.
        assert_eq!(inline_room(16, 1), INLINE_SLOT);
        assert_eq!(inline_room(65, 1), 2 * INLINE_SLOT);
        // At least the SGE list's room, as rxe sizes a WQE.
        assert_eq!(inline_room(0, 8), 2 * INLINE_SLOT);
        assert_eq!(
            inline_room(limits::MAX_INLINE_DATA, 1),
            limits::MAX_INLINE_DATA
        );
        assert_eq!(inline_room(200, limits::MAX_SGE), limits::MAX_INLINE_DATA);
    }
}
