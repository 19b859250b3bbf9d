//! Range checks for command-line options, run before any device is opened. Errors name the
//! option as the user typed it (`-n/--iters`), the value, the allowed range and why.

use std::fmt::Display;

/// `value` of option `flag` if it lies in `lo..=hi`; otherwise an error naming both, with
/// `why` (where the limit comes from) appended.
pub fn in_range<T: PartialOrd + Display + Copy>(
    flag: &str,
    value: T,
    lo: T,
    hi: T,
    why: &str,
) -> anyhow::Result<T> {
    if value < lo || value > hi {
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(" ({why})")
        };
        anyhow::bail!("{flag} {value}: must be between {lo} and {hi}{why}");
    }
    Ok(value)
}

/// A TCP port for the set-up exchange: port 0 would listen on a random port that nobody is
/// told about, so the peer could never connect.
pub fn tcp_port(flag: &str, port: u16) -> anyhow::Result<u16> {
    if port == 0 {
        anyhow::bail!(
            "{flag} 0: choose a TCP port between 1 and 65535 (both sides must use the same one)"
        );
    }
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_option_and_the_limit() {
        let e = in_range("-t/--tx-depth", 0u32, 1, 15000, "perftest's MAX_TX").unwrap_err();
        assert_eq!(
            e.to_string(),
            "-t/--tx-depth 0: must be between 1 and 15000 (perftest's MAX_TX)"
        );
        assert_eq!(in_range("-q", 3, 1, 64, "").unwrap(), 3);
        assert!(tcp_port("-p/--port", 0)
            .unwrap_err()
            .to_string()
            .starts_with("-p/--port 0:"));
        assert_eq!(tcp_port("-p/--port", 18515).unwrap(), 18515);
    }
}
