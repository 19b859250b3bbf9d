//! A deterministic simulated network for [`Engine`]s: two endpoints joined by a link with
//! latency, a rate limit and seeded loss, reordering, duplication and corruption, on a
//! virtual clock. Optional pcap of everything on the link and a readable packet trace.
//!
//! The driving loop is the engine's calling order (see [`crate::engine`]): drain
//! `poll_transmit` of both engines onto the link, advance the clock to the next event (a
//! frame arriving or an engine timer), deliver frames / run timers, repeat.
//! The same seed gives the same run, byte for byte.
pub mod workload;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::capture::EthernetPcapWriter;
use crate::engine::{Engine, EngineError, Instant, MAX_FRAME_LEN};
use crate::wire::{self, IpRepr, Opcode, Psn, Syndrome};

/// Properties of the simulated link (the same in both directions).
/// Why a simulated run could not go on. What a run finds wrong with the transport is not an
/// error: it is the summary's violations.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot write the capture {}: {why}", path.display())]
    Pcap {
        path: std::path::PathBuf,
        why: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Line rate in bits per second (`None` = no serialization delay).
    pub rate_bps: Option<u64>,
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is delayed by up to `reorder_delay` extra, so later frames pass it.
    pub reorder: f64,
    /// Extra delay bound for a reordered frame.
    pub reorder_delay: Duration,
    /// Probability a frame arrives twice.
    pub duplicate: f64,
    /// Probability one byte of the frame's ICRC-covered part is flipped.
    pub corrupt: f64,
    /// Drop every frame after this many have been sent (a partition).
    pub partition_after: Option<u64>,
}

impl Default for LinkConfig {
    fn default() -> LinkConfig {
        LinkConfig {
            latency: Duration::from_micros(5),
            rate_bps: Some(25_000_000_000),
            loss: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::from_micros(20),
            duplicate: 0.0,
            corrupt: 0.0,
            partition_after: None,
        }
    }
}

/// What happened on the link.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Frames handed to the link.
    pub frames_sent: u64,
    /// Frames delivered (duplicates count twice).
    pub frames_delivered: u64,
    /// Frames lost at random.
    pub lost: u64,
    /// Frames dropped by the partition.
    pub partitioned: u64,
    /// Frames delivered twice.
    pub duplicated: u64,
    /// Frames corrupted.
    pub corrupted: u64,
    /// Frames delayed so others could pass them.
    pub reordered: u64,
    /// Bytes handed to the link.
    pub bytes_sent: u64,
}

/// What a test filter decides for one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Apply the link's normal (random) behaviour.
    Pass,
    /// Drop this frame.
    Drop,
    /// Deliver it twice.
    Duplicate,
    /// Deliver it this much later than normal (so later frames overtake it).
    Delay(Duration),
}

/// A frame as a filter sees it: direction, number on the link (1-based), the bytes.
pub struct FrameInfo<'a> {
    /// 0 = sent by A, 1 = sent by B.
    pub from: usize,
    /// Count of frames put on the link so far, this one included.
    pub number: u64,
    /// The frame.
    pub bytes: &'a [u8],
}

impl FrameInfo<'_> {
    /// The parsed RoCE packet, if the frame parses.
    pub fn packet(&self) -> Option<wire::PacketRepr<'_>> {
        wire::parse_frame(self.bytes).ok().map(|p| p.repr.roce)
    }
}

/// A deterministic per-frame hook for scenario tests (drop the 3rd READ response, ...).
pub type Filter = Box<dyn FnMut(&FrameInfo<'_>) -> Verdict>;

struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    frame: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

/// Two engines joined by a simulated link on a virtual clock.
pub struct Network {
    /// Endpoint A (index 0) and B (index 1).
    pub engines: [Engine; 2],
    now: Instant,
    link: LinkConfig,
    rng: ChaCha8Rng,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    busy_until: [Instant; 2],
    seq: u64,
    stats: LinkStats,
    pcap: Option<EthernetPcapWriter<BufWriter<File>>>,
    trace: Option<Box<dyn Write>>,
    /// Under each frame's trace line, its headers field by field.
    trace_explain: bool,
    filter: Option<Filter>,
    /// Per direction and destination QP: one past the highest request PSN seen (marks
    /// retransmissions in the trace).
    high_psn: std::collections::HashMap<(usize, u32), Psn>,
    buf: Vec<u8>,
    /// Transmit queue bound (see [`Network::set_tx_queue_limit`]).
    tx_queue_limit: Option<Duration>,
    /// Per direction: the last flush stopped at the queue bound.
    tx_blocked: [bool; 2],
}

/// Indentation of a traced frame's explanation: its headings start under the arrow.
const TRACE_EXPLAIN_LEVEL: usize = 7;

/// Endpoint names in traces.
pub const NAMES: [&str; 2] = ["A", "B"];

impl Network {
    /// Join two engines with a link; `seed` drives every random fault.
    pub fn new(a: Engine, b: Engine, link: LinkConfig, seed: u64) -> Network {
        Network {
            engines: [a, b],
            now: Instant::ZERO,
            link,
            rng: ChaCha8Rng::seed_from_u64(seed),
            in_flight: BinaryHeap::new(),
            busy_until: [Instant::ZERO; 2],
            seq: 0,
            stats: LinkStats::default(),
            pcap: None,
            trace: None,
            trace_explain: false,
            filter: None,
            high_psn: Default::default(),
            buf: vec![0; MAX_FRAME_LEN],
            tx_queue_limit: None,
            tx_blocked: [false; 2],
        }
    }

    /// Write every frame put on the link to a pcap file (Ethernet link type), timestamped
    /// with virtual time.
    pub fn set_pcap(&mut self, path: &std::path::Path) -> Result<(), SimError> {
        let cannot_create = |e: std::io::Error| SimError::Pcap {
            path: path.to_path_buf(),
            why: e.to_string(),
        };
        let file = File::create(path).map_err(cannot_create)?;
        let writer =
            EthernetPcapWriter::new(BufWriter::new(file), 65535).map_err(|e| SimError::Pcap {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
        self.pcap = Some(writer);
        Ok(())
    }

    /// Print a line per frame (and per timer event) to `out`.
    pub fn set_trace(&mut self, out: Box<dyn Write>) {
        self.trace = Some(out);
    }

    /// Also explain every traced frame field by field ([`wire::PrettyPrint`], as
    /// `xroce dump --explain` does), indented under its line.
    pub fn set_trace_explain(&mut self, on: bool) {
        self.trace_explain = on;
    }

    /// Install a per-frame filter that can drop, duplicate or delay chosen frames.
    pub fn set_filter(&mut self, filter: impl FnMut(&FrameInfo<'_>) -> Verdict + 'static) {
        self.filter = Some(Box::new(filter));
    }

    /// Bound each endpoint's transmit queue, like a NIC ring: frames are taken from an
    /// engine only while less than `limit` of serialization time is queued on its side of
    /// the link. `None` (the default) takes every frame at once, so a multi-MiB READ
    /// response is entirely on the wire before any request that follows it is seen.
    pub fn set_tx_queue_limit(&mut self, limit: Option<Duration>) {
        self.tx_queue_limit = limit;
    }

    /// Remove the filter.
    pub fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// Change the link (e.g. heal a partition).
    pub fn link_mut(&mut self) -> &mut LinkConfig {
        &mut self.link
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// Link statistics.
    pub fn stats(&self) -> &LinkStats {
        &self.stats
    }

    /// Flush the pcap writer and the trace.
    pub fn finish(&mut self) {
        if let Some(p) = self.pcap.take() {
            let _ = p.into_inner().flush();
        }
        if let Some(t) = self.trace.as_mut() {
            let _ = t.flush();
        }
    }

    /// Write a comment line into the trace (if tracing).
    pub fn note(&mut self, text: &str) {
        let now = self.now;
        if let Some(t) = self.trace.as_mut() {
            let _ = writeln!(t, "{:>12} # {text}", fmt_time(now));
        }
    }

    /// Move every frame the engines want to send onto the link.
    pub fn flush_transmit(&mut self) {
        for from in 0..2 {
            self.tx_blocked[from] = false;
            loop {
                if let Some(limit) = self.tx_queue_limit {
                    if self.busy_until[from] > self.now + limit {
                        self.tx_blocked[from] = true;
                        break;
                    }
                }
                let Some(n) = self.engines[from].poll_transmit(self.now, &mut self.buf) else {
                    break;
                };
                let frame = self.buf[..n].to_vec();
                self.put_on_link(from, frame);
            }
        }
    }

    /// The next time something happens (a frame arrives or a timer fires).
    pub fn next_event(&self) -> Option<Instant> {
        let link = self.in_flight.peek().map(|r| r.0.at);
        let mut timers = self.engines.iter().filter_map(|e| e.poll_timeout()).min();
        if let Some(limit) = self.tx_queue_limit {
            // A blocked transmit queue has room again once it drained below the bound.
            for from in 0..2 {
                if self.tx_blocked[from] {
                    let room = self.busy_until[from] - limit;
                    timers = Some(timers.map_or(room, |t| t.min(room)));
                }
            }
        }
        match (link, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run one event: transmit, advance the clock to the next event, deliver/fire, transmit.
    /// Returns false if nothing at all is pending (the network is idle).
    pub fn step(&mut self) -> bool {
        self.flush_transmit();
        let Some(next) = self.next_event() else {
            return false;
        };
        if next > self.now {
            self.now = next;
        }
        while self.in_flight.peek().is_some_and(|r| r.0.at <= self.now) {
            let Some(Reverse(f)) = self.in_flight.pop() else {
                break;
            };
            self.stats.frames_delivered += 1;
            self.engines[f.to].handle_frame(self.now, &f.frame);
        }
        for (i, name) in NAMES.iter().enumerate() {
            if self.engines[i]
                .poll_timeout()
                .is_some_and(|t| t <= self.now)
            {
                let before = self.engines[i].counters().clone();
                self.engines[i].handle_timeout(self.now);
                let after = self.engines[i].counters().clone();
                if after.local_ack_timeout_err > before.local_ack_timeout_err {
                    let msg =
                        format!("{name}: local ACK timeout -> go back to the oldest unacked PSN");
                    self.note(&msg);
                }
                if after.retry_exceeded_err > before.retry_exceeded_err {
                    let msg = format!("{name}: retry_cnt exhausted -> RETRY_EXC_ERR, QP to ERR");
                    self.note(&msg);
                }
            }
        }
        self.flush_transmit();
        true
    }

    /// Step until `done()` holds or the network goes idle or `limit` virtual time passes.
    /// Returns true if `done()` held.
    pub fn run_until(
        &mut self,
        limit: Instant,
        mut done: impl FnMut(&mut Network) -> bool,
    ) -> bool {
        loop {
            if done(self) {
                return true;
            }
            if self.now > limit || !self.step() {
                return done(self);
            }
        }
    }

    fn put_on_link(&mut self, from: usize, mut frame: Vec<u8>) {
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += frame.len() as u64;
        let to = 1 - from;
        let mut tag = "";
        let mut copies = 1;
        let mut extra = Duration::ZERO;
        let partitioned = self
            .link
            .partition_after
            .is_some_and(|k| self.stats.frames_sent > k);
        let verdict = match self.filter.as_mut() {
            Some(f) => f(&FrameInfo {
                from,
                number: self.stats.frames_sent,
                bytes: &frame,
            }),
            None => Verdict::Pass,
        };
        if partitioned {
            self.stats.partitioned += 1;
            tag = "PARTITIONED";
            copies = 0;
        } else if verdict == Verdict::Drop {
            self.stats.lost += 1;
            tag = "DROPPED";
            copies = 0;
        } else if verdict == Verdict::Duplicate {
            self.stats.duplicated += 1;
            tag = "DUPLICATED";
            copies = 2;
        } else if let Verdict::Delay(d) = verdict {
            self.stats.reordered += 1;
            tag = "DELAYED";
            extra = d;
        } else if self.rng.gen_bool(probability(self.link.loss)) {
            self.stats.lost += 1;
            tag = "LOST";
            copies = 0;
        } else {
            if self.rng.gen_bool(probability(self.link.corrupt))
                && corrupt(&mut frame, &mut self.rng)
            {
                self.stats.corrupted += 1;
                tag = "CORRUPTED";
            }
            if self.rng.gen_bool(probability(self.link.duplicate)) {
                self.stats.duplicated += 1;
                copies = 2;
                if tag.is_empty() {
                    tag = "DUPLICATED";
                }
            }
            if self.rng.gen_bool(probability(self.link.reorder)) {
                self.stats.reordered += 1;
                let max = self.link.reorder_delay.as_nanos().max(1) as u64;
                extra = Duration::from_nanos(self.rng.gen_range(1..=max));
                if tag.is_empty() {
                    tag = "DELAYED";
                }
            }
        }
        // Serialization at the line rate, then propagation.
        let start = self.now.max(self.busy_until[from]);
        let tx_time = match self.link.rate_bps {
            Some(bps) if bps > 0 => {
                Duration::from_nanos((frame.len() as u64 * 8 * 1_000_000_000).div_ceil(bps))
            }
            _ => Duration::ZERO,
        };
        self.busy_until[from] = start + tx_time;
        if let Some(p) = self.pcap.as_mut() {
            let _ = p.write_frame(start.since_epoch(), &frame);
        }
        if self.trace.is_some() {
            let retx = self.is_retransmission(from, &frame);
            self.trace_frame(start, from, &frame, tag, retx);
        }
        if copies == 0 {
            return;
        }
        let at = start + tx_time + self.link.latency + extra;
        for c in 0..copies {
            self.seq += 1;
            self.in_flight.push(Reverse(InFlight {
                at: at + Duration::from_nanos(c as u64 * 100),
                seq: self.seq,
                to,
                frame: frame.clone(),
            }));
        }
    }

    /// True if `frame` is a request whose PSN is not beyond the highest seen on its QP.
    fn is_retransmission(&mut self, from: usize, frame: &[u8]) -> bool {
        let Ok(p) = wire::parse_frame(frame) else {
            return false;
        };
        let bth = p.repr.roce.bth;
        if !bth.opcode.info().is_some_and(|i| i.is_request) {
            return false;
        }
        let next = bth.psn.wrapping_add(1);
        match self.high_psn.get(&(from, bth.dest_qp)) {
            Some(h) if bth.psn.is_before(*h) => true,
            _ => {
                self.high_psn.insert((from, bth.dest_qp), next);
                false
            }
        }
    }

    fn trace_frame(&mut self, now: Instant, from: usize, frame: &[u8], tag: &str, retx: bool) {
        let Some(t) = self.trace.as_mut() else {
            return;
        };
        let line = describe_frame(frame);
        let arrow = if from == 0 { "A -> B" } else { "B -> A" };
        let retx = if retx { " (retransmit)" } else { "" };
        let tag = if tag.is_empty() {
            String::new()
        } else {
            format!("  [{tag}]")
        };
        let _ = writeln!(t, "{:>12} {arrow} {line}{retx}{tag}", fmt_time(now));
        if self.trace_explain {
            if let Ok(p) = wire::parse_frame(frame) {
                use wire::PrettyPrint as _;
                let _ = t.write_all(p.explain(frame, 0, TRACE_EXPLAIN_LEVEL).as_bytes());
            }
        }
    }
}

/// Virtual time as microseconds with nanosecond digits, e.g. `1234.567us`.
pub fn fmt_time(t: Instant) -> String {
    t.to_string()
}

/// One line describing a RoCE frame, e.g. `RC_SEND_FIRST qp 0x000012 psn 7 len 1024 ackreq`.
pub fn describe_frame(frame: &[u8]) -> String {
    let parsed = match wire::parse_frame(frame) {
        Ok(p) => p,
        Err(e) => return format!("undecodable frame ({e})"),
    };
    let r = &parsed.repr.roce;
    let bth = r.bth;
    let name = bth
        .opcode
        .info()
        .map(|i| i.name.to_string())
        .unwrap_or_else(|| format!("opcode {:#04x}", bth.opcode.0));
    let mut s = format!(
        "{name:<32} qp {:#08x} psn {:>8}",
        bth.dest_qp,
        bth.psn.value()
    );
    if bth.ack_req {
        s.push_str(" ackreq");
    }
    if bth.solicited {
        s.push_str(" se");
    }
    if let Some(reth) = r.reth {
        s.push_str(&format!(
            " va {:#x} rkey {:#x} dmalen {}",
            reth.va, reth.rkey, reth.dma_len
        ));
    }
    if let Some(a) = r.aeth {
        let syn = match a.syndrome {
            Syndrome::Ack { credit } => format!("ACK credit {credit:#x}"),
            Syndrome::RnrNak { timer } => format!(
                "RNR-NAK timer {timer} ({}us)",
                wire::rnr_timer(timer).as_micros()
            ),
            Syndrome::Nak(code) => format!("NAK {code:?}"),
            Syndrome::Reserved(b) => format!("reserved syndrome {b:#x}"),
        };
        s.push_str(&format!(" [{syn} msn {}]", a.msn));
    }
    if let Some(a) = r.atomic_eth {
        let what = if bth.opcode == Opcode::RC_COMPARE_SWAP {
            format!("cmp {:#x} swap {:#x}", a.compare, a.swap_add)
        } else {
            format!("add {:#x}", a.swap_add)
        };
        s.push_str(&format!(" va {:#x} rkey {:#x} {what}", a.va, a.rkey));
    }
    if let Some(a) = r.atomic_ack_eth {
        s.push_str(&format!(" orig {:#x}", a.orig_data));
    }
    if let Some(i) = r.immdt {
        s.push_str(&format!(" imm {i:#x}"));
    }
    if let Some(d) = r.deth {
        s.push_str(&format!(" qkey {:#x} srcqp {:#x}", d.qkey, d.src_qp));
    }
    if !r.payload.is_empty() {
        s.push_str(&format!(" len {}", r.payload.len()));
    }
    if !parsed.icrc_ok() {
        s.push_str(" BAD-ICRC");
    }
    s
}

/// Flip one byte inside the ICRC-covered, invariant part of the frame (from the BTH on,
/// except BTH byte 4 which the ICRC masks), so the receiver's ICRC check must catch it.
fn corrupt(frame: &mut [u8], rng: &mut ChaCha8Rng) -> bool {
    let Ok(p) = wire::parse_frame(frame) else {
        return false;
    };
    let eth = if p.repr.eth.vlan.is_some() { 18 } else { 14 };
    let ip = match p.repr.ip {
        IpRepr::V4 { .. } => 20,
        IpRepr::V6 { .. } => 40,
    };
    let bth_start = eth + ip + 8;
    if frame.len() <= bth_start + 5 {
        return false;
    }
    let mut idx = rng.gen_range(bth_start..frame.len());
    if idx == bth_start + 4 {
        idx += 1;
    }
    let flip: u8 = rng.gen_range(1..=255);
    frame[idx] ^= flip;
    true
}

/// A link knob as a probability: clamped to [0, 1], NaN counts as 0 (`gen_bool` panics on
/// anything else).
fn probability(p: f64) -> f64 {
    if p.is_nan() {
        0.0
    } else {
        p.clamp(0.0, 1.0)
    }
}
