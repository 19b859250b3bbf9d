//! Facts about a network interface that a RoCE device is built on, read from the kernel.
//!
//! An xroce device is an ordinary Ethernet interface. Everything RDMA needs to know about it
//! comes from here, without the engine:
//! - identity: interface index, MAC address, link MTU, operational state, carrier, driver;
//! - the **GID table**, derived from the interface's IP addresses the way Linux soft-RoCE
//!   (rxe) and RoCE HCAs do it: index 0 is the IPv6 link-local address, then each IPv4 address
//!   as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`), then the other IPv6 addresses. Every
//!   entry is a RoCE v2 GID (RoCE v2 runs over UDP/IP, so the GID *is* an IP address);
//! - the **path MTU** rule: the largest InfiniBand MTU (256, 512, 1024, 2048 or 4096 bytes of
//!   payload) that fits in the link MTU minus 80 bytes of headers (rxe's rule: a 1500-byte
//!   link gives 1024, a 9000-byte link gives 4096);
//! - the **next hop** towards a peer and its **neighbour** (ARP/ND) entry: RoCE v2 frames are
//!   built in user space, so the destination MAC must come from the kernel: the MAC of the
//!   gateway the kernel's route names for a peer behind a router, else of the peer itself.
//!
//! Everything is read over rtnetlink (`netlink-packet-route` messages on a synchronous
//! `netlink-sys` socket, one request and its answer at a time: no async runtime in the
//! library, no `ip` processes), except the driver name of a NIC that reports no link kind
//! (sysfs). It needs no privileges and reads the network namespace the process runs in.
//! The driver layer reads its interface facts here too (`driver::iface`).
use std::fmt;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

pub use crate::wire::addr::{Gid, MacAddr};
use crate::wire::Mtu;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
    NLM_F_MULTIPART, NLM_F_REQUEST,
};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};
use netlink_packet_route::link::{
    LinkAttribute, LinkFlags, LinkInfo, LinkLayerType, LinkMessage, LinkXdp, State, XdpAttached,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage,
    NeighbourState as KernelNeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteType, RouteVia,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use rustix::io::Errno;

/// What went wrong while asking the kernel about an interface, a route or a neighbour.
#[derive(Debug, thiserror::Error)]
pub enum NetdevError {
    /// The interface does not exist in this network namespace.
    #[error("network interface {0:?} not found (list interfaces with `ip link`)")]
    NoSuchInterface(String),
    /// The interface name cannot be a Linux interface name.
    #[error("invalid interface name {0:?}: 1 to 15 characters, no '/', no whitespace")]
    InvalidName(String),
    /// A netlink request failed.
    #[error("{what}: {source} (rtnetlink)")]
    Netlink {
        /// What was asked.
        what: String,
        /// The socket's or the kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The kernel has no route to the peer.
    #[error("no route to {ip}: {source} (check `ip route get {ip}`)")]
    NoRoute {
        /// The peer's address.
        ip: IpAddr,
        /// The kernel's answer (network unreachable, ...).
        #[source]
        source: std::io::Error,
    },
    /// The kernel routes the peer through another interface than the device's.
    #[error(
        "the route to {ip} leaves through {via}, not {ifname}: frames sent on {ifname} would \
         not reach it; open the device on {via}, or add a route to {ip} via {ifname}"
    )]
    RouteElsewhere {
        /// The peer's address.
        ip: IpAddr,
        /// The device's interface.
        ifname: String,
        /// The interface the route names.
        via: String,
    },
    /// No neighbour entry appeared within the timeout.
    #[error(
        "no ARP/ND answer from {} on {ifname} within {timeout:?}: is {} up and configured \
         with that address?",
        hop_of(.ip, .next_hop),
        who_is_hop(.ip, .next_hop)
    )]
    NeighbourTimeout {
        /// The interface the peer was looked for on.
        ifname: String,
        /// The peer's address.
        ip: IpAddr,
        /// The gateway towards the peer, when it is not on-link.
        next_hop: Option<IpAddr>,
        /// How long resolution was tried.
        timeout: Duration,
    },
    /// The kernel marked the neighbour as unreachable (`FAILED`) and retries gave nothing.
    #[error(
        "neighbour {} on {ifname} is unreachable (kernel neighbour state FAILED){}",
        hop_of(.ip, .next_hop),
        match .next_hop { Some(_) => format!(": it is the router towards {}", .ip), None => String::new() }
    )]
    NeighbourFailed {
        /// The interface the peer was looked for on.
        ifname: String,
        /// The peer's address.
        ip: IpAddr,
        /// The gateway towards the peer, when it is not on-link.
        next_hop: Option<IpAddr>,
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

fn hop_of(ip: &IpAddr, next_hop: &Option<IpAddr>) -> IpAddr {
    next_hop.unwrap_or(*ip)
}

fn who_is_hop(ip: &IpAddr, next_hop: &Option<IpAddr>) -> String {
    match next_hop {
        Some(gw) => format!("the router {gw} (the route to {ip} goes through it)"),
        None => "the peer".to_string(),
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
    /// Whether the link has carrier (the other end of a cable or veth is up), when the
    /// kernel says.
    pub carrier: Option<bool>,
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
    pub fn active_mtu(&self) -> Option<Mtu> {
        Mtu::for_link_mtu(self.mtu)
    }

    /// The largest IB MTU the port could use if the link MTU were raised to its maximum.
    pub fn max_ib_mtu(&self) -> Option<Mtu> {
        Mtu::for_link_mtu(self.max_mtu.unwrap_or(self.mtu).max(self.mtu))
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

/// The modified EUI-64 link-local address of a MAC (RFC 4291 appendix A): GID 0 of a port.
pub fn link_local_from_mac(mac: MacAddr) -> Ipv6Addr {
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

/// The MAC a modified EUI-64 link-local address was made from (fe80::/64 with ff:fe in the
/// middle of its interface id), the inverse of [`link_local_from_mac`]; `None` for any other
/// address (a stable-privacy link-local one, say), which only the neighbour table can map.
/// Linux's RDMA core takes a link-local destination GID's MAC this way instead of asking the
/// neighbour table (`ib_resolve_eth_dmac`), and GID 0 of a RoCE port is such an address even
/// where the interface has no IPv6 at all.
pub fn mac_of_link_local(ip: &Ipv6Addr) -> Option<MacAddr> {
    let o = ip.octets();
    let eui64 = ip.segments()[..4] == [0xfe80, 0, 0, 0] && o[11] == 0xff && o[12] == 0xfe;
    eui64.then(|| MacAddr([o[8] ^ 0x02, o[9], o[10], o[13], o[14], o[15]]))
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

/// One rtnetlink socket and the request/answer exchange over it (netlink(7)): a request
/// carries a sequence number; the kernel answers with one message, a multipart dump ending
/// in `NLMSG_DONE`, or an `NLMSG_ERROR` holding `-errno` (0 for an ACK).
struct Rtnl {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

/// Netlink message lengths are padded to 4 bytes.
fn nlmsg_align(len: usize) -> usize {
    len.div_ceil(4) * 4
}

impl Rtnl {
    fn open() -> Result<Rtnl, NetdevError> {
        let netlink = |source| NetdevError::Netlink {
            what: "opening an rtnetlink socket".into(),
            source,
        };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(netlink)?;
        socket.bind_auto().map_err(netlink)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(netlink)?;
        Ok(Rtnl {
            socket,
            seq: 0,
            // The kernel fills dump datagrams up to 32 KiB.
            buf: vec![0; 64 * 1024],
        })
    }

    /// Sends `msg` with `flags` (NLM_F_REQUEST is added) and collects the answer. A kernel
    /// error comes back as the `io::Error` of its errno.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> std::io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        req.finalize();
        let mut out_buf = vec![0; req.buffer_len()];
        req.serialize(&mut out_buf);
        self.socket.send(&out_buf, 0)?;
        let mut answers = Vec::new();
        loop {
            let n = self
                .socket
                .recv(&mut &mut self.buf[..], 0)?
                .min(self.buf.len());
            let mut offset = 0;
            while offset < n {
                let bytes = &self.buf[offset..n];
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes)
                    .map_err(|e| std::io::Error::new(ErrorKind::InvalidData, format!("{e}")))?;
                let len = msg.header.length as usize;
                if len == 0 {
                    return Err(std::io::Error::new(
                        ErrorKind::InvalidData,
                        "netlink message of length 0",
                    ));
                }
                offset += nlmsg_align(len);
                if msg.header.sequence_number != self.seq {
                    continue; // an answer to an earlier request that gave up
                }
                let multipart = msg.header.flags & NLM_F_MULTIPART != 0;
                match msg.payload {
                    NetlinkPayload::Done(_) => return Ok(answers),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            None => Ok(answers),
                            Some(code) => Err(std::io::Error::from_raw_os_error(-code.get())),
                        }
                    }
                    NetlinkPayload::InnerMessage(inner) => {
                        answers.push(inner);
                        if !multipart && flags & NLM_F_ACK == 0 {
                            return Ok(answers);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn link_by_name(&mut self, ifname: &str) -> Result<LinkMessage, NetdevError> {
        let mut msg = LinkMessage::default();
        msg.attributes
            .push(LinkAttribute::IfName(ifname.to_string()));
        match self.request(RouteNetlinkMessage::GetLink(msg), 0) {
            Ok(answers) => answers
                .into_iter()
                .find_map(|m| match m {
                    RouteNetlinkMessage::NewLink(link) => Some(link),
                    _ => None,
                })
                .ok_or_else(|| NetdevError::NoSuchInterface(ifname.to_string())),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::NODEV) => {
                Err(NetdevError::NoSuchInterface(ifname.to_string()))
            }
            Err(source) => Err(NetdevError::Netlink {
                what: format!("reading interface {ifname}"),
                source,
            }),
        }
    }

    fn addresses(&mut self, ifindex: u32) -> Result<Vec<IfAddr>, NetdevError> {
        let answers = self
            .request(
                RouteNetlinkMessage::GetAddress(AddressMessage::default()),
                NLM_F_DUMP,
            )
            .map_err(|source| NetdevError::Netlink {
                what: "listing addresses".into(),
                source,
            })?;
        Ok(answers
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == ifindex => if_addr_of(a),
                _ => None,
            })
            .collect())
    }

    fn query(&mut self, ifname: &str) -> Result<NetdevInfo, NetdevError> {
        check_ifname(ifname)?;
        let link = self.link_by_name(ifname)?;
        let mut info = info_of_link(&link);
        info.addrs = self.addresses(info.ifindex)?;
        if info.driver.is_none() {
            info.driver = driver_from_sysfs(ifname);
        }
        Ok(info)
    }

    /// RTM_GETROUTE for `ip`: the kernel's own choice of output interface and gateway.
    fn route(&mut self, ip: IpAddr, oif: Option<u32>) -> Result<Route, NetdevError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family_of(ip);
        msg.header.destination_prefix_length = if ip.is_ipv4() { 32 } else { 128 };
        msg.attributes.push(RouteAttribute::Destination(ip.into()));
        if let Some(oif) = oif {
            msg.attributes.push(RouteAttribute::Oif(oif));
        }
        let answers = self
            .request(RouteNetlinkMessage::GetRoute(msg), 0)
            .map_err(|source| NetdevError::NoRoute { ip, source })?;
        answers
            .iter()
            .find_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r) => Some(route_of(r)),
                _ => None,
            })
            .ok_or_else(|| NetdevError::NoRoute {
                ip,
                source: std::io::Error::new(ErrorKind::NotFound, "the kernel sent no route"),
            })
    }

    /// RTM_GETNEIGH for one address on one interface; `None` when there is no entry.
    fn neighbour(
        &mut self,
        ifindex: u32,
        ip: IpAddr,
    ) -> Result<Option<NeighbourState>, NetdevError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family_of(ip);
        msg.header.ifindex = ifindex;
        msg.attributes
            .push(NeighbourAttribute::Destination(neighbour_address(ip)));
        match self.request(RouteNetlinkMessage::GetNeighbour(msg), 0) {
            Ok(answers) => Ok(answers.iter().find_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n) => Some(neighbour_state_of(n)),
                _ => None,
            })),
            Err(e) if Errno::from_io_error(&e) == Some(Errno::NOENT) => Ok(None),
            Err(source) => Err(NetdevError::Netlink {
                what: format!("reading the neighbour entry of {ip}"),
                source,
            }),
        }
    }

    /// Asks the kernel to resolve `ip` on `ifindex` (RTM_NEWNEIGH with NTF_USE, as
    /// `ip neigh add ... use` does: the entry is created if needed and solicited at once).
    /// Needs CAP_NET_ADMIN: the error is returned so the caller can fall back.
    fn solicit(&mut self, ifindex: u32, ip: IpAddr) -> std::io::Result<()> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family_of(ip);
        msg.header.ifindex = ifindex;
        msg.header.flags = NeighbourFlags::Use;
        msg.attributes
            .push(NeighbourAttribute::Destination(neighbour_address(ip)));
        self.request(
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_CREATE | NLM_F_ACK,
        )
        .map(|_| ())
    }
}

fn family_of(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neighbour_address(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
        IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
    }
}

/// The interface facts of one RTM_NEWLINK message (addresses are filled in separately).
fn info_of_link(link: &LinkMessage) -> NetdevInfo {
    let mut info = NetdevInfo {
        name: String::new(),
        ifindex: link.header.index,
        mac: MacAddr::default(),
        mtu: 0,
        max_mtu: None,
        oper_state: OperState::Unknown,
        admin_up: link.header.flags.contains(LinkFlags::Up),
        carrier: None,
        link_type: match link.header.link_layer_type {
            LinkLayerType::Ether => "ether".into(),
            LinkLayerType::Loopback => "loopback".into(),
            LinkLayerType::None => "none".into(),
            other => format!("{other:?}").to_lowercase(),
        },
        driver: None,
        num_rx_queues: None,
        addrs: Vec::new(),
        xdp: None,
    };
    for attr in &link.attributes {
        match attr {
            LinkAttribute::IfName(name) => info.name = name.clone(),
            LinkAttribute::Mtu(mtu) => info.mtu = *mtu,
            LinkAttribute::MaxMtu(max) => info.max_mtu = Some(*max),
            LinkAttribute::Address(bytes) => {
                if let Ok(mac) = <[u8; 6]>::try_from(bytes.as_slice()) {
                    info.mac = MacAddr(mac);
                }
            }
            LinkAttribute::OperState(state) => {
                info.oper_state = match state {
                    State::Up => OperState::Up,
                    State::Down => OperState::Down,
                    State::LowerLayerDown => OperState::LowerLayerDown,
                    State::Dormant => OperState::Dormant,
                    State::Testing => OperState::Testing,
                    State::NotPresent => OperState::NotPresent,
                    _ => OperState::Unknown,
                }
            }
            LinkAttribute::Carrier(c) => info.carrier = Some(*c != 0),
            LinkAttribute::NumRxQueues(n) => info.num_rx_queues = Some(*n),
            LinkAttribute::LinkInfo(infos) => {
                info.driver = infos.iter().find_map(|i| match i {
                    LinkInfo::Kind(kind) => Some(kind.to_string()),
                    _ => None,
                });
            }
            LinkAttribute::Xdp(xdp) => info.xdp = xdp_of(xdp),
            _ => {}
        }
    }
    info
}

fn xdp_of(attrs: &[LinkXdp]) -> Option<XdpAttachment> {
    let mut mode = None;
    let mut prog_ids = Vec::new();
    for attr in attrs {
        match attr {
            LinkXdp::Attached(XdpAttached::None) => return None,
            LinkXdp::Attached(a) => {
                mode = Some(match a {
                    XdpAttached::Driver => "native",
                    XdpAttached::SocketBuffer => "generic",
                    XdpAttached::Hardware => "offload",
                    XdpAttached::Multiple => "multi",
                    _ => "unknown",
                })
            }
            LinkXdp::ProgId(id)
            | LinkXdp::DrvProgId(id)
            | LinkXdp::SkbProgId(id)
            | LinkXdp::HwProgId(id) => {
                let id = u64::from(*id);
                if id != 0 && !prog_ids.contains(&id) {
                    prog_ids.push(id);
                }
            }
            _ => {}
        }
    }
    mode.map(|mode| XdpAttachment {
        mode: mode.to_string(),
        prog_ids,
    })
}

/// One usable address of an RTM_NEWADDR message: IPv4's local address (IFA_LOCAL; IFA_ADDRESS
/// is the peer's on point-to-point links), IPv6's IFA_ADDRESS. Tentative (DAD in progress)
/// and DAD-failed addresses cannot be used yet and are left out.
fn if_addr_of(msg: &AddressMessage) -> Option<IfAddr> {
    let mut local = None;
    let mut address = None;
    let mut flags = None;
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            AddressAttribute::Flags(f) => flags = Some(*f),
            _ => {}
        }
    }
    let unusable = match flags {
        Some(f) => f.intersects(AddressFlags::Tentative | AddressFlags::Dadfailed),
        None => msg
            .header
            .flags
            .intersects(AddressHeaderFlags::Tentative | AddressHeaderFlags::Dadfailed),
    };
    if unusable {
        return None;
    }
    let ip = match msg.header.family {
        AddressFamily::Inet => local.or(address)?,
        AddressFamily::Inet6 => address.or(local)?,
        _ => return None,
    };
    Some(IfAddr {
        ip,
        prefix_len: msg.header.prefix_len,
    })
}

/// Where the kernel sends packets for a destination ([`route_to`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Output interface index.
    pub oif: u32,
    /// The next-hop router, or `None` when the destination is on-link.
    pub gateway: Option<IpAddr>,
    /// The source address the kernel would pick.
    pub pref_source: Option<IpAddr>,
    /// True when the destination is an address of this host (a `local` route).
    pub local: bool,
}

impl Route {
    /// The address whose neighbour entry gives the destination MAC: the gateway, or the
    /// destination itself when it is on-link.
    pub fn next_hop(&self, dest: IpAddr) -> IpAddr {
        self.gateway.unwrap_or(dest)
    }
}

fn route_of(msg: &RouteMessage) -> Route {
    let mut route = Route {
        oif: 0,
        gateway: None,
        pref_source: None,
        local: msg.header.kind == RouteType::Local,
    };
    let ip_of = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Oif(oif) => route.oif = *oif,
            RouteAttribute::Gateway(gw) => route.gateway = ip_of(gw),
            // An IPv4 route through an IPv6 next hop (RFC 5549).
            RouteAttribute::Via(RouteVia::Inet6(v6)) => route.gateway = Some(IpAddr::V6(*v6)),
            RouteAttribute::Via(RouteVia::Inet(v4)) => route.gateway = Some(IpAddr::V4(*v4)),
            RouteAttribute::PrefSource(src) => route.pref_source = ip_of(src),
            _ => {}
        }
    }
    route
}

fn neighbour_state_of(msg: &NeighbourMessage) -> NeighbourState {
    let state = msg.header.state;
    if state == KernelNeighbourState::Failed {
        return NeighbourState::Failed;
    }
    let mac = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(bytes) => {
            <[u8; 6]>::try_from(bytes.as_slice()).ok().map(MacAddr)
        }
        _ => None,
    });
    match (state, mac) {
        (KernelNeighbourState::Incomplete | KernelNeighbourState::None, _) | (_, None) => {
            NeighbourState::Incomplete
        }
        (_, Some(mac)) => NeighbourState::Usable(mac),
    }
}

/// Reads every fact xroce needs about interface `ifname`, over rtnetlink: the link
/// (RTM_GETLINK: index, MAC, MTU, states, link kind, queues, XDP) and its addresses
/// (RTM_GETADDR). No privileges needed.
pub fn query(ifname: &str) -> Result<NetdevInfo, NetdevError> {
    check_ifname(ifname)?;
    Rtnl::open()?.query(ifname)
}

/// rtnetlink's multicast group of link changes (`RTNLGRP_LINK`, linux/rtnetlink.h).
const RTNLGRP_LINK: u32 = 1;

/// What a [`LinkWatch`] read about its interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkChange {
    /// A notification about the interface: whether it can carry frames now
    /// ([`NetdevInfo::is_active`]). Repeats are possible: the kernel notifies every change
    /// of the link (MTU, XDP program, ...), not only of its state.
    Active(bool),
    /// The interface was deleted.
    Removed,
    /// Notifications were lost (the socket's buffer overflowed): query the link again.
    Lost,
}

/// A subscription to the kernel's link notifications (`RTNLGRP_LINK`) for one interface,
/// in the network namespace of the thread that opened it. Non-blocking: wait for
/// [`LinkWatch::fd`] to be readable, then [`LinkWatch::read`].
pub struct LinkWatch {
    socket: Socket,
    ifindex: u32,
    buf: Vec<u8>,
}

impl LinkWatch {
    /// Subscribes to the changes of interface `ifindex`.
    pub fn open(ifindex: u32) -> Result<LinkWatch, NetdevError> {
        let netlink = |source| NetdevError::Netlink {
            what: "subscribing to link notifications".into(),
            source,
        };
        let mut socket = Socket::new(NETLINK_ROUTE).map_err(netlink)?;
        socket.bind_auto().map_err(netlink)?;
        socket.add_membership(RTNLGRP_LINK).map_err(netlink)?;
        socket.set_non_blocking(true).map_err(netlink)?;
        Ok(LinkWatch {
            socket,
            ifindex,
            buf: vec![0; 64 * 1024],
        })
    }

    /// Readable when a notification waits.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.socket.as_fd()
    }

    /// Every notification about the interface that waits, oldest first (none: nothing
    /// waits). Unparsable messages are skipped: the next notification carries the whole
    /// link state again.
    pub fn read(&mut self) -> Result<Vec<LinkChange>, NetdevError> {
        let mut changes = Vec::new();
        loop {
            let n = match self.socket.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => n.min(self.buf.len()),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(changes),
                Err(e) if Errno::from_io_error(&e) == Some(Errno::NOBUFS) => {
                    changes.push(LinkChange::Lost);
                    continue;
                }
                Err(source) => {
                    return Err(NetdevError::Netlink {
                        what: "reading link notifications".into(),
                        source,
                    })
                }
            };
            let mut offset = 0;
            while offset < n {
                let Ok(msg) =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[offset..n])
                else {
                    break;
                };
                let len = msg.header.length as usize;
                if len == 0 {
                    break;
                }
                offset += nlmsg_align(len);
                match msg.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link))
                        if link.header.index == self.ifindex =>
                    {
                        changes.push(LinkChange::Active(info_of_link(&link).is_active()));
                    }
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link))
                        if link.header.index == self.ifindex =>
                    {
                        changes.push(LinkChange::Removed);
                    }
                    _ => {}
                }
            }
        }
    }
}

/// Lists the interfaces of this namespace (names only).
pub fn list() -> Result<Vec<String>, NetdevError> {
    let answers = Rtnl::open()?
        .request(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )
        .map_err(|source| NetdevError::Netlink {
            what: "listing interfaces".into(),
            source,
        })?;
    Ok(answers
        .iter()
        .filter_map(|m| match m {
            RouteNetlinkMessage::NewLink(link) => link.attributes.iter().find_map(|a| match a {
                LinkAttribute::IfName(name) => Some(name.clone()),
                _ => None,
            }),
            _ => None,
        })
        .collect())
}

/// The kernel's route to `ip` (`ip route get`): output interface and gateway.
pub fn route_to(ip: IpAddr) -> Result<Route, NetdevError> {
    Rtnl::open()?.route(ip, None)
}

/// Where frames to a destination go, all the way to the next hop's MAC ([`resolve_route`]):
/// what an address resolution of the RDMA CM needs (`rdma_resolve_addr` / `rdma_resolve_route`
/// in librdmacm).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedRoute {
    /// The destination asked about.
    pub dest: IpAddr,
    /// The outgoing interface.
    pub ifname: String,
    /// Its index.
    pub ifindex: u32,
    /// The source address the kernel picks for it (the route's preferred source, else the
    /// interface's first address of the destination's family).
    pub source: IpAddr,
    /// The router towards `dest`, `None` when it is on-link.
    pub gateway: Option<IpAddr>,
    /// The address whose MAC frames carry: the gateway, or `dest` itself.
    pub next_hop: IpAddr,
    /// The next hop's MAC (the interface's own for a local destination).
    pub mac: MacAddr,
    /// Whether `dest` is an address of this host.
    pub local: bool,
}

/// Resolves the route to `dest` (RTM_GETROUTE: outgoing interface, source, gateway) and the
/// next hop's MAC (the neighbour table, resolved when missing as [`resolve_neighbour`] does).
/// Typed errors: [`NetdevError::NoRoute`] when the kernel has no route (network
/// unreachable), [`NetdevError::NeighbourTimeout`] / [`NetdevError::NeighbourFailed`] when
/// the next hop does not answer within `timeout`.
pub fn resolve_route(dest: IpAddr, timeout: Duration) -> Result<ResolvedRoute, NetdevError> {
    let mut rtnl = Rtnl::open()?;
    let route = rtnl.route(dest, None)?;
    let ifname = rtnl_name_of(&mut rtnl, route.oif);
    let info = rtnl.query(&ifname)?;
    let source = route
        .pref_source
        .or_else(|| {
            info.addrs
                .iter()
                .map(|a| a.ip)
                .find(|ip| ip.is_ipv4() == dest.is_ipv4())
        })
        .ok_or_else(|| NetdevError::NoRoute {
            ip: dest,
            source: std::io::Error::new(
                ErrorKind::AddrNotAvailable,
                format!("{ifname} has no address of the destination's family"),
            ),
        })?;
    let mac = if route.local {
        info.mac
    } else {
        resolve_neighbour(&ifname, dest, timeout)?
    };
    Ok(ResolvedRoute {
        dest,
        ifname,
        ifindex: route.oif,
        source,
        gateway: route.gateway,
        next_hop: route.next_hop(dest),
        mac,
        local: route.local,
    })
}

fn driver_from_sysfs(ifname: &str) -> Option<String> {
    let link = std::fs::read_link(format!("/sys/class/net/{ifname}/device/driver")).ok()?;
    link.file_name().map(|n| n.to_string_lossy().into_owned())
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
/// This is the entry of `ip` itself, not of the next hop towards it (see
/// [`resolve_neighbour`]).
pub fn neighbour_lookup(ifname: &str, ip: IpAddr) -> Result<Option<NeighbourState>, NetdevError> {
    check_ifname(ifname)?;
    let mut rtnl = Rtnl::open()?;
    let ifindex = rtnl.link_by_name(ifname)?.header.index;
    rtnl.neighbour(ifindex, ip)
}

/// First wait between two looks at the neighbour table; doubled each time up to
/// [`NEIGHBOUR_POLL_MAX`]. A neighbour on a veth answers in well under a millisecond.
const NEIGHBOUR_POLL_FIRST: Duration = Duration::from_millis(1);
const NEIGHBOUR_POLL_MAX: Duration = Duration::from_millis(64);
/// The kernel gives up on a solicitation after its probes (3 x 1 s by default) and marks
/// the entry FAILED; a new solicitation starts it again.
const RESOLICIT_AFTER: Duration = Duration::from_millis(1000);

/// The MAC address frames to `ip` must carry on `ifname`. The kernel's route to `ip`
/// (RTM_GETROUTE) names the next hop: a gateway for a peer behind a router, else the peer
/// itself. Its neighbour entry (RTM_GETNEIGH) gives the MAC; when it is missing or FAILED
/// the kernel is asked to resolve it (an RTM_NEWNEIGH NTF_USE solicitation, or without
/// CAP_NET_ADMIN a small UDP datagram to the peer's discard port, which makes the kernel
/// resolve the next hop), and the table is looked at again with a growing interval
/// (1 ms doubling to 64 ms). A global IPv6 peer always gets the datagram instead: a
/// solicitation asked for over netlink carries no packet, so IPv6 would send its Neighbor
/// Solicitation from the link-local address, and sends none while that address is still
/// tentative (a second or two after the link comes up); the datagram's source, the global
/// address, solicits at once. Gives up with [`NetdevError::NeighbourTimeout`] after
/// `timeout`.
///
/// A peer on the same host (loopback, or an address of this host) resolves to the
/// all-zero MAC or the interface's own; a modified EUI-64 link-local peer to the MAC in its
/// interface id ([`mac_of_link_local`]), without asking anyone.
pub fn resolve_neighbour(
    ifname: &str,
    ip: IpAddr,
    timeout: Duration,
) -> Result<MacAddr, NetdevError> {
    if ip.is_loopback() {
        return Ok(MacAddr::default());
    }
    check_ifname(ifname)?;
    let mut rtnl = Rtnl::open()?;
    let info = rtnl.query(ifname)?;
    if info.addrs.iter().any(|a| a.ip == ip) {
        // Our own address: frames go to ourselves.
        return Ok(info.mac);
    }
    if let Some(mac) = match ip {
        IpAddr::V6(v6) => mac_of_link_local(&v6),
        IpAddr::V4(_) => None,
    } {
        return Ok(mac);
    }
    // A link-local IPv6 destination only means something on one interface: say which.
    let scoped = matches!(ip, IpAddr::V6(v6) if is_link_local_v6(&v6));
    let route = rtnl.route(ip, scoped.then_some(info.ifindex))?;
    if route.local {
        return Ok(info.mac);
    }
    if route.oif != info.ifindex {
        let via = rtnl_name_of(&mut rtnl, route.oif);
        return Err(NetdevError::RouteElsewhere {
            ip,
            ifname: ifname.to_string(),
            via,
        });
    }
    let hop = route.next_hop(ip);
    let start = Instant::now();
    let mut last_solicit: Option<Instant> = None;
    let mut failed_seen = false;
    let mut pause = NEIGHBOUR_POLL_FIRST;
    let global_v6 = matches!(hop, IpAddr::V6(v6) if !is_link_local_v6(&v6));
    loop {
        let state = rtnl.neighbour(info.ifindex, hop)?;
        match state {
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
                    next_hop: route.gateway,
                }
            } else {
                NetdevError::NeighbourTimeout {
                    ifname: ifname.to_string(),
                    ip,
                    next_hop: route.gateway,
                    timeout,
                }
            });
        }
        let resolicit = match (state, last_solicit) {
            (_, None) => true,
            (Some(NeighbourState::Failed), _) => true,
            (_, Some(t)) => t.elapsed() >= RESOLICIT_AFTER,
        };
        if resolicit {
            if global_v6 {
                // The datagram is the solicitation (see above).
                send_probe(&info, ip)?;
            } else {
                match rtnl.solicit(info.ifindex, hop) {
                    Ok(()) => {}
                    Err(e)
                        if matches!(
                            Errno::from_io_error(&e),
                            Some(Errno::PERM | Errno::ACCESS)
                        ) =>
                    {
                        send_probe(&info, ip)?
                    }
                    Err(source) => {
                        return Err(NetdevError::Netlink {
                            what: format!("asking the kernel to resolve {hop} on {ifname}"),
                            source,
                        })
                    }
                }
            }
            last_solicit = Some(Instant::now());
            // The kernel cannot have an answer yet: start the waits afresh.
            pause = NEIGHBOUR_POLL_FIRST;
        }
        std::thread::sleep(pause.min(timeout - elapsed));
        pause = (pause * 2).min(NEIGHBOUR_POLL_MAX);
    }
}

fn rtnl_name_of(rtnl: &mut Rtnl, ifindex: u32) -> String {
    let mut msg = LinkMessage::default();
    msg.header.index = ifindex;
    rtnl.request(RouteNetlinkMessage::GetLink(msg), 0)
        .ok()
        .and_then(|answers| {
            answers.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => info_of_link(&link).name.into(),
                _ => None,
            })
        })
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| format!("interface index {ifindex}"))
}

fn send_probe(info: &NetdevInfo, ip: IpAddr) -> Result<(), NetdevError> {
    let (bind, dest): (std::net::SocketAddr, std::net::SocketAddr) = match ip {
        IpAddr::V4(v4) => (
            (Ipv4Addr::UNSPECIFIED, 0).into(),
            std::net::SocketAddr::new(IpAddr::V4(v4), 9),
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
        Err(e) if e.kind() == ErrorKind::NetworkUnreachable => {
            Err(NetdevError::Probe { ip, source: e })
        }
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_local_eui64_address_gives_back_its_mac() {
        let mac = MacAddr([0x02, 0x1b, 0x21, 0xaa, 0xbb, 0xcc]);
        let ll = link_local_from_mac(mac);
        assert_eq!(ll, "fe80::1b:21ff:feaa:bbcc".parse::<Ipv6Addr>().unwrap());
        assert_eq!(mac_of_link_local(&ll), Some(mac));
        // Not EUI-64 (stable privacy), not link-local, not /64 link-local: the table decides.
        for other in [
            "fe80::1234:5678:9abc:def0",
            "2001:2::1b:21ff:feaa:bbcc",
            "fe80:1::1b:21ff:feaa:bbcc",
        ] {
            assert_eq!(mac_of_link_local(&other.parse().unwrap()), None, "{other}");
        }
    }

    #[test]
    fn ib_mtu_follows_rxe_rule() {
        assert_eq!(Mtu::for_link_mtu(1500), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(9000), Some(Mtu::Mtu4096));
        assert_eq!(Mtu::for_link_mtu(1400), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(1104), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::for_link_mtu(1103), Some(Mtu::Mtu512));
        assert_eq!(Mtu::for_link_mtu(2128), Some(Mtu::Mtu2048));
        assert_eq!(Mtu::for_link_mtu(336), Some(Mtu::Mtu256));
        assert_eq!(Mtu::for_link_mtu(335), None);
        assert_eq!(Mtu::for_link_mtu(10), None);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::from_ibv_value(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::from_bytes(2048), Some(Mtu::Mtu2048));
        assert_eq!(Mtu::from_bytes(1500), None);
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
            MacAddr::parse("2:fc:0:0:0:a"),
            Some(MacAddr([2, 0xfc, 0, 0, 0, 10]))
        );
        // What `ip -j link` prints (netns::Netns::mac reads it through here).
        assert_eq!(
            MacAddr::parse("02:00:0a:ff:00:01"),
            Some(MacAddr([2, 0, 10, 255, 0, 1]))
        );
        for bad in [
            "",
            ":::::",
            "02:fc::00:00:00",
            "02:fc:00:00:00:00:",
            "+2:fc:00:00:00:00",
            "02:fc:00:00:00:+0",
            " 02:fc:00:00:00:00",
            "02:fc:00:00:00:00 ",
            "02-fc-00-00-00-00",
            "zz:fc:00:00:00:00",
            "02:fc:00:00:00:0g",
            "02:fc:00:00:00:é",
        ] {
            assert_eq!(MacAddr::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            MacAddr([1, 2, 3, 4, 5, 0xab]).to_string(),
            "01:02:03:04:05:ab"
        );
    }

    #[test]
    fn link_message_facts() {
        let mut link = LinkMessage::default();
        link.header.index = 7;
        link.header.link_layer_type = LinkLayerType::Ether;
        link.header.flags = LinkFlags::Up | LinkFlags::LowerUp;
        link.attributes = vec![
            LinkAttribute::IfName("xr0".into()),
            LinkAttribute::Mtu(9000),
            LinkAttribute::MaxMtu(65535),
            LinkAttribute::Address(vec![2, 0, 0, 0, 0, 7]),
            LinkAttribute::OperState(State::Up),
            LinkAttribute::Carrier(1),
            LinkAttribute::NumRxQueues(2),
            LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                netlink_packet_route::link::InfoKind::Veth,
            )]),
            LinkAttribute::Xdp(vec![
                LinkXdp::Attached(XdpAttached::SocketBuffer),
                LinkXdp::ProgId(42),
                LinkXdp::SkbProgId(42),
            ]),
        ];
        let mut info = info_of_link(&link);
        assert_eq!(info.name, "xr0");
        assert_eq!(info.ifindex, 7);
        assert_eq!(info.mac, MacAddr([2, 0, 0, 0, 0, 7]));
        assert_eq!(info.mtu, 9000);
        assert_eq!(info.max_mtu, Some(65535));
        assert_eq!(info.active_mtu(), Some(Mtu::Mtu4096));
        assert_eq!(info.driver.as_deref(), Some("veth"));
        assert_eq!(info.num_rx_queues, Some(2));
        assert_eq!(info.carrier, Some(true));
        assert_eq!(info.link_type, "ether");
        assert!(info.is_active());
        assert_eq!(
            info.xdp,
            Some(XdpAttachment {
                mode: "generic".into(),
                prog_ids: vec![42]
            })
        );
        let mut v4 = AddressMessage::default();
        v4.header.family = AddressFamily::Inet;
        v4.header.prefix_len = 24;
        v4.header.index = 7;
        v4.attributes = vec![
            AddressAttribute::Address("198.18.0.9".parse().unwrap()),
            AddressAttribute::Local("198.18.0.1".parse().unwrap()),
        ];
        let mut tentative = AddressMessage::default();
        tentative.header.family = AddressFamily::Inet6;
        tentative.header.prefix_len = 64;
        tentative.attributes = vec![
            AddressAttribute::Address("fe80::7".parse().unwrap()),
            AddressAttribute::Flags(AddressFlags::Tentative),
        ];
        assert_eq!(
            if_addr_of(&v4),
            Some(IfAddr {
                ip: "198.18.0.1".parse().unwrap(),
                prefix_len: 24
            }),
            "IPv4 uses IFA_LOCAL"
        );
        assert_eq!(if_addr_of(&tentative), None, "tentative address skipped");
        info.addrs = [&v4, &tentative]
            .into_iter()
            .filter_map(if_addr_of)
            .collect();
        assert_eq!(info.gid_index_of("198.18.0.1".parse().unwrap()), Some(1));
        link.attributes
            .push(LinkAttribute::Xdp(vec![LinkXdp::Attached(
                XdpAttached::None,
            )]));
        assert_eq!(info_of_link(&link).xdp, None);
    }

    #[test]
    fn route_message_names_the_gateway() {
        let mut r = RouteMessage::default();
        r.header.kind = RouteType::Unicast;
        r.attributes = vec![
            RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(198, 19, 2, 2))),
            RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(198, 19, 1, 1))),
            RouteAttribute::Oif(5),
            RouteAttribute::PrefSource(RouteAddress::Inet(Ipv4Addr::new(198, 19, 1, 2))),
        ];
        let route = route_of(&r);
        let peer: IpAddr = "198.19.2.2".parse().unwrap();
        assert_eq!(route.oif, 5);
        assert!(!route.local);
        assert_eq!(
            route.next_hop(peer),
            "198.19.1.1".parse::<IpAddr>().unwrap()
        );
        r.attributes
            .retain(|a| !matches!(a, RouteAttribute::Gateway(_)));
        assert_eq!(
            route_of(&r).next_hop(peer),
            peer,
            "on-link: the peer itself"
        );
        r.header.kind = RouteType::Local;
        assert!(route_of(&r).local);
    }

    #[test]
    fn neighbour_message_states() {
        let entry = |state, mac: Option<Vec<u8>>| {
            let mut n = NeighbourMessage::default();
            n.header.state = state;
            n.attributes
                .push(NeighbourAttribute::Destination(NeighbourAddress::Inet(
                    Ipv4Addr::new(198, 18, 0, 2),
                )));
            if let Some(mac) = mac {
                n.attributes.push(NeighbourAttribute::LinkLayerAddress(mac));
            }
            neighbour_state_of(&n)
        };
        assert_eq!(
            entry(KernelNeighbourState::Stale, Some(vec![2, 0, 0, 0, 0, 2])),
            NeighbourState::Usable(MacAddr([2, 0, 0, 0, 0, 2]))
        );
        assert_eq!(
            entry(KernelNeighbourState::Failed, None),
            NeighbourState::Failed
        );
        assert_eq!(
            entry(KernelNeighbourState::Incomplete, None),
            NeighbourState::Incomplete
        );
        assert_eq!(
            entry(KernelNeighbourState::Reachable, Some(vec![1, 2])),
            NeighbourState::Incomplete,
            "a malformed link-layer address is not usable"
        );
    }

    #[test]
    fn neighbour_errors_name_the_router() {
        let err = NetdevError::NeighbourTimeout {
            ifname: "veth0".into(),
            ip: "198.19.2.2".parse().unwrap(),
            next_hop: Some("198.19.1.1".parse().unwrap()),
            timeout: Duration::from_secs(3),
        };
        assert_eq!(
            err.to_string(),
            "no ARP/ND answer from 198.19.1.1 on veth0 within 3s: is the router 198.19.1.1 \
             (the route to 198.19.2.2 goes through it) up and configured with that address?"
        );
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
        assert!(list().unwrap().iter().any(|n| n == "lo"));
        // 127.0.0.1 is a local route through lo.
        let route = route_to("127.0.0.1".parse().unwrap()).unwrap();
        assert!(route.local);
        assert_eq!(route.oif, 1);
    }
}
