//! What every tool does before RDMA: pick the interface and GID, open the TCP connection.
//! Errors name the cause and what to do.

use std::net::{IpAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use xroce::netdev::{self, GidEntry, NetdevInfo};

/// Which end of the TCP connection this is. The client writes first in every exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Connects to the server; perftest's `servername` is set.
    Client,
    /// Listens and waits.
    Server,
}

/// The interface given with `-d`, or the first one that is up, not loopback, and has an
/// IPv4 address.
pub fn pick_device(name: Option<&str>) -> anyhow::Result<NetdevInfo> {
    if let Some(typed) = name {
        let name = interface_name(typed);
        let info = netdev::query(&name).map_err(|e| {
            let known = netdev::list().unwrap_or_default().join(", ");
            anyhow::anyhow!("-d {typed}: {e}; interfaces here: {known}")
        })?;
        if !info.is_active() {
            anyhow::bail!("{}", not_active_reason(&info));
        }
        return Ok(info);
    }
    let names = netdev::list()?;
    for name in &names {
        if name == "lo" {
            continue;
        }
        if let Ok(info) = netdev::query(name) {
            if info.is_active() && info.first_ipv4().is_some() {
                return Ok(info);
            }
        }
    }
    anyhow::bail!(
        "no usable interface found (need one that is up with an IPv4 address; have: {}); pick one with -d IFACE",
        names.join(", ")
    )
}

/// An error and its causes on one line, each cause once: many messages already include
/// their source's text, and anyhow's `{:#}` would print it a second time.
pub fn error_text(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// The interface behind a `-d` value: the interface name itself, or the device name
/// `xroce_<iface>` that `xroce devinfo` prints (as `ibv_devinfo` prints `rxe0`). A real
/// interface called `xroce_...` wins.
pub fn interface_name(typed: &str) -> String {
    match typed.strip_prefix("xroce_") {
        Some(iface) if !iface.is_empty() && netdev::query(typed).is_err() => iface.to_string(),
        _ => typed.to_string(),
    }
}

/// Why an interface cannot carry traffic, in the user's terms: administratively down, or
/// up without a carrier (no cable, or a veth whose peer is down), which `ip link set up`
/// does not fix.
pub fn not_active_reason(info: &NetdevInfo) -> String {
    let name = &info.name;
    if !info.admin_up {
        format!("interface {name} is down: run `ip link set {name} up` (and give it an address)")
    } else {
        format!(
            "interface {name} is up but has no carrier (operstate {}): nothing is connected to it; plug in the cable, or for a veth bring its peer up (`ip link set <peer> up`)",
            format!("{:?}", info.oper_state).to_uppercase()
        )
    }
}

/// The GID at `index` (`-g`/`-x`), or when none is given the first IPv4-mapped GID (RoCE
/// needs a GID; rdma-core's tools would send an all-zero one).
pub fn pick_gid(dev: &NetdevInfo, index: Option<u32>, flag: &str) -> anyhow::Result<GidEntry> {
    let table = dev.gid_table();
    match index {
        Some(i) => table.iter().copied().find(|e| e.index == i).ok_or_else(|| {
            let ipv4 = table.iter().find(|e| e.gid.is_ipv4()).map(|e| e.index);
            anyhow::anyhow!(
                "no GID at index {i} on {}: this interface has {} GID{}; try {flag} {}",
                dev.name,
                table.len(),
                if table.len() == 1 { "" } else { "s" },
                ipv4.unwrap_or(0)
            )
        }),
        None => table.iter().copied().find(|e| e.gid.is_ipv4()).ok_or_else(|| {
            anyhow::anyhow!(
                "{} has no IPv4 address, so no IPv4 GID: add one (ip addr add ... dev {}) or choose an IPv6 GID with {flag}",
                dev.name,
                dev.name
            )
        }),
    }
}

/// Path MTU for `requested` bytes (`-m`), checked against what the link carries.
pub fn pick_mtu(dev: &NetdevInfo, requested: Option<u32>) -> anyhow::Result<u32> {
    let active = dev.active_mtu().ok_or_else(|| {
        anyhow::anyhow!(
            "{} has MTU {}, too small for RoCE (needs at least 336): raise it with ip link set {} mtu 1500",
            dev.name,
            dev.mtu,
            dev.name
        )
    })?;
    match requested {
        None => Ok(active.bytes()),
        Some(m) => {
            if xroce::engine::Mtu::from_bytes(m).is_none() {
                anyhow::bail!("-m {m}: path MTU must be 256, 512, 1024, 2048 or 4096");
            }
            if m > active.bytes() {
                anyhow::bail!(
                    "-m {m} does not fit the link MTU {} of {} (RoCE needs 80 bytes of headers): use -m {} or raise the link MTU",
                    dev.mtu,
                    dev.name,
                    active.bytes()
                );
            }
            Ok(m)
        }
    }
}

/// Waits for one client on `port` (all addresses), as the C tools' servers do.
pub fn accept_one(port: u16) -> anyhow::Result<TcpStream> {
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| anyhow::anyhow!("Couldn't listen to port {port}: {e} (is another server running? choose another with -p)"))?;
    let (stream, _) = listener
        .accept()
        .map_err(|e| anyhow::anyhow!("accept() failed: {e}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Connects to `host:port`, retrying refused connections for up to `patience` (the server
/// may still be starting).
pub fn connect(host: &str, port: u16, patience: Duration) -> anyhow::Result<TcpStream> {
    let addrs: Vec<_> = (host, port)
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("cannot resolve {host}: {e}"))?
        .collect();
    let start = Instant::now();
    loop {
        let mut last_err = None;
        for addr in &addrs {
            match TcpStream::connect_timeout(addr, Duration::from_secs(5)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(s);
                }
                Err(e) => last_err = Some(e),
            }
        }
        if start.elapsed() >= patience {
            let e = last_err.map(|e| e.to_string()).unwrap_or_default();
            anyhow::bail!("Couldn't connect to {host}:{port}: {e} (start the server side first, and check -p)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A random 24-bit PSN (`lrand48() & 0xffffff`).
pub fn random_psn() -> u32 {
    rand::random::<u32>() & 0xFF_FFFF
}

/// The local IP of a GID (for messages).
pub fn gid_ip(gid: &GidEntry) -> IpAddr {
    gid.gid.to_ip()
}

/// How long the set-up exchange over TCP (versions, addresses, up to the moment the QPs are
/// connected) may wait for the peer's next bytes. A peer that runs another tool, or a TCP
/// client that says nothing, is then an error instead of a hang.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

/// The out-of-band stream of a tool: a byte stream whose reads can be bounded in time and
/// made non-blocking (TCP in the tools, a Unix socket pair or a replay in tests).
pub trait OobStream: std::io::Read + std::io::Write {
    /// Bounds every later read to `limit` (`None`: block); a read that times out fails with
    /// `WouldBlock` or `TimedOut`.
    fn bound_reads(&mut self, limit: Option<Duration>) -> std::io::Result<()>;
    /// Switches reads between non-blocking (`true`) and blocking.
    fn nonblocking_reads(&mut self, on: bool) -> std::io::Result<()>;
}

impl OobStream for TcpStream {
    fn bound_reads(&mut self, limit: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(limit)
    }
    fn nonblocking_reads(&mut self, on: bool) -> std::io::Result<()> {
        self.set_nonblocking(on)
    }
}

impl OobStream for std::os::unix::net::UnixStream {
    fn bound_reads(&mut self, limit: Option<Duration>) -> std::io::Result<()> {
        self.set_read_timeout(limit)
    }
    fn nonblocking_reads(&mut self, on: bool) -> std::io::Result<()> {
        self.set_nonblocking(on)
    }
}

/// True for the errors a bounded read fails with when the bound passed.
pub fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Reads exactly `buf.len()` bytes; on failure returns how many arrived (so an error can
/// show the peer's bytes) with the error (`UnexpectedEof` when the peer closed).
pub fn read_full<S: std::io::Read>(
    stream: &mut S,
    buf: &mut [u8],
) -> Result<(), (usize, std::io::Error)> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err((
                    filled,
                    std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("end of stream after {filled} of {} bytes", buf.len()),
                    ),
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err((filled, e)),
        }
    }
    Ok(())
}

/// Which tool a peer runs, as far as its first bytes on the TCP connection show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerTool {
    /// perftest (or `xroce perf`): its 16-byte version string, e.g. "6.06".
    Perftest {
        /// The version it announced.
        version: String,
    },
    /// perftest with `--dont_xchg_versions`: it starts with a QP address
    /// `LID:OUT_READS:QPN:PSN:...` (4:4:6:6 hex digits).
    PerftestWithoutVersions,
    /// `ibv_rc_pingpong`/`ibv_ud_pingpong` (or `xroce pingpong`): `LID:QPN:PSN:GID`
    /// (4:6:6:32 hex digits).
    Pingpong,
    /// `xroce file` or `xroce mr-check`: one JSON object per line.
    JsonLines,
}

impl PeerTool {
    /// What the peer looks like, in the user's terms.
    pub fn describe(&self) -> String {
        match self {
            PeerTool::Perftest { version } => {
                format!("perftest or xroce perf (it sent the perftest version string {version:?})")
            }
            PeerTool::PerftestWithoutVersions => {
                "perftest or xroce perf with --dont_xchg_versions (it sent a perftest QP address without a version first)".into()
            }
            PeerTool::Pingpong => {
                "ibv_rc_pingpong/ibv_ud_pingpong or xroce pingpong (it sent the LID:QPN:PSN:GID address line)".into()
            }
            PeerTool::JsonLines => {
                "xroce file or xroce mr-check (it sent a JSON line)".into()
            }
        }
    }
}

/// Guesses the peer's tool from the bytes it sent first (any prefix of its first message;
/// at least 12 bytes are needed to tell the address formats apart).
pub fn identify_peer(bytes: &[u8]) -> Option<PeerTool> {
    let first = bytes.iter().position(|&b| !b.is_ascii_whitespace())?;
    let bytes = &bytes[first..];
    if bytes[0] == b'{' {
        return Some(PeerTool::JsonLines);
    }
    // `field widths` of hex digits separated by ':'; true if `bytes` is a prefix of that
    // shape at least 12 bytes long.
    let shaped = |widths: &[usize]| -> bool {
        let mut pos = 0;
        for &w in widths {
            for _ in 0..w {
                match bytes.get(pos) {
                    None => return pos >= 12,
                    Some(b) if b.is_ascii_hexdigit() => pos += 1,
                    Some(_) => return false,
                }
            }
            match bytes.get(pos) {
                None => return pos >= 12,
                Some(b':') => pos += 1,
                Some(_) => return false,
            }
        }
        true
    };
    if shaped(&[4, 6, 6]) {
        return Some(PeerTool::Pingpong);
    }
    if shaped(&[4, 4, 6, 6]) {
        return Some(PeerTool::PerftestWithoutVersions);
    }
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let text = &bytes[..end];
    let version_like = !text.is_empty()
        && text[0].is_ascii_digit()
        && text.len() < 16
        && text
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
        && bytes[end..].iter().all(|&b| b == 0);
    if version_like {
        return Some(PeerTool::Perftest {
            version: String::from_utf8_lossy(text).into_owned(),
        });
    }
    None
}

/// `" (the peer looks like ...)"` for an error message, or nothing when the bytes say
/// nothing.
pub fn peer_hint(bytes: &[u8]) -> String {
    match identify_peer(bytes) {
        Some(tool) => format!("; the peer looks like {}", tool.describe()),
        None if bytes.is_empty() => String::new(),
        None => format!(
            "; its bytes {:?} match no tool xroce knows",
            String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xroce::netdev::OperState;

    #[test]
    fn device_name_from_devinfo_is_accepted() {
        // `xroce devinfo` calls the device on lo "xroce_lo"; -d takes either name.
        assert_eq!(interface_name("xroce_lo"), "lo");
        assert_eq!(interface_name("lo"), "lo");
        assert_eq!(interface_name("xroce_"), "xroce_");
        assert_eq!(pick_device(Some("xroce_lo")).unwrap().name, "lo");
        let err = pick_device(Some("xroce_nosuchif0"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("-d xroce_nosuchif0: "), "{err}");
    }

    #[test]
    fn down_and_no_carrier_are_told_apart() {
        let mut info = netdev::query("lo").unwrap();
        info.name = "veth7".into();
        info.admin_up = false;
        info.oper_state = OperState::Down;
        let down = not_active_reason(&info);
        assert!(
            down.contains("veth7 is down: run `ip link set veth7 up`"),
            "{down}"
        );
        info.admin_up = true;
        let no_carrier = not_active_reason(&info);
        assert!(
            no_carrier.contains("veth7 is up but has no carrier (operstate DOWN)")
                && no_carrier.contains("bring its peer up"),
            "{no_carrier}"
        );
        assert!(!no_carrier.contains("not up"), "{no_carrier}");
    }

    #[test]
    fn peers_are_told_apart_by_their_first_bytes() {
        // A 16-byte read (the perftest version slot) of each tool's first message.
        assert_eq!(identify_peer(b"0000:000011:2fa5"), Some(PeerTool::Pingpong));
        assert_eq!(
            identify_peer(b"0000:0001:000013"),
            Some(PeerTool::PerftestWithoutVersions)
        );
        assert_eq!(
            identify_peer(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0"),
            Some(PeerTool::Perftest {
                version: "6.06".into()
            })
        );
        assert_eq!(
            identify_peer(b"{\"qpn\":17,\"psn\":1"),
            Some(PeerTool::JsonLines)
        );
        // Whole messages too.
        assert_eq!(
            identify_peer(b"0000:000011:2fa524:00000000000000000000ffffc612000c\0"),
            Some(PeerTool::Pingpong)
        );
        assert_eq!(identify_peer(b""), None);
        assert_eq!(identify_peer(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(identify_peer(b"0000:00"), None, "too short to tell");
    }
}
