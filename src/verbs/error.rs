//! The typed errors of the verbs API: each says which object, attribute or limit was wrong.
use crate::driver::DriverError;
use crate::engine::EngineError;
use crate::netdev::NetdevError;

/// Why a verbs call could not be done. Remote failures are never errors here: they arrive as
/// completion statuses ([`crate::verbs::WcStatus`]).
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// The transport engine refused the call (bad state transition, missing attribute, full
    /// queue, unknown key, ...); the inner error names what.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The driver could not be opened or failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The network interface could not be queried, or a neighbour not resolved.
    #[error(transparent)]
    Netdev(#[from] NetdevError),
    /// A requested size is above what the device supports.
    #[error("{what} = {requested} exceeds the device limit of {max}")]
    LimitExceeded {
        /// The attribute, in libibverbs spelling (e.g. "max_send_wr").
        what: &'static str,
        /// What was asked for.
        requested: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// A value must not be zero (a CQ or queue of depth 0, a zero-length MR...).
    #[error("{what} must be at least 1")]
    Zero {
        /// The attribute.
        what: &'static str,
    },
    /// No GID at that index.
    #[error("no GID at index {index}: the GID table of {device} has {len} entries")]
    NoSuchGid {
        /// The index asked for.
        index: u32,
        /// The device name.
        device: String,
        /// The table length.
        len: u32,
    },
    /// Only port 1 exists.
    #[error("no port {0}: xroce devices have one port, number 1")]
    NoSuchPort(u8),
    /// An access to a memory region's bytes falls outside it.
    #[error("range offset {offset} + {len} bytes is outside memory region of {mr_len} bytes")]
    MrRange {
        /// Offset from the MR start.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The MR's length.
        mr_len: u64,
    },
    /// An object was used with another device than the one that created it.
    #[error("{what} belongs to another device")]
    WrongDevice {
        /// The object.
        what: &'static str,
    },
    /// A call made for one QP type on a QP of another (`connect_uc` on an RC QP, ...).
    #[error("{call} needs a {} queue pair, this one is {}", expected.name(), actual.name())]
    WrongQpType {
        /// The call.
        call: &'static str,
        /// The type it needs.
        expected: crate::engine::QpType,
        /// The QP's type.
        actual: crate::engine::QpType,
    },
    /// A work request in a batch was refused; those before it were posted.
    #[error("work request {index} of the batch (wr_id {wr_id:#x}) was refused: {source}")]
    PostFailed {
        /// Index of the refused WR in the batch.
        index: usize,
        /// Its wr_id.
        wr_id: u64,
        /// Why.
        #[source]
        source: Box<VerbsError>,
    },
    /// The device's progress thread stopped (its driver failed); the device is unusable.
    #[error("device {device} stopped: {reason}")]
    DeviceStopped {
        /// The device name.
        device: String,
        /// What stopped it.
        reason: String,
    },
    /// Waiting on a completion channel timed out.
    #[error("no completion event within {0:?}")]
    Timeout(std::time::Duration),
    /// A configuration value is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device does not have the feature asked for (a raw packet QP, XRC, ...): the C
    /// library's `EOPNOTSUPP`, which callers take as "absent", not as a failure.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Result of a verbs call.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;
