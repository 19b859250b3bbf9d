//! The QP state transition table (IBTA Vol. 1 10.3.1, QP state transitions), as Linux checks it
//! in `ib_modify_qp_is_ok` (drivers/infiniband/core/verbs.c):
//! for each (current, next) state pair, whether the transition exists and which attributes
//! are required and which optional, per QP type. `STATE` is always allowed.
use super::types::{EngineError, QpAttrMask as M, QpState, QpType};

/// Required and optional attributes of one transition for one QP type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes the mask must contain.
    pub required: M,
    /// Attributes the mask may contain besides the required ones and `STATE`.
    pub optional: M,
}

const fn m(bits: &[M]) -> M {
    let mut v = 0;
    let mut i = 0;
    while i < bits.len() {
        v |= bits[i].0;
        i += 1;
    }
    M(v)
}

const NONE: TransitionRule = TransitionRule {
    required: M(0),
    optional: M(0),
};

/// The rule for `from -> to` and `qp_type`, or `None` if the transition does not exist.
pub fn transition_rule(from: QpState, to: QpState, qp_type: QpType) -> Option<TransitionRule> {
    use QpState::*;
    let rc = qp_type == QpType::Rc;
    let rule = |required: M, optional: M| Some(TransitionRule { required, optional });
    match (from, to) {
        // Any state may go to RESET or ERR with no attributes.
        (_, Reset) | (_, Err) => Some(NONE),
        (Reset, Init) => {
            if rc {
                rule(m(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]), M(0))
            } else {
                rule(m(&[M::PKEY_INDEX, M::PORT, M::QKEY]), M(0))
            }
        }
        (Init, Init) => {
            if rc {
                rule(M(0), m(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]))
            } else {
                rule(M(0), m(&[M::PKEY_INDEX, M::PORT, M::QKEY]))
            }
        }
        (Init, Rtr) => {
            if rc {
                rule(
                    m(&[
                        M::AV,
                        M::PATH_MTU,
                        M::DEST_QPN,
                        M::RQ_PSN,
                        M::MAX_DEST_RD_ATOMIC,
                        M::MIN_RNR_TIMER,
                    ]),
                    m(&[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX]),
                )
            } else {
                rule(M(0), m(&[M::PKEY_INDEX, M::QKEY]))
            }
        }
        (Rtr, Rts) => {
            if rc {
                rule(
                    m(&[
                        M::TIMEOUT,
                        M::RETRY_CNT,
                        M::RNR_RETRY,
                        M::SQ_PSN,
                        M::MAX_QP_RD_ATOMIC,
                    ]),
                    m(&[
                        M::CUR_STATE,
                        M::ALT_PATH,
                        M::ACCESS_FLAGS,
                        M::MIN_RNR_TIMER,
                        M::PATH_MIG_STATE,
                    ]),
                )
            } else {
                rule(M::SQ_PSN, m(&[M::CUR_STATE, M::QKEY]))
            }
        }
        (Rts, Rts) | (Sqd, Rts) => {
            if rc {
                rule(
                    M(0),
                    m(&[
                        M::CUR_STATE,
                        M::ACCESS_FLAGS,
                        M::ALT_PATH,
                        M::PATH_MIG_STATE,
                        M::MIN_RNR_TIMER,
                    ]),
                )
            } else {
                rule(M(0), m(&[M::CUR_STATE, M::QKEY]))
            }
        }
        (Rts, Sqd) => rule(M(0), M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => {
            if rc {
                rule(
                    M(0),
                    m(&[
                        M::PORT,
                        M::AV,
                        M::TIMEOUT,
                        M::RETRY_CNT,
                        M::RNR_RETRY,
                        M::MAX_QP_RD_ATOMIC,
                        M::MAX_DEST_RD_ATOMIC,
                        M::ALT_PATH,
                        M::ACCESS_FLAGS,
                        M::PKEY_INDEX,
                        M::MIN_RNR_TIMER,
                        M::PATH_MIG_STATE,
                    ]),
                )
            } else {
                rule(M(0), m(&[M::PKEY_INDEX, M::QKEY]))
            }
        }
        // SQE exists only for UD/UC in Linux's table; for RC it carries no attributes.
        (Sqe, Rts) => {
            if rc {
                rule(M(0), M(0))
            } else {
                rule(M(0), m(&[M::CUR_STATE, M::QKEY]))
            }
        }
        _ => None,
    }
}

/// Check a `modify_qp` call against the table: Ok(()) or the typed error naming what is
/// wrong (the transition, the missing attributes, or the extra ones).
pub fn check_transition(
    from: QpState,
    to: QpState,
    qp_type: QpType,
    mask: M,
) -> Result<(), EngineError> {
    // ib_modify_qp_is_ok: CUR_STATE is only meaningful from RTR, RTS, SQD, SQE.
    if mask.contains(M::CUR_STATE)
        && !matches!(
            from,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    {
        return Err(EngineError::AttributeNotAllowed {
            from,
            to,
            extra: M::CUR_STATE,
        });
    }
    let rule =
        transition_rule(from, to, qp_type).ok_or(EngineError::InvalidTransition { from, to })?;
    let missing = M(rule.required.0 & !mask.0);
    if missing.0 != 0 {
        return Err(EngineError::MissingAttribute { from, to, missing });
    }
    let extra = M(mask.0 & !(rule.required.0 | rule.optional.0 | M::STATE.0));
    if extra.0 != 0 {
        return Err(EngineError::AttributeNotAllowed { from, to, extra });
    }
    Ok(())
}
