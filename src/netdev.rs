//! Facts about a network interface that a RoCE device is built on, read from the kernel.
//!
//! An xroce device is an ordinary Ethernet interface. Everything RDMA needs to know about it
//! comes from here, without the engine:
//! - identity: interface index, MAC address, link MTU, operational state, driver;
//! - the **GID table**, derived from the interface's IP addresses the way Linux soft-RoCE
//!   (rxe) and RoCE HCAs do it: index 0 is the IPv6 link-local address, then each IPv4 address
//!   as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), then the other IPv6 addresses. Every
//!   entry is a RoCE v2 GID (RoCE v2 runs over UDP/IP, so the GID *is* an IP address);
//! - the **path MTU** rule: the largest InfiniBand MTU (256, 512, 1024, 2048 or 4096 bytes of
//!   payload) that fits in the link MTU minus 80 bytes of headers (rxe's rule: a 1500-byte
//!   link gives 1024, a 9000-byte link gives 4096);
//! - the **neighbour** (ARP/ND) entry of a peer: RoCE v2 frames are built in user space, so
//!   the destination MAC must come from the kernel's neighbour table; when it is missing a
//!   UDP probe makes the kernel resolve it.
//!
//! The facts come from iproute2's JSON output (`ip -j`), which works identically inside a
//! network namespace entered with `ip netns exec`, and needs no privileges.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What went wrong while asking the kernel about an interface or a neighbour.
#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    /// The interface does not exist in this network namespace.
    #[error("network interface {0:?} not found (list interfaces with `ip link`)")]
    NoSuchInterface(String),
    /// The interface name cannot be a Linux interface name.
    #[error("invalid interface name {0:?}: 1 to 15 characters, no '/', no whitespace")]
    InvalidName(String),
    /// The `ip` command (iproute2) could not be run.
    #[error("could not run `ip` (install iproute2: scripts/setup.sh): {0}")]
    IpCommand(#[source] std::io::Error),
    /// `ip` ran but failed or printed something unexpected.
    #[error("`ip {args}` failed: {message}")]
    IpFailed {
        /// The arguments given to `ip`.
        args: String,
        /// Its error output, or what could not be parsed.
        message: String,
    },
    /// No neighbour entry appeared within the timeout.
    #[error(
        "no ARP/ND answer from {ip} on {ifname} within {timeout:?}: is the peer up, on this \
         link, and configured with that address?"
    )]
    NeighbourTimeout {
        /// The interface the peer was looked for on.
        ifname: String,
        /// The peer's address.
        ip: IpAddr,
        /// How long resolution was tried.
        timeout: Duration,
    },
    /// The kernel marked the neighbour as unreachable (`FAILED`) and retries gave nothing.
    #[error("neighbour {ip} on {ifname} is unreachable (kernel neighbour state FAILED)")]
    NeighbourFailed {
        /// The interface the peer was looked for on.
        ifname: String,
        /// The peer's address.
        ip: IpAddr,
    },
    /// The UDP probe that triggers resolution could not be sent.
    #[error("could not send the neighbour-resolution probe to {ip}: {source}")]
    Probe {
        /// The peer's address.
        ip: IpAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
}

/// An Ethernet MAC address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Parses `aa:bb:cc:dd:ee:ff` (case-insensitive).
    pub fn parse(text: &str) -> Option<MacAddr> {
        let mut out = [0u8; 6];
        let mut parts = text.split(':');
        for byte in out.iter_mut() {
            let part = parts.next()?;
            if part.is_empty() || part.len() > 2 {
                return None;
            }
            *byte = u8::from_str_radix(part, 16).ok()?;
        }
        if parts.next().is_some() {
            return None;
        }
        Some(MacAddr(out))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A 128-bit Global Identifier. On RoCE v2 it is an IPv6 address, IPv4 addresses being
/// IPv4-mapped (`::ffff:a.b.c.d`), IBTA Annex A17.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID of an IP address (IPv4 is mapped into `::ffff:0:0/96`).
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address this GID stands for: IPv4 when it is IPv4-mapped, else IPv6.
    pub fn to_ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True for an IPv4-mapped GID (its packets use an IPv4 header).
    pub fn is_ipv4(&self) -> bool {
        self.0[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]
    }

    /// The 32 lowercase hex digits of the raw bytes (the form ibv_rc_pingpong exchanges).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hex digits (optionally with ':' separators between groups).
    pub fn from_hex(text: &str) -> Option<Gid> {
        let digits: String = text.chars().filter(|c| *c != ':').collect();
        if digits.len() != 32 || !digits.is_ascii() {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Gid(out))
    }
}

impl fmt::Display for Gid {
    /// The IPv6 presentation (`::ffff:198.18.0.1`, `fe80::1`), as `ibv_devinfo -v` shows it
    /// with the raw groups; we print the address form, which is what a reader recognises.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({})", Ipv6Addr::from(self.0))
    }
}

/// The type of a GID table entry, as `ibv_query_gid_type` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// RoCE v2: frames are Ethernet / IP / UDP 4791 / BTH. The only type xroce speaks.
    RoceV2,
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::RoceV2 => f.write_str("RoCE v2"),
        }
    }
}

/// One entry of a port's GID table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Position in the table (what `-g`/`-x` of the rdma-core tools select).
    pub index: u32,
    /// The GID itself.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
}

/// An InfiniBand path MTU: the largest payload of one packet (headers excluded).
/// The discriminants are the `ibv_mtu` enum values exchanged by perftest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IbMtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

/// Bytes of headers a RoCE v2 packet may add on top of its payload, subtracted from the link
/// MTU before choosing the IB MTU (rxe: `eth_mtu_int(mtu - 80)`... 20 IPv4 or 40 IPv6 + 8 UDP +
/// 12 BTH + up to 28 of extension headers + 4 ICRC, rounded up).
pub const ROCE_HEADER_ALLOWANCE: u32 = 80;

impl IbMtu {
    /// All values, smallest first.
    pub const ALL: [IbMtu; 5] = [
        IbMtu::Mtu256,
        IbMtu::Mtu512,
        IbMtu::Mtu1024,
        IbMtu::Mtu2048,
        IbMtu::Mtu4096,
    ];

    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        256 << (self as u32 - 1)
    }

    /// The MTU of exactly this many bytes, if it is one of 256..4096.
    pub fn from_bytes(bytes: u32) -> Option<IbMtu> {
        IbMtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }

    /// The `ibv_mtu` enum value (1..5).
    pub fn from_enum(value: u32) -> Option<IbMtu> {
        IbMtu::ALL.into_iter().find(|m| *m as u32 == value)
    }

    /// The largest IB MTU whose packets fit a link of `link_mtu` bytes (IP MTU), or `None`
    /// when even 256 does not fit.
    pub fn for_link_mtu(link_mtu: u32) -> Option<IbMtu> {
        let room = link_mtu.checked_sub(ROCE_HEADER_ALLOWANCE)?;
        IbMtu::ALL.into_iter().rev().find(|m| m.bytes() <= room)
    }
}

impl fmt::Display for IbMtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// The operational state of an interface (RFC 2863, as `ip link` shows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperState {
    /// Up and able to pass packets.
    Up,
    /// Down.
    Down,
    /// Down because a lower layer is (e.g. the other end of a veth is down).
    LowerLayerDown,
    /// Waiting for an external event.
    Dormant,
    /// In a test mode.
    Testing,
    /// Not present (a missing component).
    NotPresent,
    /// The driver does not report a state (loopback, some virtual devices). Treated as up
    /// when the interface is administratively up.
    Unknown,
}

impl OperState {
    fn parse(text: &str) -> OperState {
        match text {
            "UP" => OperState::Up,
            "DOWN" => OperState::Down,
            "LOWERLAYERDOWN" => OperState::LowerLayerDown,
            "DORMANT" => OperState::Dormant,
            "TESTING" => OperState::Testing,
            "NOTPRESENT" => OperState::NotPresent,
            _ => OperState::Unknown,
        }
    }
}

/// An IP address configured on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// The address.
    pub ip: IpAddr,
    /// Prefix length of its subnet.
    pub prefix_len: u8,
}

/// The XDP program attached to an interface, as the kernel reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpAttachment {
    /// "generic" (skb mode), "native" (driver mode), "offload" or "multi".
    pub mode: String,
    /// BPF program id(s).
    pub prog_ids: Vec<u64>,
}

/// Everything xroce reads about one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetdevInfo {
    /// Interface name.
    pub name: String,
    /// Kernel interface index.
    pub ifindex: u32,
    /// Hardware address (all zero on loopback).
    pub mac: MacAddr,
    /// Link (IP) MTU.
    pub mtu: u32,
    /// Largest MTU the device accepts, when the kernel says.
    pub max_mtu: Option<u32>,
    /// Operational state.
    pub oper_state: OperState,
    /// Administratively up (`ip link set up`).
    pub admin_up: bool,
    /// Link layer as `ip` names it: "ether", "loopback", ...
    pub link_type: String,
    /// Kernel driver or link kind ("virtio_net", "veth", ...), when known.
    pub driver: Option<String>,
    /// Number of receive queues (AF_XDP binds one socket per queue).
    pub num_rx_queues: Option<u32>,
    /// IP addresses, in the kernel's order.
    pub addrs: Vec<IfAddr>,
    /// The XDP program attached right now, if any.
    pub xdp: Option<XdpAttachment>,
}

impl NetdevInfo {
    /// True when frames can flow: operationally up, or administratively up with an unknown
    /// operational state (loopback reports UNKNOWN).
    pub fn is_active(&self) -> bool {
        match self.oper_state {
            OperState::Up => true,
            OperState::Unknown => self.admin_up,
            _ => false,
        }
    }

    /// The GID table: index 0 the IPv6 link-local address (a zero-prefix `fe80::` GID derived
    /// from the MAC when the interface has none, as rxe does), then IPv4-mapped IPv4
    /// addresses, then the other IPv6 addresses. All RoCE v2.
    pub fn gid_table(&self) -> Vec<GidEntry> {
        gid_table_from(&self.addrs, self.mac)
    }

    /// The path MTU the port reports as active: the largest IB MTU that fits the link.
    pub fn active_mtu(&self) -> Option<IbMtu> {
        IbMtu::for_link_mtu(self.mtu)
    }

    /// The largest IB MTU the port could use if the link MTU were raised to its maximum.
    pub fn max_ib_mtu(&self) -> Option<IbMtu> {
        IbMtu::for_link_mtu(self.max_mtu.unwrap_or(self.mtu).max(self.mtu))
    }

    /// The index of `ip`'s GID in the table.
    pub fn gid_index_of(&self, ip: IpAddr) -> Option<u32> {
        let gid = Gid::from_ip(ip);
        self.gid_table()
            .into_iter()
            .find(|e| e.gid == gid)
            .map(|e| e.index)
    }

    /// The first IPv4 address (what the demo and the UDP driver use).
    pub fn first_ipv4(&self) -> Option<Ipv4Addr> {
        self.addrs.iter().find_map(|a| match a.ip {
            IpAddr::V4(v4) => Some(v4),
            IpAddr::V6(_) => None,
        })
    }
}

/// The modified EUI-64 link-local address of a MAC (RFC 4291 appendix A).
fn link_local_from_mac(mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

fn is_link_local_v6(ip: &Ipv6Addr) -> bool {
    (ip.segments()[0] & 0xffc0) == 0xfe80
}

/// Orders addresses into a GID table (see [`NetdevInfo::gid_table`]).
pub fn gid_table_from(addrs: &[IfAddr], mac: MacAddr) -> Vec<GidEntry> {
    let link_local = addrs
        .iter()
        .find_map(|a| match a.ip {
            IpAddr::V6(v6) if is_link_local_v6(&v6) => Some(v6),
            _ => None,
        })
        .unwrap_or_else(|| link_local_from_mac(mac));
    let mut gids = vec![Gid::from_ip(IpAddr::V6(link_local))];
    gids.extend(
        addrs
            .iter()
            .filter(|a| a.ip.is_ipv4())
            .map(|a| Gid::from_ip(a.ip)),
    );
    gids.extend(addrs.iter().filter_map(|a| match a.ip {
        IpAddr::V6(v6) if !is_link_local_v6(&v6) => Some(Gid::from_ip(a.ip)),
        _ => None,
    }));
    gids.into_iter()
        .enumerate()
        .map(|(index, gid)| GidEntry {
            index: index as u32,
            gid,
            gid_type: GidType::RoceV2,
        })
        .collect()
}

fn check_ifname(name: &str) -> Result<(), NetdevError> {
    let ok = !name.is_empty()
        && name.len() < 16
        && !name.contains('/')
        && !name.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(NetdevError::InvalidName(name.to_string()))
    }
}

/// Runs `ip -j ARGS` and parses its JSON output.
fn ip_json(args: &[&str]) -> Result<Value, NetdevError> {
    let output = Command::new("ip")
        .arg("-j")
        .args(args)
        .output()
        .map_err(NetdevError::IpCommand)?;
    let joined = args.join(" ");
    if !output.status.success() {
        return Err(NetdevError::IpFailed {
            args: joined,
            message: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    if text.trim().is_empty() {
        // `ip -j neigh show` prints nothing (not "[]") when the table has no match.
        return Ok(Value::Array(Vec::new()));
    }
    serde_json::from_str(&text).map_err(|e| NetdevError::IpFailed {
        args: joined,
        message: format!("unparseable JSON: {e}"),
    })
}

/// Reads every fact xroce needs about interface `ifname`.
pub fn query(ifname: &str) -> Result<NetdevInfo, NetdevError> {
    check_ifname(ifname)?;
    let value = match ip_json(&["-d", "addr", "show", "dev", ifname]) {
        Ok(v) => v,
        Err(NetdevError::IpFailed { message, .. }) if message.contains("does not exist") => {
            return Err(NetdevError::NoSuchInterface(ifname.to_string()))
        }
        Err(e) => return Err(e),
    };
    let link = value
        .as_array()
        .and_then(|a| a.first())
        .ok_or_else(|| NetdevError::NoSuchInterface(ifname.to_string()))?;
    let mut info = parse_link(link).map_err(|message| NetdevError::IpFailed {
        args: format!("-d addr show dev {ifname}"),
        message,
    })?;
    if info.driver.is_none() {
        info.driver = driver_from_sysfs(ifname);
    }
    Ok(info)
}

/// Lists the interfaces of this namespace (names only).
pub fn list() -> Result<Vec<String>, NetdevError> {
    let value = ip_json(&["link", "show"])?;
    Ok(value
        .as_array()
        .map(|links| {
            links
                .iter()
                .filter_map(|l| l.get("ifname").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

fn driver_from_sysfs(ifname: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/net/{ifname}/device/driver")).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// Parses one element of `ip -j -d addr show` output.
fn parse_link(link: &Value) -> Result<NetdevInfo, String> {
    let name = link
        .get("ifname")
        .and_then(Value::as_str)
        .ok_or("no ifname")?
        .to_string();
    let ifindex = link
        .get("ifindex")
        .and_then(Value::as_u64)
        .ok_or("no ifindex")? as u32;
    let mtu = link.get("mtu").and_then(Value::as_u64).ok_or("no mtu")? as u32;
    let max_mtu = link
        .get("max_mtu")
        .and_then(Value::as_u64)
        .map(|v| v as u32);
    let mac = link
        .get("address")
        .and_then(Value::as_str)
        .and_then(MacAddr::parse)
        .unwrap_or_default();
    let oper_state = OperState::parse(
        link.get("operstate")
            .and_then(Value::as_str)
            .unwrap_or("UNKNOWN"),
    );
    let admin_up = link
        .get("flags")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|x| x.as_str() == Some("UP")));
    let link_type = link
        .get("link_type")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string();
    let driver = link
        .get("linkinfo")
        .and_then(|l| l.get("info_kind"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let num_rx_queues = link
        .get("num_rx_queues")
        .and_then(Value::as_u64)
        .map(|v| v as u32);
    let mut addrs = Vec::new();
    for a in link
        .get("addr_info")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(ip) = a
            .get("local")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<IpAddr>().ok())
        else {
            continue;
        };
        // A tentative (DAD in progress) or failed IPv6 address cannot be used yet.
        if a.get("tentative").and_then(Value::as_bool) == Some(true)
            || a.get("dadfailed").and_then(Value::as_bool) == Some(true)
        {
            continue;
        }
        let prefix_len = a.get("prefixlen").and_then(Value::as_u64).unwrap_or(0) as u8;
        addrs.push(IfAddr { ip, prefix_len });
    }
    let xdp = link.get("xdp").map(|x| {
        let mode = match x.get("mode").and_then(Value::as_u64) {
            Some(1) => "native",
            Some(2) => "generic",
            Some(3) => "offload",
            Some(4) => "multi",
            _ => "unknown",
        }
        .to_string();
        let mut prog_ids = Vec::new();
        if let Some(id) = x
            .get("prog")
            .and_then(|p| p.get("id"))
            .and_then(Value::as_u64)
        {
            prog_ids.push(id);
        }
        for attached in x
            .get("attached")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = attached
                .get("prog")
                .and_then(|p| p.get("id"))
                .and_then(Value::as_u64)
            {
                if !prog_ids.contains(&id) {
                    prog_ids.push(id);
                }
            }
        }
        XdpAttachment { mode, prog_ids }
    });
    Ok(NetdevInfo {
        name,
        ifindex,
        mac,
        mtu,
        max_mtu,
        oper_state,
        admin_up,
        link_type,
        driver,
        num_rx_queues,
        addrs,
        xdp,
    })
}

/// The state of a kernel neighbour (ARP/ND) entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighbourState {
    /// The entry has a usable MAC (REACHABLE, STALE, DELAY, PROBE, PERMANENT, NOARP).
    Usable(MacAddr),
    /// Resolution is under way (INCOMPLETE) or the entry has no address.
    Incomplete,
    /// Resolution failed (FAILED).
    Failed,
}

/// Looks `ip` up in the kernel's neighbour table for `ifname`; `None` if there is no entry.
pub fn neighbour_lookup(ifname: &str, ip: IpAddr) -> Result<Option<NeighbourState>, NetdevError> {
    check_ifname(ifname)?;
    let ip_text = ip.to_string();
    let value = ip_json(&["neigh", "show", "to", &ip_text, "dev", ifname])?;
    Ok(parse_neighbour(&value, ip))
}

fn parse_neighbour(value: &Value, ip: IpAddr) -> Option<NeighbourState> {
    let entry = value.as_array()?.iter().find(|e| {
        e.get("dst")
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<IpAddr>().ok())
            == Some(ip)
    })?;
    let states: Vec<&str> = entry
        .get("state")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if states.contains(&"FAILED") {
        return Some(NeighbourState::Failed);
    }
    match entry
        .get("lladdr")
        .and_then(Value::as_str)
        .and_then(MacAddr::parse)
    {
        Some(mac) if !states.contains(&"INCOMPLETE") => Some(NeighbourState::Usable(mac)),
        _ => Some(NeighbourState::Incomplete),
    }
}

/// The MAC address frames to `ip` must carry on `ifname`: from the kernel's neighbour table,
/// resolving it (ARP for IPv4, neighbour discovery for IPv6) when missing by sending a small
/// UDP datagram to the discard port (9) of the peer, which makes the kernel resolve the
/// address. Gives up with [`NetdevError::NeighbourTimeout`] after `timeout`.
///
/// A peer on the same host (loopback) resolves to the all-zero MAC.
pub fn resolve_neighbour(
    ifname: &str,
    ip: IpAddr,
    timeout: Duration,
) -> Result<MacAddr, NetdevError> {
    if ip.is_loopback() {
        return Ok(MacAddr::default());
    }
    let info = query(ifname)?;
    if info.addrs.iter().any(|a| a.ip == ip) {
        // Our own address: frames go to ourselves.
        return Ok(info.mac);
    }
    let start = Instant::now();
    let mut last_probe: Option<Instant> = None;
    let mut failed_seen = false;
    loop {
        match neighbour_lookup(ifname, ip)? {
            Some(NeighbourState::Usable(mac)) => return Ok(mac),
            Some(NeighbourState::Failed) => failed_seen = true,
            Some(NeighbourState::Incomplete) | None => {}
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Err(if failed_seen {
                NetdevError::NeighbourFailed {
                    ifname: ifname.to_string(),
                    ip,
                }
            } else {
                NetdevError::NeighbourTimeout {
                    ifname: ifname.to_string(),
                    ip,
                    timeout,
                }
            });
        }
        // A probe every 300 ms: the kernel itself retransmits ARP, but an entry that went
        // FAILED needs a new packet to start again.
        if last_probe.is_none_or(|t| t.elapsed() >= Duration::from_millis(300)) {
            send_probe(&info, ip)?;
            last_probe = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(5).min(timeout - elapsed));
    }
}

fn send_probe(info: &NetdevInfo, ip: IpAddr) -> Result<(), NetdevError> {
    let (bind, dest): (SocketAddr, SocketAddr) = match ip {
        IpAddr::V4(v4) => (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::new(IpAddr::V4(v4), 9),
        ),
        IpAddr::V6(v6) => {
            let scope = if is_link_local_v6(&v6) {
                info.ifindex
            } else {
                0
            };
            (
                (Ipv6Addr::UNSPECIFIED, 0).into(),
                std::net::SocketAddrV6::new(v6, 9, 0, scope).into(),
            )
        }
    };
    let socket = UdpSocket::bind(bind).map_err(|source| NetdevError::Probe { ip, source })?;
    // An unreachable network is a real error; anything else (e.g. EAGAIN while the kernel
    // queues the packet behind resolution) is not.
    match socket.send_to(b"xroce neighbour probe", dest) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NetworkUnreachable => {
            Err(NetdevError::Probe { ip, source: e })
        }
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_mtu_follows_rxe_rule() {
        assert_eq!(IbMtu::for_link_mtu(1500), Some(IbMtu::Mtu1024));
        assert_eq!(IbMtu::for_link_mtu(9000), Some(IbMtu::Mtu4096));
        assert_eq!(IbMtu::for_link_mtu(1400), Some(IbMtu::Mtu1024));
        assert_eq!(IbMtu::for_link_mtu(1104), Some(IbMtu::Mtu1024));
        assert_eq!(IbMtu::for_link_mtu(1103), Some(IbMtu::Mtu512));
        assert_eq!(IbMtu::for_link_mtu(2128), Some(IbMtu::Mtu2048));
        assert_eq!(IbMtu::for_link_mtu(336), Some(IbMtu::Mtu256));
        assert_eq!(IbMtu::for_link_mtu(335), None);
        assert_eq!(IbMtu::for_link_mtu(10), None);
        assert_eq!(IbMtu::Mtu4096.bytes(), 4096);
        assert_eq!(IbMtu::from_enum(3), Some(IbMtu::Mtu1024));
        assert_eq!(IbMtu::from_bytes(2048), Some(IbMtu::Mtu2048));
        assert_eq!(IbMtu::from_bytes(1500), None);
    }

    #[test]
    fn gid_table_order_link_local_then_ipv4_then_ipv6() {
        let addrs = [
            IfAddr {
                ip: "fd00::2".parse().unwrap(),
                prefix_len: 64,
            },
            IfAddr {
                ip: "198.18.0.1".parse().unwrap(),
                prefix_len: 24,
            },
            IfAddr {
                ip: "fe80::1".parse().unwrap(),
                prefix_len: 64,
            },
            IfAddr {
                ip: "198.18.0.9".parse().unwrap(),
                prefix_len: 24,
            },
        ];
        let table = gid_table_from(&addrs, MacAddr([2, 0, 0, 0, 0, 1]));
        let shown: Vec<String> = table.iter().map(|e| e.gid.to_string()).collect();
        assert_eq!(
            shown,
            [
                "fe80::1",
                "::ffff:198.18.0.1",
                "::ffff:198.18.0.9",
                "fd00::2"
            ]
        );
        assert!(table.iter().enumerate().all(|(i, e)| e.index == i as u32));
        assert!(table[1].gid.is_ipv4());
        assert_eq!(
            table[1].gid.to_ip(),
            "198.18.0.1".parse::<IpAddr>().unwrap()
        );
        assert!(!table[0].gid.is_ipv4());
    }

    #[test]
    fn gid_table_without_link_local_uses_eui64() {
        let table = gid_table_from(&[], MacAddr([0x02, 0xfc, 0, 0, 0, 1]));
        assert_eq!(table.len(), 1);
        assert_eq!(table[0].gid.to_string(), "fe80::fc:ff:fe00:1");
    }

    #[test]
    fn gid_hex_round_trip() {
        let gid = Gid::from_ip("198.18.0.1".parse().unwrap());
        assert_eq!(gid.to_hex(), "00000000000000000000ffffc6120001");
        assert_eq!(Gid::from_hex(&gid.to_hex()), Some(gid));
        assert_eq!(Gid::from_hex("0000"), None);
        assert_eq!(Gid::from_hex("zz000000000000000000ffffc6120001"), None);
    }

    #[test]
    fn mac_parse() {
        assert_eq!(
            MacAddr::parse("02:FC:00:00:00:0a"),
            Some(MacAddr([2, 0xfc, 0, 0, 0, 10]))
        );
        assert_eq!(MacAddr::parse("02:fc:00:00:00"), None);
        assert_eq!(MacAddr::parse("02:fc:00:00:00:00:00"), None);
        assert_eq!(MacAddr::parse("02:fc:00:00:00:100"), None);
        assert_eq!(
            MacAddr([1, 2, 3, 4, 5, 0xab]).to_string(),
            "01:02:03:04:05:ab"
        );
    }

    #[test]
    fn parse_link_json() {
        let json: Value = serde_json::from_str(
            r#"[{"ifindex":7,"ifname":"xr0","flags":["BROADCAST","UP","LOWER_UP"],
            "mtu":9000,"operstate":"UP","link_type":"ether","address":"02:00:00:00:00:07",
            "max_mtu":65535,"num_rx_queues":2,"linkinfo":{"info_kind":"veth"},
            "xdp":{"mode":2,"prog":{"id":42}},
            "addr_info":[{"family":"inet","local":"198.18.0.1","prefixlen":24},
                         {"family":"inet6","local":"fe80::7","prefixlen":64,"tentative":true}]}]"#,
        )
        .unwrap();
        let info = parse_link(&json[0]).unwrap();
        assert_eq!(info.ifindex, 7);
        assert_eq!(info.mtu, 9000);
        assert_eq!(info.active_mtu(), Some(IbMtu::Mtu4096));
        assert_eq!(info.driver.as_deref(), Some("veth"));
        assert_eq!(info.num_rx_queues, Some(2));
        assert!(info.is_active());
        assert_eq!(info.addrs.len(), 1, "tentative address skipped");
        assert_eq!(
            info.xdp,
            Some(XdpAttachment {
                mode: "generic".into(),
                prog_ids: vec![42]
            })
        );
        assert_eq!(info.gid_index_of("198.18.0.1".parse().unwrap()), Some(1));
    }

    #[test]
    fn parse_neighbour_states() {
        let ip: IpAddr = "198.18.0.2".parse().unwrap();
        let v: Value = serde_json::from_str(
            r#"[{"dst":"198.18.0.2","dev":"x","lladdr":"02:00:00:00:00:02","state":["STALE"]}]"#,
        )
        .unwrap();
        assert_eq!(
            parse_neighbour(&v, ip),
            Some(NeighbourState::Usable(MacAddr([2, 0, 0, 0, 0, 2])))
        );
        let v: Value =
            serde_json::from_str(r#"[{"dst":"198.18.0.2","dev":"x","state":["FAILED"]}]"#).unwrap();
        assert_eq!(parse_neighbour(&v, ip), Some(NeighbourState::Failed));
        let v: Value =
            serde_json::from_str(r#"[{"dst":"198.18.0.2","dev":"x","state":["INCOMPLETE"]}]"#)
                .unwrap();
        assert_eq!(parse_neighbour(&v, ip), Some(NeighbourState::Incomplete));
        assert_eq!(parse_neighbour(&Value::Array(vec![]), ip), None);
    }

    #[test]
    fn query_loopback_and_missing() {
        let lo = query("lo").expect("lo exists in every namespace");
        assert_eq!(lo.ifindex, 1);
        assert!(lo.is_active());
        assert!(matches!(
            query("xroce-nope0"),
            Err(NetdevError::NoSuchInterface(_))
        ));
        assert!(matches!(query("a/b"), Err(NetdevError::InvalidName(_))));
    }
}
