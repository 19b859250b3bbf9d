//! TEMPORARY: the REJ reasons until fix/cm-wire's `wire::cm::RejectReason` lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    NoQp,
    NoResources,
    Timeout,
    InvalidCommId,
    InvalidServiceId,
    InvalidTransportType,
    StaleConnection,
    InvalidMtu,
    ConsumerReject,
    Other(u16),
}

impl From<u16> for RejectReason {
    fn from(code: u16) -> RejectReason {
        match code {
            1 => RejectReason::NoQp,
            3 => RejectReason::NoResources,
            4 => RejectReason::Timeout,
            6 => RejectReason::InvalidCommId,
            8 => RejectReason::InvalidServiceId,
            9 => RejectReason::InvalidTransportType,
            10 => RejectReason::StaleConnection,
            26 => RejectReason::InvalidMtu,
            28 => RejectReason::ConsumerReject,
            other => RejectReason::Other(other),
        }
    }
}

impl From<RejectReason> for u16 {
    fn from(r: RejectReason) -> u16 {
        match r {
            RejectReason::NoQp => 1,
            RejectReason::NoResources => 3,
            RejectReason::Timeout => 4,
            RejectReason::InvalidCommId => 6,
            RejectReason::InvalidServiceId => 8,
            RejectReason::InvalidTransportType => 9,
            RejectReason::StaleConnection => 10,
            RejectReason::InvalidMtu => 26,
            RejectReason::ConsumerReject => 28,
            RejectReason::Other(code) => code,
        }
    }
}
