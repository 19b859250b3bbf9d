//! From xroce's typed errors to the errno a C caller expects, and the one line the library
//! prints when a verb fails (C callers only see a number; the cause is in xroce's error).

use std::ffi::c_int;

use xroce::engine::EngineError;
use xroce::verbs::VerbsError;

/// The errno rdma-core's providers give for the same refusal.
pub(crate) fn errno_of(err: &VerbsError) -> c_int {
    match err {
        VerbsError::LimitExceeded { .. } => libc::EINVAL,
        VerbsError::Zero { .. } => libc::EINVAL,
        VerbsError::NoSuchGid { .. } | VerbsError::NoSuchPort(_) => libc::EINVAL,
        VerbsError::MrRange { .. } => libc::EINVAL,
        VerbsError::WrongDevice { .. } | VerbsError::WrongQpType { .. } => libc::EINVAL,
        VerbsError::InvalidArgument(_) => libc::EINVAL,
        VerbsError::Unsupported(_) => libc::EOPNOTSUPP,
        VerbsError::Timeout(_) => libc::ETIMEDOUT,
        VerbsError::Engine(e) => engine_errno(e),
        VerbsError::Driver(_) | VerbsError::DeviceStopped { .. } => libc::EIO,
        VerbsError::Netdev(_) => libc::ENODEV,
        VerbsError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EINVAL,
    }
}

fn engine_errno(e: &EngineError) -> c_int {
    match e {
        // rdma-core's providers say ENOMEM for a full queue: the application retries later.
        EngineError::QueueFull(_) => libc::ENOMEM,
        EngineError::InUse(_) | EngineError::GsiExists => libc::EBUSY,
        EngineError::UnsupportedOperation { .. } => libc::EOPNOTSUPP,
        // A controlled Q_Key (bit 31) on an ordinary QP: Linux's uverbs says EPERM.
        EngineError::InvalidAttributeValue { attr: "QKEY", .. } => libc::EPERM,
        _ => libc::EINVAL,
    }
}

/// Prints why a verb failed, once per failure, unless `XROCE_LOG=off`. A size above a
/// device limit is a probe's expected answer (the errno says it all) and is printed only
/// with `XROCE_LOG=all`.
pub(crate) fn log_failure(call: &str, errno: c_int, err: &VerbsError) {
    let config = super::config::LibraryConfig::get();
    if !should_log(err, config.quiet, config.log_limit_probes) {
        return;
    }
    eprintln!(
        "xroce: {call} failed ({}): {err}",
        std::io::Error::from_raw_os_error(errno)
    );
}

/// Whether [`log_failure`] prints `err` at this level.
fn should_log(err: &VerbsError, quiet: bool, log_limit_probes: bool) -> bool {
    let limit_probe = matches!(err, VerbsError::LimitExceeded { .. });
    !quiet && (!limit_probe || log_limit_probes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_probe_is_printed_only_when_asked() {
        let probe = VerbsError::LimitExceeded {
            what: "max_inline_data",
            requested: 512,
            max: 256,
        };
        let real = VerbsError::InvalidArgument("no such thing".into());
        // Default level: real failures yes, probes no (rdma-core prints neither).
        assert!(should_log(&real, false, false));
        assert!(!should_log(&probe, false, false));
        // XROCE_LOG=all, XROCE_LOG=off.
        assert!(should_log(&probe, false, true));
        assert!(!should_log(&real, true, false));
        assert_eq!(errno_of(&probe), libc::EINVAL);
    }
}
