//! Network namespaces and veth pairs for tests and for `xroce demo`, cleaned up by Drop guards.
//!
//! Everything is done with iproute2's `ip` command. Names are unique per process (they carry
//! the pid and a counter), so tests may run in parallel; a [`Netns`] deletes its namespace when
//! dropped, also while a failing test unwinds, and creating one first sweeps away namespaces
//! left behind by xroce processes that died (a `kill -9` skips Drop guards): their names
//! carry the creating process's id.
//!
//! Only addresses in 198.18.0.0/15 (RFC 2544 benchmarking) and 2001:2::/48 (RFC 5180) are
//! handed out, so no test traffic can ever leave the machine for a real network.
//!
//! Processes run inside a namespace through `ip netns exec` ([`Netns::command`]): `setns`
//! would switch only the calling thread, which is easy to get wrong in a multi-threaded test.
//!
//! ```no_run
//! # fn main() -> Result<(), xroce::netns::NetnsError> {
//! let link = xroce::netns::VethLink::create(&xroce::netns::LinkConfig::default())?;
//! let out = link.a.command("ping").args(["-c1", &link.b_ip.to_string()]).output().unwrap();
//! assert!(out.status.success());
//! # Ok(()) }
//! // dropping `link` deletes both namespaces and with them the veth pair
//! ```

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::netdev::MacAddr;

/// Prefix of every namespace this module creates (used to find stale ones).
pub const NETNS_PREFIX: &str = "xroce-";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Why a namespace operation failed.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// Creating namespaces and links needs CAP_SYS_ADMIN and CAP_NET_ADMIN.
    #[error(
        "creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); run as \
         root, e.g. with sudo"
    )]
    NotRoot,
    /// iproute2's `ip` is not installed.
    #[error("the `ip` command (iproute2) was not found; install it: apt-get install iproute2")]
    IpMissing,
    /// An `ip` command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// An address outside the ranges this module may use.
    #[error(
        "address {addr} is outside 198.18.0.0/15 and 2001:2::/48; tests must not use real networks"
    )]
    AddressNotAllowed {
        /// The address.
        addr: String,
    },
    /// A configuration value is out of range.
    #[error("invalid link configuration: {0}")]
    Config(String),
    /// Spawning a process failed.
    #[error("running {command}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Whether the process has the capabilities to create namespaces and attach XDP programs
/// (CAP_SYS_ADMIN and CAP_NET_ADMIN in its effective set).
pub fn is_privileged() -> bool {
    let status = match std::fs::read_to_string("/proc/self/status") {
        Ok(s) => s,
        Err(_) => return false,
    };
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_NET_ADMIN: u64 = 1 << 12;
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    cap_eff & (CAP_NET_ADMIN | CAP_SYS_ADMIN) == CAP_NET_ADMIN | CAP_SYS_ADMIN
}

/// What a test that needs root should do when it is not root: `Ok(false)` means "skip"
/// (after printing `SKIPPED: <test>: ...` on stderr), and under `XROCE_CI=1` it is an error
/// instead, because CI must run every test.
pub fn require_privileges(test: &str) -> Result<bool, String> {
    if is_privileged() {
        return Ok(true);
    }
    if std::env::var("XROCE_CI").map(|v| v == "1").unwrap_or(false) {
        return Err(format!(
            "{test}: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and XROCE_CI=1 forbids skipping"
        ));
    }
    // Written to the stderr handle directly: the test harness captures `eprintln!` of
    // passing tests, and a skip must be visible.
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {test}: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    );
    Ok(false)
}

/// A name unique to this process and call: `<prefix><pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}-{n}", std::process::id())
}

/// A short interface name (at most 15 bytes) unique to this process and call, ending in `tag`.
pub fn unique_ifname(tag: char) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // pid fits 22 bits, so 6 hex digits; "xr" + 6 + "x" + counter (up to 5) + tag <= 15.
    format!("xr{:x}x{:x}{tag}", std::process::id(), n & 0xfffff)
}

fn check_v4(addr: Ipv4Addr) -> Result<(), NetnsError> {
    let o = addr.octets();
    if o[0] == 198 && (o[1] == 18 || o[1] == 19) {
        Ok(())
    } else {
        Err(NetnsError::AddressNotAllowed {
            addr: addr.to_string(),
        })
    }
}

fn check_v6(addr: Ipv6Addr) -> Result<(), NetnsError> {
    let s = addr.segments();
    if s[0] == 0x2001 && s[1] == 0x0002 && s[2] == 0 {
        Ok(())
    } else {
        Err(NetnsError::AddressNotAllowed {
            addr: addr.to_string(),
        })
    }
}

/// Run `ip` with the given arguments; fail with its stderr if it fails.
pub fn ip(args: &[&str]) -> Result<Output, NetnsError> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                NetnsError::IpMissing
            } else {
                NetnsError::Spawn {
                    command: "ip".into(),
                    source: e,
                }
            }
        })?;
    if out.status.success() {
        Ok(out)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if stderr.contains("Operation not permitted") {
            return Err(NetnsError::NotRoot);
        }
        Err(NetnsError::CommandFailed {
            command: format!("ip {}", args.join(" ")),
            status: out.status.to_string(),
            stderr,
        })
    }
}

/// The pid in a namespace name `xroce-<tag>-p<pid>-<n>` made by [`Netns::create`].
pub fn creator_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NETNS_PREFIX)?;
    let mut parts = rest.rsplitn(3, '-');
    let (_n, pid_part) = (parts.next()?.parse::<u32>().ok()?, parts.next()?);
    parts.next()?; // the tag must be there too
    pid_part.strip_prefix('p')?.parse().ok()
}

/// Delete namespaces named `xroce-<tag>-p<pid>-<n>` whose process no longer exists.
pub fn sweep_stale() {
    let Ok(out) = ip(&["netns", "list"]) else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(pid) = creator_pid(name) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "delete", name]);
        }
    }
}

/// `ip netns add <name>`, tried again briefly when it fails: it sets up /run/netns on first
/// use, and concurrent first uses can race; a name that looks stale (its pid is gone) can
/// also be swept by another creator between the file's creation and its bind mount.
/// The namespace is not deleted on drop: that is [`Netns`]'s job.
pub fn add_named(name: &str) -> Result<(), NetnsError> {
    let mut attempt = 0;
    while let Err(e) = ip(&["netns", "add", name]) {
        attempt += 1;
        if attempt >= 5 || matches!(e, NetnsError::NotRoot | NetnsError::IpMissing) {
            return Err(e);
        }
        let _ = ip(&["netns", "delete", name]);
        std::thread::sleep(std::time::Duration::from_millis(20 * attempt));
    }
    Ok(())
}

/// A network namespace that is deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Create a namespace named `xroce-<tag>-p<pid>-<n>` with its loopback interface up.
    pub fn create(tag: &str) -> Result<Self, NetnsError> {
        if !is_privileged() {
            return Err(NetnsError::NotRoot);
        }
        sweep_stale();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NETNS_PREFIX}{tag}-p{}-{n}", std::process::id());
        add_named(&name)?;
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (as `ip netns` knows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Run `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<Output, NetnsError> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A `Command` that runs `program` inside this namespace (via `ip netns exec`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Sets a kernel setting inside this namespace (`sysctl -w`, e.g.
    /// `net.ipv6.conf.<if>.dad_transmits=60`); fails with its stderr if it fails.
    pub fn sysctl(&self, setting: &str) -> Result<(), NetnsError> {
        let command = format!("sysctl -w {setting}");
        let out = self
            .command("sysctl")
            .args(["-qw", setting])
            .stdin(Stdio::null())
            .output()
            .map_err(|source| NetnsError::Spawn {
                command: command.clone(),
                source,
            })?;
        if out.status.success() {
            return Ok(());
        }
        Err(NetnsError::CommandFailed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }

    /// Spawn `cmd` (built with [`Netns::command`]); the child is killed when the guard drops.
    pub fn spawn(&self, cmd: &mut Command) -> Result<ChildGuard, NetnsError> {
        let child = cmd.spawn().map_err(|e| NetnsError::Spawn {
            command: format!("{cmd:?}"),
            source: e,
        })?;
        Ok(ChildGuard { child: Some(child) })
    }

    /// The MAC address of an interface in this namespace.
    pub fn mac(&self, ifname: &str) -> Result<[u8; 6], NetnsError> {
        // `ip -o` prints one line per link: "... link/ether 02:00:00:00:00:01 brd ...".
        let out = self.ip(&["-o", "link", "show", "dev", ifname])?;
        let line = String::from_utf8_lossy(&out.stdout);
        let text = line
            .split_whitespace()
            .skip_while(|word| *word != "link/ether")
            .nth(1)
            .unwrap_or("");
        MacAddr::parse(text)
            .map(|mac| mac.0)
            .ok_or_else(|| NetnsError::Config(format!("no MAC address for {ifname}: {text:?}")))
    }

    /// Whether an XDP program is attached to `ifname` (as `ip link show` reports it).
    pub fn has_xdp(&self, ifname: &str) -> Result<bool, NetnsError> {
        let out = self.ip(&["-d", "link", "show", "dev", ifname])?;
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.contains("xdp") || text.contains("prog/xdp"))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the interfaces in it (a veth takes its peer along).
        if let Err(e) = ip(&["netns", "delete", &self.name]) {
            eprintln!("xroce netns: could not delete {}: {e}", self.name);
        }
    }
}

/// A child process that is killed and reaped when dropped.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
}

impl ChildGuard {
    /// The child process.
    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("present until drop")
    }

    /// Wait for the child to exit and collect its output (if piped).
    pub fn wait_with_output(mut self) -> std::io::Result<Output> {
        self.child
            .take()
            .expect("present until drop")
            .wait_with_output()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How to build a [`VethLink`].
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Link MTU of both veth ends.
    pub mtu: u32,
    /// IPv4 address of side A (prefix /24); must be in 198.18.0.0/15.
    pub a_ip: Ipv4Addr,
    /// IPv4 address of side B.
    pub b_ip: Ipv4Addr,
    /// Also give both sides IPv6 addresses in 2001:2::/64 (`::1` and `::2`).
    pub ipv6: bool,
    /// Number of receive/transmit queues of each veth end (1 unless testing multi-queue).
    pub queues: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            mtu: 1500,
            a_ip: Ipv4Addr::new(198, 18, 0, 1),
            b_ip: Ipv4Addr::new(198, 18, 0, 2),
            ipv6: true,
            queues: 1,
        }
    }
}

/// Two namespaces `a` and `b` joined by a veth pair, addressed and up. Dropping it removes
/// both namespaces and the pair.
#[derive(Debug)]
pub struct VethLink {
    /// Side A's namespace.
    pub a: Netns,
    /// Side B's namespace.
    pub b: Netns,
    /// The veth end in `a`.
    pub a_if: String,
    /// The veth end in `b`.
    pub b_if: String,
    /// A's IPv4 address.
    pub a_ip: Ipv4Addr,
    /// B's IPv4 address.
    pub b_ip: Ipv4Addr,
    /// A's IPv6 address, if configured.
    pub a_ip6: Option<Ipv6Addr>,
    /// B's IPv6 address, if configured.
    pub b_ip6: Option<Ipv6Addr>,
    /// A's MAC.
    pub a_mac: [u8; 6],
    /// B's MAC.
    pub b_mac: [u8; 6],
    /// The link MTU.
    pub mtu: u32,
}

impl Drop for VethLink {
    fn drop(&mut self) {
        // xroce's library makes /dev/infiniband/xroce_<ifname> for each device it offers (UCX
        // looks for it); these interfaces go with the namespaces, so their nodes go too.
        for ifname in [&self.a_if, &self.b_if] {
            let node = std::path::Path::new("/dev/infiniband").join(format!("xroce_{ifname}"));
            let is_node = std::fs::symlink_metadata(&node).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_char_device()
            });
            if is_node {
                let _ = std::fs::remove_file(&node);
            }
        }
    }
}

impl VethLink {
    /// Create both namespaces and the veth pair, set MTU, addresses, and bring everything up.
    pub fn create(cfg: &LinkConfig) -> Result<Self, NetnsError> {
        check_v4(cfg.a_ip)?;
        check_v4(cfg.b_ip)?;
        if !(68..=65535).contains(&cfg.mtu) {
            return Err(NetnsError::Config(format!("MTU {} out of range", cfg.mtu)));
        }
        if !(1..=64).contains(&cfg.queues) {
            return Err(NetnsError::Config(format!(
                "{} queues out of 1..=64",
                cfg.queues
            )));
        }
        let a = Netns::create("a")?;
        let b = Netns::create("b")?;
        let a_if = unique_ifname('a');
        let b_if = unique_ifname('b');
        let mtu = cfg.mtu.to_string();
        let queues = cfg.queues.to_string();
        a.ip(&[
            "link",
            "add",
            &a_if,
            "numtxqueues",
            &queues,
            "numrxqueues",
            &queues,
            "mtu",
            &mtu,
            "type",
            "veth",
            "peer",
            "name",
            &b_if,
            "netns",
            b.name(),
            "numtxqueues",
            &queues,
            "numrxqueues",
            &queues,
            "mtu",
            &mtu,
        ])?;
        let (a_ip6, b_ip6) = if cfg.ipv6 {
            let a6: Ipv6Addr = "2001:2::1".parse().expect("valid literal");
            let b6: Ipv6Addr = "2001:2::2".parse().expect("valid literal");
            check_v6(a6)?;
            check_v6(b6)?;
            (Some(a6), Some(b6))
        } else {
            (None, None)
        };
        for (ns, ifname, v4, v6) in [(&a, &a_if, cfg.a_ip, a_ip6), (&b, &b_if, cfg.b_ip, b_ip6)] {
            ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", ifname])?;
            if let Some(v6) = v6 {
                ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", ifname, "nodad"])?;
            }
            ns.ip(&["link", "set", "dev", ifname, "up"])?;
        }
        let a_mac = a.mac(&a_if)?;
        let b_mac = b.mac(&b_if)?;
        Ok(VethLink {
            a,
            b,
            a_if,
            b_if,
            a_ip: cfg.a_ip,
            b_ip: cfg.b_ip,
            a_ip6,
            b_ip6,
            a_mac,
            b_mac,
            mtu: cfg.mtu,
        })
    }

    /// Add permanent neighbour entries on both sides, so no ARP/ND is needed.
    pub fn add_static_neighbours(&self) -> Result<(), NetnsError> {
        let fmt_mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        for (ns, ifname, peer_ip, peer_ip6, peer_mac) in [
            (&self.a, &self.a_if, self.b_ip, self.b_ip6, self.b_mac),
            (&self.b, &self.b_if, self.a_ip, self.a_ip6, self.a_mac),
        ] {
            let mac = fmt_mac(peer_mac);
            ns.ip(&[
                "neigh",
                "replace",
                &peer_ip.to_string(),
                "lladdr",
                &mac,
                "dev",
                ifname,
                "nud",
                "permanent",
            ])?;
            if let Some(v6) = peer_ip6 {
                ns.ip(&[
                    "neigh",
                    "replace",
                    &v6.to_string(),
                    "lladdr",
                    &mac,
                    "dev",
                    ifname,
                    "nud",
                    "permanent",
                ])?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_short() {
        let a = unique_ifname('a');
        let b = unique_ifname('a');
        assert_ne!(a, b);
        assert!(a.len() <= 15, "{a}");
        assert!(unique_name("xroce-t").starts_with(&format!("xroce-t{}-", std::process::id())));
    }

    #[test]
    fn only_benchmark_ranges_are_allowed() {
        assert!(check_v4(Ipv4Addr::new(198, 18, 3, 4)).is_ok());
        assert!(check_v4(Ipv4Addr::new(198, 19, 255, 1)).is_ok());
        assert!(check_v4(Ipv4Addr::new(198, 20, 0, 1)).is_err());
        assert!(check_v4(Ipv4Addr::new(10, 0, 0, 1)).is_err());
        assert!(check_v6("2001:2::5".parse().unwrap()).is_ok());
        assert!(check_v6("fd00::1".parse().unwrap()).is_err());
        let cfg = LinkConfig {
            a_ip: Ipv4Addr::new(192, 168, 1, 1),
            ..LinkConfig::default()
        };
        assert!(matches!(
            VethLink::create(&cfg),
            Err(NetnsError::AddressNotAllowed { .. })
        ));
    }

    #[test]
    fn stale_namespace_names_yield_their_pid() {
        assert_eq!(creator_pid("xroce-a-p1234-0"), Some(1234));
        assert_eq!(creator_pid("xroce-node1-p99-12"), Some(99));
        assert_eq!(creator_pid("xroce-with-dash-p7-3"), Some(7));
        assert_eq!(creator_pid("xroce-p7-3"), None, "no tag");
        assert_eq!(creator_pid("rxelab"), None);
        assert_eq!(creator_pid("xroce-a-1234-0"), None);
        assert_eq!(creator_pid("xroce-a-px-0"), None);
    }
}
