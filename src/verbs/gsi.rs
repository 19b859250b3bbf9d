//! The general services interface of a device (QP1): management datagrams in and out.
//!
//! [`Device::open_gsi`] opens QP1 (one per device) with its own PD, CQ, completion channel
//! and a ring of receive buffers; MADs are opaque 256-byte buffers here (their layout is the
//! CM's business). A received MAD comes with everything needed to answer it
//! ([`ReceivedMad::reply_to`]): the sender's GID, QPN, MAC and the local GID it was sent to.
//! See docs/architecture.md, "The GSI (QP1)".
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::engine::{
    shard_of_qpn, AddressVector, QpCaps, QpType, RecvWr, SendFlags, SendWr, UdDest, Wc, WcOpcode,
    WcStatus, WrOp, GSI_QKEY, GSI_QPN,
};
use crate::wire::addr::{Gid, MacAddr};

use super::cq::{CompletionChannel, Cq};
use super::device::Device;
use super::error::{Result, VerbsError};
use super::pd::{Mr, Pd};
use super::qp::{Qp, QpInitAttr};
use super::runtime::lock;
use super::Access;

/// A management datagram's size (IBTA 13.4.2): the GSI carries exactly these.
pub const MAD_LEN: usize = 256;

/// The 40-byte GRH area a UD receive buffer starts with (IBTA 11.4.1.2).
const GRH_LEN: usize = 40;

/// One receive buffer: the GRH area and a MAD.
const SLOT_LEN: usize = GRH_LEN + MAD_LEN;

/// Receive buffers posted at any time.
const RECV_SLOTS: u32 = 64;

/// Where a MAD goes (or came from): the remote port and QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MadAddress {
    /// The remote GID (its IP address).
    pub gid: Gid,
    /// The remote QPN: 1 for another GSI (CM MADs go QP1 to QP1).
    pub qpn: u32,
    /// The remote Q_Key: [`GSI_QKEY`] for QP1. A Q_Key with bit 31 set sends the GSI's own
    /// (IBTA 3.5.3), which is the same thing.
    pub qkey: u32,
    /// The P_Key index: the table has one entry, 0 (P_Key 0xFFFF).
    pub pkey_index: u16,
    /// The local GID index to send from (the source address).
    pub sgid_index: u8,
    /// The next hop's MAC when known (a received MAD's sender); `None`: resolved through the
    /// neighbour table at send time.
    pub mac: Option<MacAddr>,
    /// IPv4 TTL / IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class.
    pub traffic_class: u8,
    /// UDP source port; `None`: rxe's rule for (QP1, `qpn`), which rxe's own QP1 uses.
    pub udp_src_port: Option<u16>,
}

impl MadAddress {
    /// QP1 at `gid`, sent from local GID index `sgid_index`, MAC resolved when sending.
    pub fn gsi(gid: Gid, sgid_index: u8) -> MadAddress {
        MadAddress {
            gid,
            qpn: GSI_QPN,
            qkey: GSI_QKEY,
            pkey_index: 0,
            sgid_index,
            mac: None,
            hop_limit: 64,
            traffic_class: 0,
            udp_src_port: None,
        }
    }
}

/// A MAD that arrived at the GSI, with its sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedMad {
    /// The 256 bytes.
    pub mad: Box<[u8; MAD_LEN]>,
    /// The sender's GID (IP source address).
    pub src_gid: Gid,
    /// The sender's QPN (DETH source QP): 1 for another GSI.
    pub src_qpn: u32,
    /// The sender's MAC (Ethernet source): the next hop to answer through (all zero from a
    /// driver that does not see Ethernet headers, the kernel UDP socket's).
    pub src_mac: MacAddr,
    /// The local GID it was sent to (IP destination address).
    pub dest_gid: Gid,
    /// That GID's index in the device's table (`None` if it is gone since).
    pub dest_gid_index: Option<u32>,
    /// The P_Key index it matched: always 0, the one entry (P_Key 0xFFFF; frames of other
    /// partitions are dropped before the GSI, `drops.bad_pkey`).
    pub pkey_index: u16,
    /// IPv4 TTL / IPv6 hop limit it arrived with.
    pub hop_limit: u8,
    /// IPv4 TOS / IPv6 traffic class it arrived with.
    pub traffic_class: u8,
}

impl ReceivedMad {
    /// Where an answer goes: the sender's QP, through the MAC the MAD came from (when the
    /// driver saw one), from the local GID it was sent to, with the GSI's Q_Key.
    pub fn reply_to(&self) -> MadAddress {
        MadAddress {
            gid: self.src_gid,
            qpn: self.src_qpn,
            qkey: GSI_QKEY,
            pkey_index: 0,
            sgid_index: self.dest_gid_index.unwrap_or(0).min(255) as u8,
            // A driver that cannot see the Ethernet header (the kernel UDP socket) reports
            // the zero MAC: then the neighbour table answers at send time.
            mac: is_unicast(self.src_mac).then_some(self.src_mac),
            hop_limit: 64,
            traffic_class: self.traffic_class,
            udp_src_port: None,
        }
    }
}

fn is_unicast(mac: MacAddr) -> bool {
    mac.0 != [0; 6] && mac.0[0] & 1 == 0
}

/// What the GSI counted on its own (the engine's `gsi_*` counters count frames).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GsiStats {
    /// MADs received and handed out.
    pub received: u64,
    /// Receive completions that were not a MAD: a wrong length or a failed status
    /// (dropped; the buffer is posted again).
    pub bad_receives: u64,
    /// Sends that completed with an error status (after the post succeeded).
    pub send_errors: u64,
}

/// The GSI of a device, QP1 (`Device::open_gsi`). Closing it (drop) frees QP1.
pub struct Gsi {
    device: Device,
    qp: Qp,
    cq: Cq,
    channel: CompletionChannel,
    recv_mr: Mr,
    stats: Mutex<GsiStats>,
    _pd: Pd,
}

impl std::fmt::Debug for Gsi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gsi")
            .field("device", &self.device.name())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Device {
    /// Opens the device's GSI, QP1, ready to send and receive MADs. One per device: while
    /// one is open, another is [`crate::engine::EngineError::GsiExists`]. A device behind a
    /// relay has its own: the relay hands it the CM MADs for its process.
    pub fn open_gsi(&self) -> Result<Gsi> {
        let pd = self.alloc_pd()?;
        let channel = self.create_comp_channel()?;
        let shard = shard_of_qpn(GSI_QPN, self.shard_count());
        let cq = self.create_cq_on_shard(2 * RECV_SLOTS + 64, Some(&channel), shard)?;
        let init = QpInitAttr {
            qp_type: QpType::Ud,
            send_cq: &cq,
            recv_cq: &cq,
            cap: QpCaps {
                max_send_wr: 64,
                max_recv_wr: RECV_SLOTS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: MAD_LEN as u32,
            },
            // Only failed sends complete: a MAD sent is not news.
            sq_sig_all: false,
            srq: None,
        };
        let qp = Qp::create_gsi(&pd, &init)?;
        let recv_mr = pd.reg_mr(SLOT_LEN * RECV_SLOTS as usize, Access::LOCAL_WRITE)?;
        let gsi = Gsi {
            device: self.clone(),
            qp,
            cq,
            channel,
            recv_mr,
            stats: Mutex::new(GsiStats::default()),
            _pd: pd,
        };
        for slot in 0..RECV_SLOTS {
            gsi.post_slot(slot as u64)?;
        }
        Ok(gsi)
    }
}

impl Gsi {
    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// What it counted.
    pub fn stats(&self) -> GsiStats {
        *lock(&self.stats)
    }

    fn post_slot(&self, slot: u64) -> Result<()> {
        self.qp.post_recv(&RecvWr {
            wr_id: slot,
            sg_list: vec![self
                .recv_mr
                .sge(slot as usize * SLOT_LEN, SLOT_LEN as u32)?],
        })
    }

    /// Sends `mad` to `to` (queued; UD: no acknowledgement, a lost MAD is the CM's to
    /// retry). Resolves the MAC first when `to.mac` is `None` (which may wait up to the
    /// device's neighbour timeout). A full send queue is
    /// [`crate::engine::EngineError::QueueFull`].
    pub fn send(&self, to: &MadAddress, mad: &[u8; MAD_LEN]) -> Result<()> {
        if to.pkey_index != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "P_Key index {} (the P_Key table has one entry, 0)",
                to.pkey_index
            )));
        }
        let sgid = self.device.query_gid(to.sgid_index as u32)?;
        let ip = to.gid.to_ip();
        if sgid.is_ipv4() != to.gid.is_ipv4() {
            return Err(VerbsError::InvalidArgument(format!(
                "source GID {sgid} (index {}) and destination GID {} are not the same IP family",
                to.sgid_index, to.gid
            )));
        }
        let mac = match to.mac {
            Some(mac) => mac,
            None => self.device.resolve_mac(ip)?,
        };
        let mut av = AddressVector::new(mac.0, ip);
        av.sgid_index = to.sgid_index;
        av.hop_limit = to.hop_limit;
        av.traffic_class = to.traffic_class;
        av.udp_src_port = to.udp_src_port;
        let wr = SendWr {
            wr_id: 0,
            op: WrOp::Send,
            sg_list: Vec::new(),
            flags: SendFlags::INLINE,
            ud: Some(UdDest {
                av,
                remote_qpn: to.qpn & 0xFF_FFFF,
                remote_qkey: to.qkey,
            }),
        };
        self.qp.post_send_inline(&wr, mad)?;
        // A post while this thread counts as a poller of the shard leaves the frame for
        // its next poll; a CM thread may wait elsewhere next (another device, a timer), so
        // the MAD goes out now and the background thread keeps the driver.
        self.device.shared().stop_polling();
        Ok(())
    }

    /// The next MAD received, if one is waiting (drives the device's progress when nobody
    /// else does, like [`Cq::poll`]).
    pub fn poll_recv(&self) -> Result<Option<ReceivedMad>> {
        while let Some(wc) = self.cq.poll_one()? {
            if let Some(mad) = self.take(&wc)? {
                return Ok(Some(mad));
            }
        }
        Ok(None)
    }

    /// The next MAD received, without driving the device's progress (the background thread
    /// does): for a thread that waits on [`Gsi::as_fd`] between polls, like the RDMA CM's.
    pub fn poll_recv_quietly(&self) -> Result<Option<ReceivedMad>> {
        self.take_quietly()
    }

    fn take_quietly(&self) -> Result<Option<ReceivedMad>> {
        while let Some(wc) = self.cq.take_one_quietly()? {
            if let Some(mad) = self.take(&wc)? {
                return Ok(Some(mad));
            }
        }
        Ok(None)
    }

    /// Waits up to `timeout` for a MAD: [`VerbsError::Timeout`] if none came.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<ReceivedMad> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(mad) = self.poll_recv()? {
                return Ok(mad);
            }
            self.arm()?;
            // A MAD that came between the poll and the arming raised no event. Looked for
            // without driving progress: a poll here would keep the background thread off the
            // driver while this thread sleeps.
            if let Some(mad) = self.take_quietly()? {
                return Ok(mad);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(VerbsError::Timeout(timeout));
            }
            match self.channel.get_cq_event(Some(left)) {
                Ok(_) | Err(VerbsError::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Asks for an event on [`Gsi::as_fd`] at the next completion: call it when
    /// [`Gsi::poll_recv`] returned `None`, then wait for the fd to become readable and
    /// poll again. (A MAD that came just before the arming raised no event:
    /// [`Gsi::recv_timeout`] looks for it before sleeping.)
    pub fn arm(&self) -> Result<()> {
        while self.channel.try_get_cq_event().is_some() {}
        self.cq.req_notify(false)
    }

    /// Turns one completion into a MAD (or counts it), and gives its buffer back.
    fn take(&self, wc: &Wc) -> Result<Option<ReceivedMad>> {
        if wc.opcode != WcOpcode::Recv {
            if wc.status != WcStatus::Success {
                lock(&self.stats).send_errors += 1;
            }
            return Ok(None);
        }
        let slot = wc.wr_id;
        let got = if wc.status == WcStatus::Success && wc.byte_len as usize == SLOT_LEN {
            let mut buf = [0u8; SLOT_LEN];
            self.recv_mr.read(slot as usize * SLOT_LEN, &mut buf)?;
            self.parse(wc, &buf)
        } else {
            None
        };
        // A flushed WR (the QP was closed or failed) is not posted again.
        if wc.status != WcStatus::WrFlushErr {
            self.post_slot(slot)?;
        }
        let mut stats = lock(&self.stats);
        match &got {
            Some(_) => stats.received += 1,
            None => stats.bad_receives += 1,
        }
        Ok(got)
    }

    fn parse(&self, wc: &Wc, buf: &[u8; SLOT_LEN]) -> Option<ReceivedMad> {
        let src_ip = wc.sender_ip?;
        let src_mac = MacAddr(wc.sender_mac?);
        let grh = &buf[..GRH_LEN];
        // The GRH area holds the IPv6 header, or the IPv4 header in its last 20 bytes.
        let (dest_ip, hop_limit, traffic_class) = match src_ip {
            IpAddr::V4(_) => {
                let v4 = &grh[20..];
                let dst = Ipv4Addr::new(v4[16], v4[17], v4[18], v4[19]);
                (IpAddr::V4(dst), v4[8], v4[1])
            }
            IpAddr::V6(_) => {
                let dst: [u8; 16] = grh[24..40].try_into().ok()?;
                let tc = (grh[0] << 4) | (grh[1] >> 4);
                (IpAddr::V6(Ipv6Addr::from(dst)), grh[7], tc)
            }
        };
        let mut mad = Box::new([0u8; MAD_LEN]);
        mad.copy_from_slice(&buf[GRH_LEN..]);
        Some(ReceivedMad {
            mad,
            src_gid: Gid::from_ip(src_ip),
            src_qpn: wc.src_qp,
            src_mac,
            dest_gid: Gid::from_ip(dest_ip),
            dest_gid_index: self.device.gid_index_of(dest_ip),
            pkey_index: 0,
            hop_limit,
            traffic_class,
        })
    }
}

impl AsFd for Gsi {
    /// Readable when a completion arrived after [`Gsi::arm`].
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }
}
