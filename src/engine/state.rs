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
        v |= bits[i].bits();
        i += 1;
    }
    M::from_bits_retain(v)
}

const NONE: TransitionRule = TransitionRule {
    required: M::empty(),
    optional: M::empty(),
};

/// The rule for `from -> to` and `qp_type`, or `None` if the transition does not exist.
///
/// UC takes RC's connection attributes (AV, path MTU, destination QPN, PSNs, access flags)
/// and none of what only acknowledgements need: no local ACK timeout, retry counts, RNR timer
/// or READ/ATOMIC depths (UC has no READ or atomics, IBTA 9.8.1), as Linux's table says.
pub fn transition_rule(from: QpState, to: QpState, qp_type: QpType) -> Option<TransitionRule> {
    use QpState::*;
    let rule = |required: M, optional: M| Some(TransitionRule { required, optional });
    // One rule per QP type: (RC, UC, UD).
    let by_type = |rc: (M, M), uc: (M, M), ud: (M, M)| {
        let (required, optional) = match qp_type {
            QpType::Rc => rc,
            QpType::Uc => uc,
            QpType::Ud => ud,
        };
        rule(required, optional)
    };
    let none = M::empty();
    match (from, to) {
        // Any state may go to RESET or ERR with no attributes.
        (_, Reset) | (_, Err) => Some(NONE),
        (Reset, Init) => {
            let connected = m(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]);
            by_type(
                (connected, none),
                (connected, none),
                (m(&[M::PKEY_INDEX, M::PORT, M::QKEY]), none),
            )
        }
        (Init, Init) => {
            let connected = m(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]);
            by_type(
                (none, connected),
                (none, connected),
                (none, m(&[M::PKEY_INDEX, M::PORT, M::QKEY])),
            )
        }
        (Init, Rtr) => {
            let optional = m(&[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX]);
            let uc = m(&[M::AV, M::PATH_MTU, M::DEST_QPN, M::RQ_PSN]);
            by_type(
                (
                    m(&[
                        M::AV,
                        M::PATH_MTU,
                        M::DEST_QPN,
                        M::RQ_PSN,
                        M::MAX_DEST_RD_ATOMIC,
                        M::MIN_RNR_TIMER,
                    ]),
                    optional,
                ),
                (uc, optional),
                (none, m(&[M::PKEY_INDEX, M::QKEY])),
            )
        }
        (Rtr, Rts) => by_type(
            (
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
            ),
            (
                M::SQ_PSN,
                m(&[
                    M::CUR_STATE,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PATH_MIG_STATE,
                ]),
            ),
            (M::SQ_PSN, m(&[M::CUR_STATE, M::QKEY])),
        ),
        (Rts, Rts) | (Sqd, Rts) => by_type(
            (
                none,
                m(&[
                    M::CUR_STATE,
                    M::ACCESS_FLAGS,
                    M::ALT_PATH,
                    M::PATH_MIG_STATE,
                    M::MIN_RNR_TIMER,
                ]),
            ),
            (
                none,
                m(&[
                    M::CUR_STATE,
                    M::ACCESS_FLAGS,
                    M::ALT_PATH,
                    M::PATH_MIG_STATE,
                ]),
            ),
            (none, m(&[M::CUR_STATE, M::QKEY])),
        ),
        (Rts, Sqd) => rule(M::empty(), M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) => by_type(
            (
                none,
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
            ),
            (
                none,
                m(&[
                    M::AV,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PKEY_INDEX,
                    M::PATH_MIG_STATE,
                ]),
            ),
            (none, m(&[M::PKEY_INDEX, M::QKEY])),
        ),
        // SQE exists only for UD/UC in Linux's table; for RC it carries no attributes.
        (Sqe, Rts) => by_type(
            (none, none),
            (none, m(&[M::CUR_STATE, M::ACCESS_FLAGS])),
            (none, m(&[M::CUR_STATE, M::QKEY])),
        ),
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
    // On raw bits, so that a bit without a name is refused too.
    let missing = M::from_bits_retain(rule.required.bits() & !mask.bits());
    if !missing.is_empty() {
        return Err(EngineError::MissingAttribute { from, to, missing });
    }
    let allowed = rule.required | rule.optional | M::STATE;
    let extra = M::from_bits_retain(mask.bits() & !allowed.bits());
    if !extra.is_empty() {
        return Err(EngineError::AttributeNotAllowed { from, to, extra });
    }
    Ok(())
}
