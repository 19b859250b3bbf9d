//! What the library reads from the environment (`xroce run` sets it): which interfaces become
//! devices and how a device is opened.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `XROCE_NETDEV` | interfaces to offer, comma-separated | every Ethernet interface that is up |
//! | `XROCE_DRIVER` | `xdp` or `udp` | `xdp` |
//! | `XROCE_PROGRESS` | `wakeup` or `busy-poll` | `wakeup` |
//! | `XROCE_SHARDS` | engine shards per device | 1 |
//! | `XROCE_PCAP` | write every frame to this pcap file (`%p`: the process id) | none |
//! | `XROCE_LOG` | `off`: no lines on stderr; `all`: also refusals of a size above a limit | failures printed, limit probes not |

use std::sync::OnceLock;

use xroce::verbs::{DeviceConfig, DriverKind, ProgressMode};

/// The library's settings, read once from the environment.
#[derive(Clone, Debug)]
pub struct LibraryConfig {
    /// Interfaces named in `XROCE_NETDEV`, or `None` for all Ethernet interfaces.
    pub netdevs: Option<Vec<String>>,
    /// How each device is opened.
    pub device: DeviceConfig,
    /// Settings that could not be understood (reported once, at the first device list).
    pub problems: Vec<String>,
    /// `XROCE_LOG=off`.
    pub quiet: bool,
    /// `XROCE_LOG=all`: also print refusals of a size above a device limit, which libraries
    /// probing the limits (libfabric grows a QP's inline size until one is refused) meet by
    /// design; rdma-core prints nothing for them, and neither does xroce by default.
    pub log_limit_probes: bool,
}

impl LibraryConfig {
    /// Reads the settings from `var` (the process environment in the library).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> LibraryConfig {
        let mut problems = Vec::new();
        let mut device = DeviceConfig::default();
        let netdevs = var("XROCE_NETDEV").map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| s.strip_prefix("xroce_").unwrap_or(s).to_string())
                .collect::<Vec<_>>()
        });
        match var("XROCE_DRIVER").as_deref() {
            None | Some("xdp") => device.driver = DriverKind::Xdp,
            Some("udp") => device.driver = DriverKind::Udp,
            Some("relay") => device.driver = DriverKind::Relay,
            Some(other) => problems.push(format!(
                "XROCE_DRIVER={other:?} is not a driver (xdp, udp or relay); using xdp"
            )),
        }
        if let Some(mode) = var("XROCE_PROGRESS") {
            match mode.parse::<ProgressMode>() {
                Ok(m) => device.progress = m,
                Err(e) => problems.push(format!("XROCE_PROGRESS: {e}; using wakeup")),
            }
        }
        if let Some(shards) = var("XROCE_SHARDS") {
            match shards.parse::<u32>() {
                Ok(n) if (1..=xroce::verbs::MAX_SHARDS).contains(&n) => device.shards = n,
                _ => problems.push(format!(
                    "XROCE_SHARDS={shards:?} is not a shard count (1..={}); using 1",
                    xroce::verbs::MAX_SHARDS
                )),
            }
        }
        if let Some(path) = var("XROCE_PCAP") {
            let path = path.replace("%p", &std::process::id().to_string());
            device.pcap = Some(path.into());
        }
        let (quiet, log_limit_probes) = match var("XROCE_LOG").as_deref() {
            None | Some("") | Some("failures") => (false, false),
            Some("off") => (true, false),
            Some("all") => (false, true),
            Some(other) => {
                problems.push(format!(
                    "XROCE_LOG={other:?} is not a level (off, failures or all); using failures"
                ));
                (false, false)
            }
        };
        LibraryConfig {
            netdevs,
            device,
            problems,
            quiet,
            log_limit_probes,
        }
    }

    /// The process's settings.
    pub fn get() -> &'static LibraryConfig {
        static CONFIG: OnceLock<LibraryConfig> = OnceLock::new();
        CONFIG.get_or_init(|| {
            let config = LibraryConfig::from_vars(|name| std::env::var(name).ok());
            for problem in &config.problems {
                eprintln!("xroce: {problem}");
            }
            config
        })
    }
}

/// `XROCE_LOG=off`.
pub(crate) fn quiet() -> bool {
    LibraryConfig::get().quiet
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> LibraryConfig {
        LibraryConfig::from_vars(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_offer_every_interface_over_af_xdp() {
        let c = config(&[]);
        assert!(c.netdevs.is_none());
        assert_eq!(c.device.driver, DriverKind::Xdp);
        assert!(c.problems.is_empty());
    }

    #[test]
    fn netdev_list_accepts_device_names_too() {
        let c = config(&[("XROCE_NETDEV", "veth0, xroce_eth1,")]);
        assert_eq!(c.netdevs.unwrap(), vec!["veth0", "eth1"]);
    }

    #[test]
    fn bad_values_are_reported_not_ignored() {
        let c = config(&[
            ("XROCE_DRIVER", "dpdk"),
            ("XROCE_PROGRESS", "spin"),
            ("XROCE_SHARDS", "0"),
        ]);
        assert_eq!(c.problems.len(), 3, "{:?}", c.problems);
        assert_eq!(c.device.driver, DriverKind::Xdp);
        assert_eq!(c.device.shards, 1);
    }

    #[test]
    fn driver_progress_and_pcap_are_taken() {
        let c = config(&[
            ("XROCE_DRIVER", "udp"),
            ("XROCE_PROGRESS", "busy-poll"),
            ("XROCE_PCAP", "/tmp/x-%p.pcap"),
        ]);
        assert_eq!(c.device.driver, DriverKind::Udp);
        assert_eq!(c.device.progress, ProgressMode::BusyPoll);
        let pcap = c.device.pcap.unwrap();
        assert!(!pcap.to_string_lossy().contains("%p"));
    }

    #[test]
    fn relay_is_a_driver() {
        assert_eq!(
            config(&[("XROCE_DRIVER", "relay")]).device.driver,
            DriverKind::Relay
        );
    }
}
