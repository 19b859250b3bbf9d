//! The scripted peer of `xroce conform`: an endpoint that is not an engine. It sends the
//! frames a case composes (any opcode, PSN, header field, payload or ICRC) through a
//! [`Driver`] (AF_XDP on the interface towards the target), and records every frame sent and
//! received with the time it left or arrived, for the case's checks, its capture and its
//! ladder diagram.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use xroce::driver::{Driver, DriverError};
use xroce::wire::{
    self, AethRepr, EthRepr, FrameRepr, IpRepr, NakCode, Opcode, PacketRepr, Syndrome,
};

/// The UDP source port of the peer's frames (any value is allowed: IBTA Annex A17.2.2 leaves
/// it to the sender for entropy).
pub const PEER_UDP_SOURCE_PORT: u16 = 0xC0DE;

/// One end of the exchange on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
}

/// Which way a recorded frame went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the peer to the target.
    Sent,
    /// From the target to the peer.
    Received,
}

/// A frame on the wire, as the peer sent or received it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Since the peer was opened.
    pub at: Duration,
    pub direction: Direction,
    pub frame: Vec<u8>,
}

/// What a frame from the target said, decoded into owned fields (the case's checks read
/// these; [`Record::frame`] keeps the bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heard {
    /// Since the peer was opened.
    pub at: Duration,
    pub opcode: Opcode,
    pub psn: u32,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub syndrome: Option<Syndrome>,
    pub msn: Option<u32>,
    /// A READ response's or SEND's payload (without pad).
    pub payload: Vec<u8>,
    pub reth: Option<wire::RethRepr>,
    /// An atomic acknowledgement's original value.
    pub atomic_orig: Option<u64>,
    pub atomic_eth: Option<wire::AtomicEthRepr>,
    pub immediate: Option<u32>,
    pub icrc_ok: bool,
}

impl Heard {
    fn from_frame(at: Duration, frame: &[u8]) -> Option<Heard> {
        let p = wire::parse_frame(frame).ok()?;
        let r = &p.repr.roce;
        Some(Heard {
            at,
            opcode: r.bth.opcode,
            psn: r.bth.psn.value(),
            dest_qp: r.bth.dest_qp,
            ack_req: r.bth.ack_req,
            syndrome: r.aeth.map(|a| a.syndrome),
            msn: r.aeth.map(|a| a.msn),
            payload: r.payload.to_vec(),
            reth: r.reth,
            atomic_orig: r.atomic_ack_eth.map(|a| a.orig_data),
            atomic_eth: r.atomic_eth,
            immediate: r.immdt,
            icrc_ok: p.icrc_ok(),
        })
    }

    /// A positive ACK (an ACKNOWLEDGE, or a READ response or atomic ACK carrying one).
    pub fn is_ack(&self) -> bool {
        matches!(self.syndrome, Some(Syndrome::Ack { .. }))
    }

    /// A NAK with `code`.
    pub fn is_nak(&self, code: NakCode) -> bool {
        self.syndrome == Some(Syndrome::Nak(code))
    }

    /// An RNR NAK; its timer code.
    pub fn rnr_timer(&self) -> Option<u8> {
        match self.syndrome {
            Some(Syndrome::RnrNak { timer }) => Some(timer),
            _ => None,
        }
    }

    /// A request from the target (its requester talking), not a response.
    pub fn is_request(&self) -> bool {
        self.opcode.info().is_some_and(|i| !i.is_response)
    }

    /// One line for a report: `RC_ACKNOWLEDGE psn=5 ACK msn=3`.
    pub fn describe(&self) -> String {
        let mut s = format!("{:?} psn={}", self.opcode, self.psn);
        if let Some(syn) = self.syndrome {
            s.push_str(&format!(" {}", syndrome_words(syn)));
        }
        if let Some(m) = self.msn {
            s.push_str(&format!(" msn={m}"));
        }
        if let Some(o) = self.atomic_orig {
            s.push_str(&format!(" orig={o:#x}"));
        }
        if !self.payload.is_empty() {
            s.push_str(&format!(" payload={}", self.payload.len()));
        }
        if !self.icrc_ok {
            s.push_str(" ICRC BAD");
        }
        s
    }
}

/// An AETH syndrome in a tester's words.
pub fn syndrome_words(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { .. } => "ACK".into(),
        Syndrome::RnrNak { timer } => format!("RNR NAK (timer {timer})"),
        Syndrome::Nak(NakCode::PsnSequenceError) => "NAK PSN sequence error".into(),
        Syndrome::Nak(NakCode::InvalidRequest) => "NAK invalid request".into(),
        Syndrome::Nak(NakCode::RemoteAccessError) => "NAK remote access error".into(),
        Syndrome::Nak(NakCode::RemoteOperationalError) => "NAK remote operational error".into(),
        Syndrome::Nak(code) => format!("NAK code {}", code.code()),
        Syndrome::Reserved(b) => format!("reserved syndrome {b:#x}"),
    }
}

/// Why the peer could not do what a case asked.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("the peer's driver: {0}")]
    Driver(#[from] DriverError),
    #[error("the peer could not compose the frame: {0}")]
    Compose(String),
    #[error("the route to the target: {0}")]
    Route(String),
}

/// The scripted peer: frames out as composed, everything recorded.
pub struct Peer {
    driver: Box<dyn Driver>,
    pub local: Endpoint,
    pub target: Endpoint,
    opened: Instant,
    log: Vec<Record>,
    /// Received frames not yet taken by [`Peer::next`].
    unread: std::collections::VecDeque<usize>,
}

impl Peer {
    /// A peer on `driver`, whose frames go from `local` to `target`.
    pub fn new(driver: Box<dyn Driver>, local: Endpoint, target: Endpoint) -> Peer {
        Peer {
            driver,
            local,
            target,
            opened: Instant::now(),
            log: Vec::new(),
            unread: Default::default(),
        }
    }

    /// A peer over AF_XDP on the interface the kernel routes `target` through, its addresses
    /// from the route and the neighbour table (resolved within `timeout`).
    #[cfg(feature = "xdp")]
    pub fn open_xdp(target: Ipv4Addr, timeout: Duration) -> Result<Peer, PeerError> {
        use std::net::IpAddr;
        use xroce::driver::xdp::{XdpConfig, XdpDriver};
        let route = xroce::netdev::resolve_route(IpAddr::V4(target), timeout)
            .map_err(|e| PeerError::Route(e.to_string()))?;
        if route.gateway.is_some() {
            return Err(PeerError::Route(format!(
                "{target} is behind a router ({}); the peer needs the target on its link",
                route.next_hop
            )));
        }
        let IpAddr::V4(source) = route.source else {
            return Err(PeerError::Route(format!(
                "{} has no IPv4 address",
                route.ifname
            )));
        };
        let iface = xroce::driver::iface::interface_info(&route.ifname)?;
        let driver = XdpDriver::open(&XdpConfig::new(route.ifname.clone()))?;
        Ok(Peer::new(
            Box::new(driver),
            Endpoint {
                mac: iface.mac,
                ip: source,
            },
            Endpoint {
                mac: route.mac.0,
                ip: target,
            },
        ))
    }

    /// The interface's name and mode, for reports.
    pub fn driver_info(&self) -> String {
        let info = self.driver.info();
        format!("{} ({:?})", info.name, info.mode)
    }

    /// Time since the peer was opened (the clock of every record).
    pub fn now(&self) -> Duration {
        self.opened.elapsed()
    }

    /// The whole frame for `packet` from the peer to the target, ICRC computed.
    pub fn compose(&self, packet: &PacketRepr<'_>) -> Result<Vec<u8>, PeerError> {
        let frame = FrameRepr {
            eth: EthRepr {
                dst: self.target.mac,
                src: self.local.mac,
                vlan: None,
            },
            ip: IpRepr::V4 {
                src: self.local.ip,
                dst: self.target.ip,
                tos: 0,
                ttl: 64,
                ident: 0,
                dont_fragment: true,
            },
            udp_src_port: PEER_UDP_SOURCE_PORT,
            roce: *packet,
        };
        let mut buf = vec![0; frame.buffer_len()];
        let n = frame
            .emit(&mut buf)
            .map_err(|e| PeerError::Compose(e.to_string()))?;
        buf.truncate(n);
        Ok(buf)
    }

    /// Composes and sends `packet`.
    pub fn send(&mut self, packet: &PacketRepr<'_>) -> Result<(), PeerError> {
        let frame = self.compose(packet)?;
        self.send_frame(frame)
    }

    /// Sends `frame` as it is (a case may have spoiled its ICRC or a header after
    /// [`Peer::compose`]).
    pub fn send_frame(&mut self, frame: Vec<u8>) -> Result<(), PeerError> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.driver.send(&frame) {
                Ok(()) => break,
                Err(DriverError::TxBusy) if Instant::now() < deadline => {
                    self.driver.flush()?;
                    self.pump()?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.driver.flush()?;
        self.log.push(Record {
            at: self.now(),
            direction: Direction::Sent,
            frame,
        });
        Ok(())
    }

    /// Takes what the driver has received into the record.
    fn pump(&mut self) -> Result<usize, PeerError> {
        let at = self.now();
        let mut got = Vec::new();
        let n = self
            .driver
            .recv(64, &mut |frame, _| got.push(frame.to_vec()))?;
        for frame in got {
            self.unread.push_back(self.log.len());
            self.log.push(Record {
                at,
                direction: Direction::Received,
                frame,
            });
        }
        Ok(n)
    }

    /// The next frame from the target that `wanted` accepts, waiting until `deadline`;
    /// frames it does not accept are passed over (they stay in the record).
    pub fn next_where(
        &mut self,
        deadline: Instant,
        mut wanted: impl FnMut(&Heard) -> bool,
    ) -> Result<Option<Heard>, PeerError> {
        loop {
            while let Some(i) = self.unread.pop_front() {
                let r = &self.log[i];
                if let Some(h) = Heard::from_frame(r.at, &r.frame) {
                    if wanted(&h) {
                        return Ok(Some(h));
                    }
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            if self.pump()? == 0 {
                let left = (deadline - now).min(Duration::from_millis(2));
                match self.driver.wait_fd() {
                    Some(fd) => {
                        let _ = xroce::driver::wait_readable(&[fd], Some(left));
                    }
                    None => std::thread::sleep(left.min(Duration::from_micros(50))),
                }
            }
        }
    }

    /// Every frame from the target that `wanted` accepts until `deadline`.
    pub fn collect_where(
        &mut self,
        deadline: Instant,
        mut wanted: impl FnMut(&Heard) -> bool,
    ) -> Result<Vec<Heard>, PeerError> {
        let mut out = Vec::new();
        while let Some(h) = self.next_where(deadline, &mut wanted)? {
            out.push(h);
        }
        Ok(out)
    }

    /// Forgets unread frames (a case starts from a quiet wire).
    pub fn drain(&mut self) -> Result<(), PeerError> {
        self.pump()?;
        self.unread.clear();
        Ok(())
    }

    /// Records from index `from` on (a case marks [`Peer::mark`] when it starts).
    pub fn records_since(&self, from: usize) -> &[Record] {
        &self.log[from.min(self.log.len())..]
    }

    /// Where the record stands now.
    pub fn mark(&self) -> usize {
        self.log.len()
    }
}

/// An ACKNOWLEDGE from the peer (its responder's answer to the target's requests).
pub fn acknowledge(dest_qp: u32, psn: u32, syndrome: Syndrome, msn: u32) -> PacketRepr<'static> {
    let mut p = PacketRepr::new(Opcode::RC_ACKNOWLEDGE, dest_qp);
    p.bth.psn = wire::Psn::new(psn);
    p.aeth = Some(AethRepr {
        syndrome,
        msn: msn & wire::Psn::MASK,
    });
    p
}
