//! The general services interface (GSI): QP1, the UD QP that management datagrams (MADs) of
//! the communication manager and other general services use (IBTA 13.4.6, 13.5.1).
//!
//! The GSI is an ordinary UD QP with three fixed facts: its number is 1, its Q_Key is the
//! well-known [`GSI_QKEY`] 0x8001_0000 (a *controlled* Q_Key: bit 31 set, IBTA 10.2.5), and
//! it has P_Key index 0 (the only entry of the P_Key table here). Every frame whose BTH
//! destination QPN is 1 reaches it through the same receive path as any UD QP (Q_Key check
//! against 0x8001_0000, a receive WQE with a 40-byte GRH area); its sends carry source QP 1 in
//! the DETH. Ordinary QPs cannot impersonate it: a Q_Key with bit 31 set is refused on them
//! (`modify_qp`), and a UD send WR's Q_Key with bit 31 set means "the QP's own" (IBTA
//! 3.5.3), so only the GSI ever sends 0x8001_0000. (Linux refuses a controlled Q_Key to
//! unprivileged users only, CAP_NET_RAW may set one; xroce refuses it to every caller, so a
//! program that puts e.g. 0xFFFF_FFFF on its UD QPs as root gets EPERM here.)
use super::types::{EngineError, QpAttr, QpAttrMask, QpInit, QpState, QpType};
use super::Engine;

/// QP1's number and Q_Key are wire facts (IBTA 3.5.1.1, 13.5.1), defined once in
/// [`crate::wire::mad`].
pub use crate::wire::mad::{GSI_QKEY, GSI_QPN};

/// Bit 31 of a Q_Key: a controlled (privileged) Q_Key only the GSI may hold (IBTA 10.2.5).
pub const CONTROLLED_QKEY_BIT: u32 = 0x8000_0000;

/// Why `qkey` may not be set on QP `qpn` through `modify_qp`, if it may not.
pub(crate) fn qkey_refusal(qpn: u32, qkey: u32) -> Option<String> {
    if qpn == GSI_QPN {
        (qkey != GSI_QKEY).then(|| {
            format!(
                "{qkey:#010x}: the GSI (QP1) has the fixed Q_Key {GSI_QKEY:#010x} (IBTA 13.5.1)"
            )
        })
    } else {
        (qkey & CONTROLLED_QKEY_BIT != 0).then(|| {
            format!("{qkey:#010x} has bit 31 set: controlled Q_Keys are the GSI's (IBTA 10.2.5)")
        })
    }
}

impl Engine {
    /// Creates the GSI, QP1, and brings it to RTS: UD, Q_Key [`GSI_QKEY`], P_Key index 0,
    /// port 1. `init.qp_type` must be UD. Only one GSI exists per engine (a second is
    /// [`EngineError::GsiExists`]); a shard other than `1 % count` cannot hold it. An engine
    /// with a QPN prefix (behind a relay) holds its own QP1 too, outside its slot's range:
    /// the relay hands each CM MAD to the process it is for, as Linux's CM shares the
    /// port's QP1 among processes (docs/ibverbs.md, "CM MADs behind a relay").
    pub fn create_gsi(&mut self, init: QpInit) -> Result<u32, EngineError> {
        if init.qp_type != QpType::Ud {
            return Err(EngineError::InvalidArgument(format!(
                "the GSI is a UD QP, not {}",
                init.qp_type.name()
            )));
        }
        if self.qps.contains_key(&GSI_QPN) {
            return Err(EngineError::GsiExists);
        }
        if super::shard_of_qpn(GSI_QPN, self.shard.count) != self.shard.index {
            return Err(EngineError::InvalidArgument(format!(
                "QP1 belongs to shard {} of {}, not to this one ({})",
                super::shard_of_qpn(GSI_QPN, self.shard.count),
                self.shard.count,
                self.shard.index
            )));
        }
        let qpn = self.create_qp_inner(init, Some(GSI_QPN))?;
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            qkey: GSI_QKEY,
            pkey_index: 0,
            port_num: 1,
            ..QpAttr::default()
        };
        let steps = [
            (
                QpState::Init,
                QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
            ),
            (QpState::Rtr, QpAttrMask::STATE),
            (QpState::Rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN),
        ];
        for (state, mask) in steps {
            attr.qp_state = state;
            if let Err(e) = self.modify_qp(qpn, &attr, mask) {
                let _ = self.destroy_qp(qpn);
                return Err(e);
            }
        }
        Ok(qpn)
    }

    /// Whether this engine holds the GSI (QP1).
    pub fn has_gsi(&self) -> bool {
        self.qps.contains_key(&GSI_QPN)
    }
}
