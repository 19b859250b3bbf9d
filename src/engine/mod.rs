//! The sans-IO RoCEv2 transport engine: RC and UD queue pairs over Ethernet frames.
//!
//! An [`Engine`] is one RDMA device (one port, one MAC, a GID table). It does no I/O and
//! reads no clock: time is always an argument, an [`Instant`] on the caller's clock
//! (nanoseconds since an epoch the caller chooses: when its progress loop started, or zero of
//! the simulator's virtual clock); how long something lasts is a `Duration`.
//!
//! # Calling order (quinn-proto style)
//!
//! Set-up, from the verbs layer, at any time:
//! `alloc_pd` → `reg_mr` → `create_cq` → `create_qp` → `modify_qp` (RESET→INIT→RTR→RTS with
//! the attributes of [`state::transition_rule`]) → `post_recv` / `post_send`.
//!
//! Then a progress loop (one thread, the engine behind a `Mutex` if others post):
//! 1. for every received frame: [`Engine::handle_frame`]`(now, frame)`
//!    (or [`Engine::handle_frame_unverified`] when the driver cannot see the IP header the
//!    ICRC covers);
//! 2. if `now >= poll_timeout()`: [`Engine::handle_timeout`]`(now)`;
//! 3. drain [`Engine::poll_transmit`]`(now, &mut buf)` until it returns `None`, sending each
//!    frame (`buf` must hold [`MAX_FRAME_LEN`] bytes);
//! 4. drain [`Engine::poll_event`] (wake completion channels) and let users
//!    [`Engine::poll_cq`];
//! 5. sleep until a frame arrives, a WR is posted, or [`Engine::poll_timeout`].
//!
//! Any call that changes state (post, modify, handle_*) may create output: always run
//! steps 3–4 after it.
//!
//! # Where each job lives
//! - `mod.rs`: the [`Engine`] and its configuration, the device-wide state, the timer entry
//!   points ([`Engine::handle_timeout`], [`Engine::poll_timeout`]).
//! - `objects`: creating, querying and destroying PDs, MRs, CQs and QPs.
//! - `gsi`: the general services interface, QP1 (its Q_Key rule, [`Engine::create_gsi`]).
//! - `srq`: shared receive queues (their table, shared by the shards, and the limit event).
//! - `mw`: memory windows (allocate, bind, deallocate) and the send queue's local
//!   operations (BIND_MW, LOCAL_INV).
//! - `modify`: `modify_qp` (masks checked by `state`, values range-checked there).
//! - `post`: `post_send` / `post_recv`.
//! - `receive`: the receive demultiplexer ([`Engine::handle_frame`]): parse, addresses, P_Key,
//!   QP, transport, then the responder or the completer.
//! - `transmit`: the round-robin transmit list and [`Engine::poll_transmit`], which builds
//!   each frame from what the responder or requester hands it.
//!
//! The transport itself, as rxe divides it:
//! - `requester`: turns send WQEs into request packets (segmentation by path MTU, AckReq
//!   policy, the 128-PSN window, max_rd_atomic, fences).
//! - `responder`: checks each request (PSN, op sequence, lengths, R_Key/PD/access/bounds,
//!   receive WQEs, RNR), executes it and queues ACKs, NAKs, READ responses, atomic ACKs;
//!   answers duplicates from saved resources.
//! - `completer`: consumes ACKs, NAKs and responses: completes WQEs in order, go-back-N,
//!   RNR waits, retry counting, error mapping and flushing.
//!
//! Below the three, the rooms they all end their work in: `completion` (the completion of a
//! send or receive WQE, posting it to its CQ, the state changes the engine makes itself:
//! flush to ERR, fail a QP, SQ drained) and `outgoing` (the `OutPacket` they hand
//! to transmit, and the transmit list). No room imports one on its floor or above
//! (tests/layers.rs, `ENGINE_FLOORS`).
//!
//! Beside them: `qp` (per-QP state), `state` (the transition table), `mr`, `cq`, `av`
//! (address vector checks), `timers`, `counters`, `types` (the public value types).
//!
//! Three kinds of failure never mix: malformed or unexpected packets are counted drops
//! ([`Counters::drops`]); remote failures are completion statuses ([`WcStatus`]); API misuse is
//! an [`EngineError`].
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;

pub mod av;
mod completer;
mod completion;
pub mod counters;
mod cq;
mod gsi;
pub mod limits;
mod modify;
mod mr;
mod mw;
mod objects;
mod outgoing;
mod post;
mod qp;
mod receive;
mod requester;
mod responder;
mod shared_table;
mod srq;
pub mod state;
pub mod time;
pub mod timers;
mod transmit;
pub mod types;

pub use counters::{Counters, DropCounters};
pub use gsi::{CONTROLLED_QKEY_BIT, GSI_QKEY, GSI_QPN};
pub use mr::MrMemory;
pub use mw::MwInfo;
pub use objects::{check_mr_access, MrChange, MrInfo};
pub use time::Instant;

pub use types::*;
// The path MTU is a wire fact; the engine's API names it too.
pub use crate::wire::{Mtu, ROCE_HEADER_ALLOWANCE};

use cq::CqTable;
use mr::MrTable;
use outgoing::schedule;
use qp::Qp;
use srq::SrqTable;
use timers::TimerQueue;

/// Largest frame the engine emits: Ethernet+VLAN 18, IPv6 40, UDP 8, BTH 12, the largest
/// extension headers 28, payload 4096, pad 3, ICRC 4.
pub const MAX_FRAME_LEN: usize = 18 + 40 + 8 + 12 + 28 + 4096 + 3 + 4;

/// Header bytes a frame may need beyond its payload (see [`MAX_FRAME_LEN`]).
const MAX_FRAME_OVERHEAD: usize = MAX_FRAME_LEN - 4096;

/// The buffer [`Engine::poll_transmit`] needs when no QP's path MTU exceeds `mtu`: what to
/// ask a driver's `send_with` for, so that the frame can be written straight into its
/// transmit memory (a larger buffer is never needed; a smaller one is refused).
pub fn transmit_buffer_len(mtu: Mtu) -> usize {
    mtu.bytes() as usize + MAX_FRAME_OVERHEAD
}

/// rxe: at most 128 unacknowledged PSNs per QP.
pub const MAX_UNACKED_PSNS: i32 = 128;

/// rxe sets AckReq at least every this many packets (and on the last packet of a message).
pub const ACK_REQ_INTERVAL: u32 = 64;

/// The last packet of a message followed at once by another asks for an ACK at least every
/// this many packets: the requester's completions (and so the application's next posts) then
/// wait for at most this many packets' worth of ACK coalescing.
pub const FOLLOWED_ACK_REQ_INTERVAL: u32 = 16;

/// The default P_Key (full membership, default partition).
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// ACK credit code "unlimited" (what rxe sends).
pub const CREDIT_UNLIMITED: u8 = 0x1F;

/// Static configuration of one engine (one device port).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// The port's MAC address (Ethernet source of every frame).
    pub mac: [u8; 6],
    /// The GID table as addresses: index = GID index. An IPv4 address stands for its
    /// IPv4-mapped GID `::ffff:a.b.c.d`. Frames to other addresses are dropped.
    pub gids: Vec<IpAddr>,
    /// IPv4 identification: `None` = a per-engine counter (like rxe); `Some(v)` = always v
    /// (0 with DF matches what a kernel UDP socket sends, so the ICRC stays valid there).
    pub fixed_ip_ident: Option<u16>,
    /// `Some(p)` (1..=255): every QPN this engine allocates has `p` in bits 16..23, so the
    /// engines of several processes on one interface (behind one relay, see
    /// [`crate::driver::relay`]) number their QPs disjointly and a frame's destination QPN
    /// names the process that owns it. `None` (the default): QPNs from 0x11 up, as rxe.
    pub qpn_prefix: Option<u8>,
    /// The port's active MTU: the largest IB MTU the link carries. A UD QP sends messages up
    /// to it (IBTA 9.8.3: a UD message is one packet), and an RC/UC path MTU above it is
    /// refused (rxe and mlx5 refuse it too: frames the link cannot carry would be lost).
    pub port_mtu: Mtu,
}

impl EngineConfig {
    /// A configuration with one GID.
    pub fn new(mac: [u8; 6], ip: IpAddr) -> EngineConfig {
        EngineConfig {
            mac,
            gids: vec![ip],
            fixed_ip_ident: None,
            qpn_prefix: None,
            port_mtu: Mtu::Mtu4096,
        }
    }
}

/// The device-wide state a QP's processing touches besides the QP itself (passed around as
/// `sh`): configuration, memory regions, completion queues, counters, events.
pub(crate) struct DeviceState {
    pub cfg: EngineConfig,
    /// Shared with the other shards of the device, if any.
    pub mrs: MrTable,
    /// Shared with the other shards of the device, if any.
    pub cqs: CqTable,
    /// Shared with the other shards of the device, if any.
    pub srqs: SrqTable,
    pub counters: Counters,
    pub events: VecDeque<Event>,
    /// Reused buffer for gathering payloads.
    pub scratch: Vec<u8>,
    pub ip_ident: u16,
    /// Why the last frame that could not be emitted failed (see `Counters::emit_failed`).
    pub last_emit_error: Option<String>,
}

/// Which shard of a device owns the QP `qpn` when the device has `count` shards.
pub fn shard_of_qpn(qpn: u32, count: u32) -> u32 {
    qpn % count.max(1)
}

/// An engine's place among its device's shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ShardPlace {
    index: u32,
    count: u32,
    /// The QPN prefix (bits 16..23) of every QPN, 0 for none ([`EngineConfig::qpn_prefix`]).
    prefix: u8,
}

impl ShardPlace {
    /// rxe numbers QPs from 17 (0 and 1 are the special QPs): the first of those in this
    /// shard's lane.
    fn first_qpn(self) -> u32 {
        let mut qpn = self.lowest() | 0x11;
        while shard_of_qpn(qpn, self.count) != self.index {
            qpn += 1;
        }
        qpn
    }

    /// The lowest QPN of the prefix's range (0 without a prefix).
    fn lowest(self) -> u32 {
        u32::from(self.prefix) << 16
    }

    /// The highest QPN this engine may number a QP: the top of its prefix's range, or 2^24-1.
    fn highest(self) -> u32 {
        if self.prefix == 0 {
            0xFF_FFFF
        } else {
            self.lowest() | 0xFFFF
        }
    }

    /// Whether `qpn` lies in this engine's range (its prefix's, or all of them).
    fn owns_range(self, qpn: u32) -> bool {
        self.prefix == 0 || qpn >> 16 == u32::from(self.prefix)
    }

    /// The QPN after `qpn` in this shard's lane, wrapping to the first of its range.
    fn next_qpn(self, qpn: u32) -> u32 {
        let next = qpn + self.count;
        if next > self.highest() {
            self.first_qpn()
        } else {
            next
        }
    }
}

/// The tables a device's shards share.
#[derive(Default)]
struct Tables {
    mrs: MrTable,
    cqs: CqTable,
    srqs: SrqTable,
    pds: Arc<objects::PdTable>,
}

/// Hasher for QPN keys: QPNs are small distinct integers, so one multiply spreads them well
/// enough and costs far less than SipHash on every received packet.
#[derive(Default, Clone, Copy)]
pub(crate) struct QpnHasher(u64);

impl std::hash::Hasher for QpnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ v as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type QpMap = HashMap<u32, Qp, std::hash::BuildHasherDefault<QpnHasher>>;

/// The transport engine of one device. See the module docs for the calling order.
pub struct Engine {
    sh: DeviceState,
    qps: QpMap,
    /// Shared with the other shards of the device, if any.
    pds: Arc<objects::PdTable>,
    next_qpn: u32,
    /// This engine's shard of the device: it numbers its QPs `qpn % count == index`, so a
    /// frame's destination QPN names the shard that owns the QP.
    shard: ShardPlace,
    /// QPs that may have a packet to send, round robin.
    tx_list: VecDeque<u32>,
    /// The QP of the frame the last `poll_transmit` returned (for `report_send_failure`).
    last_tx: Option<u32>,
    /// The UD completion of that frame, if it was a UD send (kept apart so that an RC
    /// frame stores one word, not a `Wc`, on every transmit).
    last_tx_ud: Option<(Wc, bool)>,
    /// Where `poll_transmit` has the requester or responder build the next packet: built in
    /// place, never moved (a few hundred bytes).
    out_packet: outgoing::OutPacket,
    /// Each QP's next timer deadline, earliest first. Every entry point that may change a
    /// QP's deadlines calls [`Engine::sync_timer`] for it afterwards.
    timers: TimerQueue,
    /// Reused list of the QPs whose timers expired (`handle_timeout`).
    expired: Vec<u32>,
    /// QPs `handle_timeout` has visited, ever (for tests: only expired QPs are visited).
    timer_visits: u64,
    /// Completions `poll_cq`/`poll_cq_one` have handed out, ever.
    completions_polled: u64,
}

impl Engine {
    /// A new engine with no objects.
    pub fn new(cfg: EngineConfig) -> Engine {
        let prefix = cfg.qpn_prefix.unwrap_or(0);
        Engine::shard_of(
            cfg,
            ShardPlace {
                index: 0,
                count: 1,
                prefix,
            },
            &Tables::default(),
        )
    }

    /// `count` engines (1..=64) that are the shards of one device: they share its PDs, MRs,
    /// CQs and SRQs (a QP on one shard may use a region or complete into a CQ another shard's
    /// QPs use too), and each owns the QPs it creates, numbered `qpn % count == shard`
    /// ([`shard_of_qpn`]). Each is driven on its own (its own lock, its own frames): a frame
    /// belongs to the shard of its destination QPN.
    pub fn new_shards(cfg: EngineConfig, count: u32) -> Vec<Engine> {
        let count = count.clamp(1, 64);
        let tables = Tables::default();
        let prefix = cfg.qpn_prefix.unwrap_or(0);
        (0..count)
            .map(|index| {
                let shard = ShardPlace {
                    index,
                    count,
                    prefix,
                };
                Engine::shard_of(cfg.clone(), shard, &tables)
            })
            .collect()
    }

    fn shard_of(cfg: EngineConfig, shard: ShardPlace, tables: &Tables) -> Engine {
        Engine {
            sh: DeviceState {
                cfg,
                mrs: tables.mrs.clone(),
                cqs: tables.cqs.clone(),
                srqs: tables.srqs.clone(),
                counters: Counters::default(),
                events: VecDeque::new(),
                scratch: vec![0; 4096],
                ip_ident: 0,
                last_emit_error: None,
            },
            qps: QpMap::default(),
            pds: tables.pds.clone(),
            next_qpn: shard.first_qpn(),
            shard,
            tx_list: VecDeque::new(),
            last_tx: None,
            last_tx_ud: None,
            out_packet: outgoing::OutPacket::new(
                AddressVector::new(
                    [0; 6],
                    std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                ),
                0,
                crate::wire::Opcode(0),
                crate::wire::Psn::new(0),
            ),
            timers: TimerQueue::default(),
            expired: Vec::new(),
            timer_visits: 0,
            completions_polled: 0,
        }
    }

    /// This engine's shard index and the device's shard count (0 and 1 for a lone engine).
    pub fn shard(&self) -> (u32, u32) {
        (self.shard.index, self.shard.count)
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.sh.cfg
    }

    /// Counters (rxe names plus drops by reason).
    pub fn counters(&self) -> &Counters {
        &self.sh.counters
    }

    /// Why the last frame that could not be emitted failed, with its QP (each such failure
    /// is counted in [`Counters::emit_failed`]).
    pub fn last_emit_error(&self) -> Option<&str> {
        self.sh.last_emit_error.as_deref()
    }

    /// Next asynchronous event, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.sh.events.pop_front()
    }

    /// Run the timers that are due at `now` (local ACK timeout, RNR wait). Only the QPs
    /// whose deadline has come are visited.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut expired = std::mem::take(&mut self.expired);
        while let Some(qpn) = self.timers.pop_expired(now) {
            expired.push(qpn);
        }
        for &qpn in &expired {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            self.timer_visits += 1;
            if completer::handle_timers(qp, &mut self.sh, now) {
                schedule(&mut self.tx_list, qp);
            }
            self.timers.set(qpn, qp.req.next_deadline());
        }
        expired.clear();
        self.expired = expired;
    }

    /// Whether some QP may have a frame for [`Engine::poll_transmit`] (a queued response or
    /// ACK, a request waiting to go): false means `poll_transmit` would return `None`.
    #[must_use]
    pub fn may_transmit(&self) -> bool {
        !self.tx_list.is_empty()
    }

    /// Completions [`Engine::poll_cq`] and [`Engine::poll_cq_one`] have handed out since the
    /// engine was made (a caller compares two readings).
    #[must_use]
    pub fn completions_polled(&self) -> u64 {
        self.completions_polled
    }

    /// The earliest time `handle_timeout` has work to do.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let next = self.timers.next_deadline();
        // Debug builds check the queue against the scan it replaces, while that is cheap.
        if cfg!(debug_assertions) && self.qps.len() <= 64 {
            let scan = self
                .qps
                .values()
                .filter_map(|q| q.req.next_deadline())
                .min();
            assert_eq!(next, scan, "the timer queue lost track of a QP's deadline");
        }
        next
    }

    /// QPs `handle_timeout` has visited since the engine was created: one per expired
    /// timer, however many QPs exist (introspection for tests).
    #[doc(hidden)]
    pub fn timer_visits(&self) -> u64 {
        self.timer_visits
    }

    /// Record a QP's deadlines in the timer queue after something may have changed them.
    fn sync_timer(timers: &mut TimerQueue, qp: &Qp) {
        timers.set(qp.qpn, qp.req.next_deadline());
    }
}

#[cfg(test)]
mod qpn_prefix_tests {
    use super::ShardPlace;

    fn shard(index: u32, count: u32, prefix: u8) -> ShardPlace {
        ShardPlace {
            index,
            count,
            prefix,
        }
    }

    #[test]
    fn without_a_prefix_qpns_start_at_0x11_and_wrap_below_2_pow_24() {
        let s = shard(0, 1, 0);
        assert_eq!(s.first_qpn(), 0x11);
        assert_eq!(s.next_qpn(0x11), 0x12);
        assert_eq!(s.next_qpn(0xFF_FFFF), 0x11);
        assert!(s.owns_range(0x12_3456));
    }

    #[test]
    fn a_prefix_keeps_every_qpn_in_its_bits_16_to_23() {
        let s = shard(0, 1, 3);
        assert_eq!(s.first_qpn(), 0x03_0011);
        assert_eq!(s.next_qpn(0x03_0011), 0x03_0012);
        // The top of the range wraps to its start, never into the next prefix.
        assert_eq!(s.next_qpn(0x03_FFFF), 0x03_0011);
        assert!(s.owns_range(0x03_0000) && s.owns_range(0x03_FFFF));
        assert!(!s.owns_range(0x04_0011) && !s.owns_range(0x11));
    }

    #[test]
    fn shards_with_a_prefix_keep_their_lanes_inside_it() {
        for index in 0..4 {
            let s = shard(index, 4, 0x7f);
            let mut q = s.first_qpn();
            for _ in 0..20_000 {
                assert_eq!(q >> 16, 0x7f, "{q:#x}");
                assert_eq!(q % 4, index, "{q:#x}");
                q = s.next_qpn(q);
            }
        }
    }

    #[test]
    fn an_engine_with_a_prefix_numbers_and_accepts_qpns_in_it() {
        use crate::engine::{Engine, EngineConfig};
        let mut cfg = EngineConfig::new([2, 0, 0, 0, 0, 1], [198, 18, 0, 1].into());
        cfg.qpn_prefix = Some(5);
        let engine = Engine::new(cfg);
        assert_eq!(engine.next_qpn, 0x05_0011);
        assert_eq!(engine.shard.prefix, 5);
    }
}
