//! `xroce dump FILE`: decode every RoCEv2 frame of a pcap/pcapng file and verify its ICRC.
//!
//! Default output is one line per RoCE frame and a summary; `--json` prints one JSON object
//! per RoCE frame on stdout (the summary goes to stderr); `--explain` draws every header of
//! each RoCE frame field by field. Frames that are not RoCEv2 (the tools' TCP exchange, ARP)
//! are counted, not reported as errors. Exit status 0 when the whole file was read.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::{json, Map, Value};

use xroce::capture::{link_type_name, to_ethernet, CaptureReader, CapturedFrame};
use xroce::wire::frame::{ETH_LEN, UDP_LEN, VLAN_LEN};
use xroce::wire::icrc::IPV4_VARIANT_BYTES;
use xroce::wire::{
    frame_icrc, parse_frame, IpRepr, NakCode, Opcode, PacketRepr, ParsedFrame, Position, Syndrome,
    WireError, BTH_LEN,
};

/// Arguments of `xroce dump`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A pcap or pcapng capture (e.g. tests/fixtures/rxe_rc_pingpong.pcap): Ethernet, Linux
    /// cooked (`tcpdump -i any`: SLL, SLL2) or raw IP link types.
    pub file: PathBuf,
    /// One JSON object per RoCE frame on stdout (summary on stderr).
    #[arg(long, conflicts_with = "explain")]
    pub json: bool,
    /// Teach: draw every header of each RoCE frame with offsets, bytes and meaning.
    #[arg(long)]
    pub explain: bool,
}

/// Counters for the summary.
#[derive(Default)]
struct Summary {
    frames: usize,
    roce: usize,
    icrc_ok: usize,
    icrc_bad: Vec<usize>,
    per_opcode: BTreeMap<u8, usize>,
    not_roce: BTreeMap<String, usize>,
    malformed: BTreeMap<String, Vec<usize>>,
    /// RoCE frames the capture's snaplen cut short (ICRC not checkable).
    snaplen_cut: Vec<usize>,
    /// Per source address: what it did to recover from loss.
    senders: BTreeMap<String, SenderStats>,
    /// Copies seen of each (source, dest QP, PSN, opcode) that is not an acknowledgement.
    copies: std::collections::HashMap<(String, u32, u32, u8), u32>,
}

/// One sender's recovery activity, as the wire shows it.
#[derive(Default)]
struct SenderStats {
    frames: usize,
    /// NAKs sent: PSN sequence error (a gap seen), RNR (no receive posted), others.
    nak_sequence: usize,
    nak_rnr: usize,
    nak_other: usize,
    /// Packets other than ACKs that repeat an earlier (dest QP, PSN, opcode) of this sender:
    /// go-back-N resends, READ replays, timer retries.
    retransmitted: usize,
    /// Most copies of any one such packet (1 = nothing was sent twice).
    most_copies: u32,
}

impl Summary {
    fn count_sender(&mut self, p: &ParsedFrame<'_>) {
        let (src, _) = addresses(p);
        let r = &p.repr.roce;
        self.count_sender_bth(src, &r.bth, r.aeth);
    }

    /// As `count_sender`, from the BTH and AETH alone (all a snaplen-cut frame may show).
    fn count_sender_bth(
        &mut self,
        src: String,
        bth: &xroce::wire::BthRepr,
        aeth: Option<xroce::wire::AethRepr>,
    ) {
        let stats = self.senders.entry(src.clone()).or_default();
        stats.frames += 1;
        if let Some(a) = aeth {
            match a.syndrome {
                Syndrome::Nak(NakCode::PsnSequenceError) => stats.nak_sequence += 1,
                Syndrome::Nak(_) => stats.nak_other += 1,
                Syndrome::RnrNak { .. } => stats.nak_rnr += 1,
                _ => {}
            }
        }
        let op = bth.opcode;
        if op != Opcode::RC_ACKNOWLEDGE && op != Opcode::RC_ATOMIC_ACKNOWLEDGE {
            let n = self
                .copies
                .entry((src, bth.dest_qp, bth.psn.value(), op.0))
                .or_insert(0);
            *n += 1;
            if *n > 1 {
                stats.retransmitted += 1;
            }
            stats.most_copies = stats.most_copies.max(*n);
        }
    }
}

/// Runs the command; returns the exit status.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let reader = CaptureReader::open(&args.file).context("cannot dump")?;
    let mut summary = Summary::default();
    let mut first_ts: Option<Duration> = None;
    let mut failure = None;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for item in reader {
        let frame = match item {
            Ok(f) => f,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        summary.frames += 1;
        let t0 = *first_ts.get_or_insert(frame.timestamp);
        let rel = frame.timestamp.saturating_sub(t0);
        let text = handle_frame(&args, &frame, rel, &mut summary);
        if let Some(text) = text {
            if !write_or_stop(&mut out, &text)? {
                return Ok(0);
            }
        }
    }
    let report = summary_text(&summary);
    if args.json {
        eprint!("{report}");
    } else if !write_or_stop(&mut out, &report)? {
        return Ok(0);
    }
    if !write_or_stop(&mut out, "")? {
        return Ok(0);
    }
    match failure {
        Some(e) => Err(anyhow::Error::new(e)
            .context("capture is damaged; summary covers the frames before the damage")),
        None => Ok(0),
    }
}

/// Writes and flushes; `Ok(false)` when the reader went away (`xroce dump F | head`).
fn write_or_stop(out: &mut impl std::io::Write, text: &str) -> anyhow::Result<bool> {
    let result =
        out.write_all(text.as_bytes()).and_then(
            |()| {
                if text.is_empty() {
                    out.flush()
                } else {
                    Ok(())
                }
            },
        );
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Classifies one frame, updates the summary and returns what to print for it.
fn handle_frame(args: &Args, f: &CapturedFrame, rel: Duration, s: &mut Summary) -> Option<String> {
    let view = match to_ethernet(f.link_type, &f.data) {
        Ok(v) => v,
        Err(e) => {
            *s.not_roce.entry(e.to_string()).or_default() += 1;
            return None;
        }
    };
    let data = &view.bytes[..];
    let cut = usize::try_from(f.orig_len).is_ok_and(|orig| orig > f.data.len());
    match parse_frame(data) {
        Ok(p) => {
            s.roce += 1;
            *s.per_opcode.entry(p.repr.roce.bth.opcode.0).or_default() += 1;
            s.count_sender(&p);
            if p.icrc_ok() {
                s.icrc_ok += 1;
            } else {
                s.icrc_bad.push(f.number);
            }
            Some(if args.json {
                let mut line = frame_json(f.number, rel, &p).to_string();
                line.push('\n');
                line
            } else if args.explain {
                explain(f, data, rel, &p)
            } else {
                frame_line(f.number, rel, &p)
            })
        }
        Err(_) if cut => snaplen_cut(args, f, data, rel, s),
        Err(e) => {
            if let Some(reason) = not_roce_reason(&e) {
                *s.not_roce.entry(reason).or_default() += 1;
                return None;
            }
            // Addressed to 4791 but malformed: a RoCE frame that did not parse.
            s.roce += 1;
            s.malformed.entry(e.to_string()).or_default().push(f.number);
            let icrc = frame_icrc(data).ok();
            if let Some((rx, computed)) = icrc {
                if rx == computed {
                    s.icrc_ok += 1;
                } else {
                    s.icrc_bad.push(f.number);
                }
            }
            Some(if args.json {
                let mut v =
                    json!({ "frame": f.number, "time": rel.as_secs_f64(), "error": e.to_string() });
                if let Some((rx, computed)) = icrc {
                    v["icrc_ok"] = json!(rx == computed);
                    v["icrc_received"] = json!(rx);
                    v["icrc_computed"] = json!(computed);
                }
                format!("{v}\n")
            } else {
                let icrc_text = match icrc {
                    Some((rx, c)) if rx == c => "ICRC ok".to_string(),
                    Some((rx, c)) => format!("ICRC BAD (expected 0x{c:08x}, found 0x{rx:08x})"),
                    None => "ICRC not computable".to_string(),
                };
                format!(
                    "#{:<5} {:>10.6}  MALFORMED: {e}  {icrc_text}\n",
                    f.number,
                    rel.as_secs_f64()
                )
            })
        }
    }
}

/// A frame the capture's snaplen cut before its end: decoded as far as it goes (addresses,
/// and the BTH when captured), reported as cut, its ICRC not checkable.
fn snaplen_cut(
    args: &Args,
    f: &CapturedFrame,
    data: &[u8],
    rel: Duration,
    s: &mut Summary,
) -> Option<String> {
    use etherparse::{LaxNetSlice, LaxSlicedPacket, TransportSlice};
    let cut_text = format!(
        "frame cut by the capture's snaplen: {} of {} bytes captured; ICRC not checkable",
        f.data.len(),
        f.orig_len
    );
    let packet = LaxSlicedPacket::from_ethernet(data).ok();
    let addresses = packet.as_ref().and_then(|p| match &p.net {
        Some(LaxNetSlice::Ipv4(ip)) => Some((
            ip.header().source_addr().to_string(),
            ip.header().destination_addr().to_string(),
        )),
        Some(LaxNetSlice::Ipv6(ip)) => Some((
            ip.header().source_addr().to_string(),
            ip.header().destination_addr().to_string(),
        )),
        None => None,
    });
    let udp = packet.as_ref().and_then(|p| match &p.transport {
        Some(TransportSlice::Udp(u)) => Some((u.destination_port(), u.payload())),
        _ => None,
    });
    let protocol = packet
        .as_ref()
        .and_then(|p| p.net.as_ref())
        .and_then(|n| n.ip_payload_ref())
        .map(|ip| ip.ip_number.0);
    let (Some((src, dst)), Some((xroce::wire::ROCEV2_UDP_PORT, roce))) = (addresses, udp) else {
        // Not RoCE: counted as an uncut frame would be.
        let why = match (udp, protocol) {
            (Some(_), _) => "UDP to a port other than 4791".to_string(),
            (None, Some(p)) if p != 17 => format!("IP but not UDP (protocol {p})"),
            _ => "cut by the capture's snaplen before its UDP header".to_string(),
        };
        *s.not_roce.entry(why).or_default() += 1;
        return None;
    };
    s.roce += 1;
    s.snaplen_cut.push(f.number);
    let bth = xroce::wire::Bth::new_checked(roce)
        .ok()
        .and_then(|b| xroce::wire::BthRepr::parse(&b).ok());
    if let Some(b) = &bth {
        *s.per_opcode.entry(b.opcode.0).or_default() += 1;
        s.count_sender_bth(src.clone(), b, None);
    }
    if args.json {
        let mut v = json!({
            "frame": f.number,
            "time": rel.as_secs_f64(),
            "src": src,
            "dst": dst,
            "snaplen_cut": true,
            "captured_len": f.data.len(),
            "original_len": f.orig_len,
            "error": cut_text,
            "icrc_ok": Value::Null,
        });
        if let Some(b) = &bth {
            v["opcode"] = json!(b.opcode.0);
            v["opcode_name"] = json!(b.opcode.name());
            v["dest_qp"] = json!(b.dest_qp);
            v["psn"] = json!(b.psn.value());
        }
        return Some(format!("{v}\n"));
    }
    let headers = match &bth {
        Some(b) => format!("{:<28} qp=0x{:x} psn={}", b.opcode, b.dest_qp, b.psn),
        None => "(BTH not captured)".into(),
    };
    Some(format!(
        "#{:<5} {:>10.6}  {src} > {dst}  {headers}  CUT: {cut_text}\n",
        f.number,
        rel.as_secs_f64()
    ))
}

/// `Some(category)` for errors that mean "this is not a RoCEv2 frame at all".
fn not_roce_reason(e: &WireError) -> Option<String> {
    match e {
        WireError::NotIp { ether_type } => Some(format!("not IP (EtherType 0x{ether_type:04x})")),
        WireError::NotUdp { protocol } => Some(format!("IP but not UDP (protocol {protocol})")),
        WireError::NotRoce { .. } => Some("UDP to a port other than 4791".into()),
        WireError::Fragmented { .. } => Some("IP fragment".into()),
        // Too short to even hold UDP: not a RoCE frame we can speak about.
        WireError::Truncated {
            layer:
                xroce::wire::Layer::Ethernet
                | xroce::wire::Layer::Vlan
                | xroce::wire::Layer::Ipv4
                | xroce::wire::Layer::Ipv6
                | xroce::wire::Layer::Udp,
            ..
        } => Some(format!("truncated below UDP ({e})")),
        WireError::IpVersionMismatch { .. }
        | WireError::BadIpv4Ihl { .. }
        | WireError::BadIpLength { .. } => Some(format!("IP header not handled ({e})")),
        WireError::StackedVlan { .. } | WireError::ServiceVlanTag { .. } => {
            Some(format!("VLAN tagging not handled ({e})"))
        }
        _ => None,
    }
}

fn addresses(p: &ParsedFrame<'_>) -> (String, String) {
    match p.repr.ip {
        IpRepr::V4 { src, dst, .. } => (src.to_string(), dst.to_string()),
        IpRepr::V6 { src, dst, .. } => (src.to_string(), dst.to_string()),
    }
}

fn flags(r: &PacketRepr<'_>) -> String {
    let mut f = Vec::new();
    if r.bth.ack_req {
        f.push("A");
    }
    if r.bth.solicited {
        f.push("SE");
    }
    if r.bth.migreq {
        f.push("M");
    }
    if r.bth.fecn {
        f.push("FECN");
    }
    if r.bth.becn {
        f.push("BECN");
    }
    if f.is_empty() {
        "-".into()
    } else {
        f.join(",")
    }
}

/// The extension headers' fields, in wire order.
fn ext_text(r: &PacketRepr<'_>) -> String {
    let mut t = String::new();
    if let Some(d) = r.deth {
        let _ = write!(t, " qkey=0x{:08x} src_qp=0x{:x}", d.qkey, d.src_qp);
    }
    if let Some(h) = r.reth {
        let _ = write!(
            t,
            " va=0x{:x} rkey=0x{:x} dma_len={}",
            h.va, h.rkey, h.dma_len
        );
    }
    if let Some(a) = r.atomic_eth {
        let _ = write!(
            t,
            " va=0x{:x} rkey=0x{:x} swap_add=0x{:x} compare=0x{:x}",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = r.aeth {
        let _ = write!(
            t,
            " syndrome=0x{:02x} \"{}\" msn={}",
            a.syndrome.to_byte(),
            a.syndrome,
            a.msn
        );
    }
    if let Some(a) = r.atomic_ack_eth {
        let _ = write!(t, " orig_data=0x{:x}", a.orig_data);
    }
    if let Some(i) = r.immdt {
        let _ = write!(t, " imm=0x{i:08x}");
    }
    if let Some(i) = r.ieth {
        let _ = write!(t, " inv_rkey=0x{i:08x}");
    }
    t
}

fn icrc_text(p: &ParsedFrame<'_>) -> String {
    if p.icrc_ok() {
        "ICRC ok".into()
    } else {
        format!(
            "ICRC BAD (expected 0x{:08x}, found 0x{:08x})",
            p.icrc_computed, p.icrc_received
        )
    }
}

/// One line per frame.
fn frame_line(number: usize, rel: Duration, p: &ParsedFrame<'_>) -> String {
    let r = &p.repr.roce;
    let (src, dst) = addresses(p);
    let pkey = if r.bth.pkey != 0xFFFF {
        format!(" pkey=0x{:04x}", r.bth.pkey)
    } else {
        String::new()
    };
    format!(
        "#{:<5} {:>10.6}  {} > {}  {:<28} qp=0x{:x} psn={} flags={}{}{} payload={}  {}\n",
        number,
        rel.as_secs_f64(),
        src,
        dst,
        r.bth.opcode,
        r.bth.dest_qp,
        r.bth.psn,
        flags(r),
        pkey,
        ext_text(r),
        r.payload.len(),
        icrc_text(p)
    )
}

fn syndrome_json(s: Syndrome) -> Value {
    let mut v = json!({ "syndrome": s.to_byte(), "text": s.to_string() });
    match s {
        Syndrome::Ack { credit } => {
            v["type"] = json!("ACK");
            v["credit"] = json!(credit);
        }
        Syndrome::RnrNak { timer } => {
            v["type"] = json!("RNR_NAK");
            v["timer"] = json!(timer);
            v["timer_us"] = json!(xroce::wire::rnr_timer(timer).as_micros() as u64);
        }
        Syndrome::Nak(code) => {
            v["type"] = json!("NAK");
            v["nak_code"] = json!(code.code());
        }
        Syndrome::Reserved(_) => v["type"] = json!("RESERVED"),
    }
    v
}

/// One JSON object per frame.
fn frame_json(number: usize, rel: Duration, p: &ParsedFrame<'_>) -> Value {
    let r = &p.repr.roce;
    let (src, dst) = addresses(p);
    let mut o = Map::new();
    o.insert("frame".into(), json!(number));
    o.insert("time".into(), json!(rel.as_secs_f64()));
    o.insert("src".into(), json!(src));
    o.insert("dst".into(), json!(dst));
    o.insert("udp_src_port".into(), json!(p.repr.udp_src_port));
    o.insert("opcode".into(), json!(r.bth.opcode.0));
    o.insert("opcode_name".into(), json!(r.bth.opcode.name()));
    o.insert("dest_qp".into(), json!(r.bth.dest_qp));
    o.insert("psn".into(), json!(r.bth.psn.value()));
    o.insert("ack_req".into(), json!(r.bth.ack_req));
    o.insert("solicited".into(), json!(r.bth.solicited));
    o.insert("migreq".into(), json!(r.bth.migreq));
    o.insert("pad_count".into(), json!(r.bth.pad_count));
    o.insert("pkey".into(), json!(r.bth.pkey));
    o.insert("fecn".into(), json!(r.bth.fecn));
    o.insert("becn".into(), json!(r.bth.becn));
    o.insert("payload_len".into(), json!(r.payload.len()));
    o.insert("icrc_ok".into(), json!(p.icrc_ok()));
    o.insert("icrc_received".into(), json!(p.icrc_received));
    o.insert("icrc_computed".into(), json!(p.icrc_computed));
    if let Some(h) = r.reth {
        o.insert(
            "reth".into(),
            json!({ "va": h.va, "rkey": h.rkey, "dma_len": h.dma_len }),
        );
    }
    if let Some(a) = r.aeth {
        let mut v = syndrome_json(a.syndrome);
        v["msn"] = json!(a.msn);
        o.insert("aeth".into(), v);
    }
    if let Some(a) = r.atomic_eth {
        o.insert(
            "atomic_eth".into(),
            json!({ "va": a.va, "rkey": a.rkey, "swap_add": a.swap_add, "compare": a.compare }),
        );
    }
    if let Some(a) = r.atomic_ack_eth {
        o.insert("atomic_ack_eth".into(), json!({ "orig_data": a.orig_data }));
    }
    if let Some(i) = r.immdt {
        o.insert("immdt".into(), json!({ "value": i }));
    }
    if let Some(i) = r.ieth {
        o.insert("ieth".into(), json!({ "rkey": i }));
    }
    if let Some(d) = r.deth {
        o.insert("deth".into(), json!({ "qkey": d.qkey, "src_qp": d.src_qp }));
    }
    Value::Object(o)
}

fn summary_text(s: &Summary) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "--- summary ---");
    let _ = writeln!(t, "frames read:        {}", s.frames);
    let _ = writeln!(t, "RoCE frames:        {}", s.roce);
    let _ = writeln!(t, "ICRC ok:            {}", s.icrc_ok);
    let _ = writeln!(
        t,
        "ICRC bad:           {}{}",
        s.icrc_bad.len(),
        frame_list(&s.icrc_bad)
    );
    let not_roce: usize = s.not_roce.values().sum();
    let _ = writeln!(t, "not RoCE:           {not_roce}");
    for (why, n) in &s.not_roce {
        let _ = writeln!(t, "  {n:>6}  {why}");
    }
    let _ = writeln!(
        t,
        "cut by snaplen:     {}{}",
        s.snaplen_cut.len(),
        frame_list(&s.snaplen_cut)
    );
    let malformed: usize = s.malformed.values().map(Vec::len).sum();
    let _ = writeln!(t, "did not parse:      {malformed}");
    for (why, frames) in &s.malformed {
        let _ = writeln!(t, "  {:>6}  {why}{}", frames.len(), frame_list(frames));
    }
    let _ = writeln!(t, "per opcode:");
    for (op, n) in &s.per_opcode {
        let _ = writeln!(t, "  {n:>6}  0x{op:02x} {}", Opcode(*op));
    }
    // Loss recovery as each side performed it (IBTA Vol. 1 9.7.5: NAK a gap, go back, retry).
    let _ = writeln!(t, "per sender:");
    for (src, st) in &s.senders {
        let _ = write!(
            t,
            "  {src}: {} frames, NAKs {} (PSN sequence {}, RNR {}, other {}), retransmitted {}",
            st.frames,
            st.nak_sequence + st.nak_rnr + st.nak_other,
            st.nak_sequence,
            st.nak_rnr,
            st.nak_other,
            st.retransmitted,
        );
        if st.retransmitted > 0 {
            let _ = write!(t, " (up to {} copies of one packet)", st.most_copies);
        }
        t.push('\n');
    }
    t
}

fn frame_list(frames: &[usize]) -> String {
    if frames.is_empty() {
        return String::new();
    }
    let shown: Vec<String> = frames.iter().take(20).map(|n| format!("#{n}")).collect();
    let more = if frames.len() > 20 {
        format!(" and {} more", frames.len() - 20)
    } else {
        String::new()
    };
    format!("  (frames {}{more})", shown.join(" "))
}

// ---------------------------------------------------------------------------------------
// --explain

/// Appends one field row: offset, raw bytes, meaning, and the ICRC's treatment.
fn row(t: &mut String, data: &[u8], at: usize, len: usize, meaning: &str, icrc: &str) {
    let end = (at + len).min(data.len());
    let hex: Vec<String> = data[at.min(end)..end]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let hex = hex.join(" ");
    let note = if icrc.is_empty() {
        String::new()
    } else {
        format!("   [ICRC: {icrc}]")
    };
    let _ = writeln!(t, "    {at:04x}  {hex:<24} {meaning}{note}");
}

/// `d` is the frame as Ethernet (see `capture::to_ethernet`).
fn explain(f: &CapturedFrame, d: &[u8], rel: Duration, p: &ParsedFrame<'_>) -> String {
    let r = &p.repr.roce;
    let info = r.bth.opcode.info();
    let mut t = String::new();
    let (src, dst) = addresses(p);
    let _ = writeln!(
        t,
        "=== frame #{} at {:.6} s: {} bytes, {} > {}, {} ===",
        f.number,
        rel.as_secs_f64(),
        f.data.len(),
        src,
        dst,
        r.bth.opcode
    );
    if d.len() != f.data.len() || d != &f.data[..] {
        let link_len = f.data.len() + ETH_LEN - d.len();
        let what = if link_len == 0 {
            "no link header; a stand-in Ethernet header is shown".to_string()
        } else {
            format!("its {link_len}-byte link header is shown as the Ethernet header it stands for")
        };
        let _ = writeln!(
            t,
            "  (link type {} {}: {what}; offsets count from that)",
            f.link_type,
            link_type_name(f.link_type),
        );
    }
    let mac = |b: &[u8]| {
        b.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    };

    let _ = writeln!(t, "  Ethernet [0..{}]", p.repr.eth.buffer_len());
    row(
        &mut t,
        d,
        0,
        6,
        &format!("destination MAC {}", mac(&d[0..6])),
        "",
    );
    row(
        &mut t,
        d,
        6,
        6,
        &format!("source MAC {}", mac(&d[6..12])),
        "",
    );
    if let Some(v) = p.repr.eth.vlan {
        row(
            &mut t,
            d,
            12,
            2,
            "TPID 0x8100: an 802.1Q VLAN tag follows",
            "",
        );
        row(
            &mut t,
            d,
            14,
            2,
            &format!(
                "PCP {} (priority; PFC class), DEI {}, VLAN {}",
                v.pcp,
                u8::from(v.dei),
                v.vid
            ),
            "",
        );
    }
    let et = ETH_LEN
        + if p.repr.eth.vlan.is_some() {
            VLAN_LEN
        } else {
            0
        }
        - 2;
    let et_name = if matches!(p.repr.ip, IpRepr::V4 { .. }) {
        "IPv4"
    } else {
        "IPv6"
    };
    row(&mut t, d, et, 2, &format!("EtherType = {et_name}"), "");

    let ip = p.offsets.ip;
    match p.repr.ip {
        IpRepr::V4 {
            src,
            dst,
            tos,
            ttl,
            ident,
            dont_fragment,
        } => {
            let _ = writeln!(
                t,
                "  IPv4 [{}..{}]  (the ICRC covers it, but sees the variant fields as 0xFF)",
                ip, p.offsets.udp
            );
            let header_len = p.offsets.udp - ip;
            let ihl = if p.ipv4_options.is_empty() {
                "version 4, IHL 5 (20-byte header, no options)".to_string()
            } else {
                format!(
                    "version 4, IHL {} ({header_len}-byte header with options)",
                    header_len / 4
                )
            };
            row(&mut t, d, ip, 1, &ihl, "covered");
            row(
                &mut t,
                d,
                ip + 1,
                1,
                &format!(
                    "TOS: DSCP {}, ECN {} (routers may rewrite it)",
                    tos >> 2,
                    tos & 3
                ),
                "masked",
            );
            let total = u16::from_be_bytes([d[ip + 2], d[ip + 3]]);
            row(
                &mut t,
                d,
                ip + 2,
                2,
                &format!("total length {total}"),
                "covered",
            );
            row(
                &mut t,
                d,
                ip + 4,
                2,
                &format!("identification 0x{ident:04x}"),
                "covered",
            );
            let df = if dont_fragment {
                "DF set (RoCE is never fragmented)"
            } else {
                "DF clear"
            };
            row(
                &mut t,
                d,
                ip + 6,
                2,
                &format!("flags: {df}, fragment offset 0"),
                "covered",
            );
            row(
                &mut t,
                d,
                ip + 8,
                1,
                &format!("TTL {ttl} (decremented per hop)"),
                "masked",
            );
            row(&mut t, d, ip + 9, 1, "protocol 17 = UDP", "covered");
            let ck = if p.ipv4_checksum_ok { "ok" } else { "WRONG" };
            row(
                &mut t,
                d,
                ip + 10,
                2,
                &format!(
                    "header checksum 0x{:04x} ({ck}; recomputed per hop)",
                    p.ipv4_checksum.unwrap_or(0)
                ),
                "masked",
            );
            row(&mut t, d, ip + 12, 4, &format!("source {src}"), "covered");
            row(
                &mut t,
                d,
                ip + 16,
                4,
                &format!("destination {dst}"),
                "covered",
            );
            if !p.ipv4_options.is_empty() {
                row(
                    &mut t,
                    d,
                    ip + 20,
                    p.ipv4_options.len(),
                    &format!("{} bytes of IPv4 options", p.ipv4_options.len()),
                    "covered",
                );
            }
            debug_assert_eq!(IPV4_VARIANT_BYTES, [1, 8, 10, 11]);
        }
        IpRepr::V6 {
            src,
            dst,
            traffic_class,
            flow_label,
            hop_limit,
        } => {
            let _ = writeln!(
                t,
                "  IPv6 [{}..{}]  (the ICRC covers it, but sees the variant fields as ones)",
                ip, p.offsets.udp
            );
            row(
                &mut t,
                d,
                ip,
                4,
                &format!(
                    "version 6, traffic class 0x{traffic_class:02x}, flow label 0x{flow_label:05x}"
                ),
                "TC and flow label masked",
            );
            let plen = u16::from_be_bytes([d[ip + 4], d[ip + 5]]);
            row(
                &mut t,
                d,
                ip + 4,
                2,
                &format!("payload length {plen}"),
                "covered",
            );
            row(&mut t, d, ip + 6, 1, "next header 17 = UDP", "covered");
            row(
                &mut t,
                d,
                ip + 7,
                1,
                &format!("hop limit {hop_limit}"),
                "masked",
            );
            row(&mut t, d, ip + 8, 16, &format!("source {src}"), "covered");
            row(
                &mut t,
                d,
                ip + 24,
                16,
                &format!("destination {dst}"),
                "covered",
            );
        }
    }

    let u = p.offsets.udp;
    let _ = writeln!(t, "  UDP [{}..{}]", u, u + UDP_LEN);
    row(
        &mut t,
        d,
        u,
        2,
        &format!(
            "source port {} (any value; rxe hashes the QP numbers into it for ECMP)",
            p.repr.udp_src_port
        ),
        "covered",
    );
    row(
        &mut t,
        d,
        u + 2,
        2,
        "destination port 4791 = RoCEv2",
        "covered",
    );
    let ulen = u16::from_be_bytes([d[u + 4], d[u + 5]]);
    row(
        &mut t,
        d,
        u + 4,
        2,
        &format!("length {ulen} (UDP header + RoCE packet + ICRC)"),
        "covered",
    );
    let ucs = if p.udp_checksum == 0 {
        "checksum 0 = not used (the ICRC protects the packet)".to_string()
    } else {
        format!("checksum 0x{:04x} (not validated)", p.udp_checksum)
    };
    row(&mut t, d, u + 6, 2, &ucs, "masked");

    let b = p.offsets.bth;
    let _ = writeln!(t, "  BTH [{}..{}]  Base Transport Header", b, b + BTH_LEN);
    let meaning = info.map_or("", |i| i.meaning);
    row(
        &mut t,
        d,
        b,
        1,
        &format!(
            "opcode 0x{:02x} {}: {meaning}",
            r.bth.opcode.0, r.bth.opcode
        ),
        "covered",
    );
    row(
        &mut t,
        d,
        b + 1,
        1,
        &format!(
            "SE {} (solicited event), M {} (MigReq), PadCnt {} (pad bytes before the ICRC), TVer {}",
            u8::from(r.bth.solicited),
            u8::from(r.bth.migreq),
            r.bth.pad_count,
            r.bth.tver
        ),
        "covered",
    );
    let pk = if r.bth.pkey == 0xFFFF {
        " (default partition, full member)"
    } else {
        ""
    };
    row(
        &mut t,
        d,
        b + 2,
        2,
        &format!("P_Key 0x{:04x}{pk}", r.bth.pkey),
        "covered",
    );
    row(
        &mut t,
        d,
        b + 4,
        1,
        &format!(
            "FECN {}, BECN {}, reserved (congestion marks; switches may set them)",
            u8::from(r.bth.fecn),
            u8::from(r.bth.becn)
        ),
        "masked",
    );
    row(
        &mut t,
        d,
        b + 5,
        3,
        &format!("destination QP 0x{:x}", r.bth.dest_qp),
        "covered",
    );
    row(&mut t, d, b + 8, 1, &ack_req_meaning(r), "covered");
    row(
        &mut t,
        d,
        b + 9,
        3,
        &format!("PSN {} (24-bit packet sequence number)", r.bth.psn),
        "covered",
    );

    let mut at = b + BTH_LEN;
    if let Some(x) = r.deth {
        let _ = writeln!(t, "  DETH [{}..{}]  Datagram ETH", at, at + 8);
        let ctl = if x.qkey & 0x8000_0000 != 0 {
            " (high bit set: a controlled Q_Key)"
        } else {
            ""
        };
        row(
            &mut t,
            d,
            at,
            4,
            &format!(
                "Q_Key 0x{:08x}: must match the receiving UD QP's Q_Key{ctl}",
                x.qkey
            ),
            "covered",
        );
        row(&mut t, d, at + 4, 1, "reserved", "covered");
        row(
            &mut t,
            d,
            at + 5,
            3,
            &format!("source QP 0x{:x}: where a reply goes", x.src_qp),
            "covered",
        );
        at += 8;
    }
    if let Some(x) = r.reth {
        let _ = writeln!(t, "  RETH [{}..{}]  RDMA ETH", at, at + 16);
        row(
            &mut t,
            d,
            at,
            8,
            &format!(
                "virtual address 0x{:x} in the responder's memory region",
                x.va
            ),
            "covered",
        );
        row(
            &mut t,
            d,
            at + 8,
            4,
            &format!(
                "R_Key 0x{:x}: the key that grants access to that region",
                x.rkey
            ),
            "covered",
        );
        row(
            &mut t,
            d,
            at + 12,
            4,
            &format!("DMA length {} bytes for the whole message", x.dma_len),
            "covered",
        );
        at += 16;
    }
    if let Some(x) = r.atomic_eth {
        let _ = writeln!(t, "  AtomicETH [{}..{}]", at, at + 28);
        row(
            &mut t,
            d,
            at,
            8,
            &format!("virtual address 0x{:x} (8-byte aligned)", x.va),
            "covered",
        );
        row(
            &mut t,
            d,
            at + 8,
            4,
            &format!("R_Key 0x{:x}", x.rkey),
            "covered",
        );
        row(
            &mut t,
            d,
            at + 12,
            8,
            &format!("swap/add data 0x{:x}", x.swap_add),
            "covered",
        );
        row(
            &mut t,
            d,
            at + 20,
            8,
            &format!("compare data 0x{:x}", x.compare),
            "covered",
        );
        at += 28;
    }
    if let Some(x) = r.aeth {
        let _ = writeln!(t, "  AETH [{}..{}]  ACK ETH", at, at + 4);
        row(
            &mut t,
            d,
            at,
            1,
            &format!(
                "syndrome 0x{:02x}: {}",
                x.syndrome.to_byte(),
                syndrome_meaning(x.syndrome)
            ),
            "covered",
        );
        row(
            &mut t,
            d,
            at + 1,
            3,
            &format!(
                "MSN {}: messages the responder has completed (mod 2^24)",
                x.msn
            ),
            "covered",
        );
        at += 4;
    }
    if let Some(x) = r.atomic_ack_eth {
        let _ = writeln!(t, "  AtomicAckETH [{}..{}]", at, at + 8);
        row(
            &mut t,
            d,
            at,
            8,
            &format!("original remote data 0x{:x}", x.orig_data),
            "covered",
        );
        at += 8;
    }
    if let Some(x) = r.immdt {
        let _ = writeln!(t, "  ImmDt [{}..{}]", at, at + 4);
        row(
            &mut t,
            d,
            at,
            4,
            &format!("immediate data 0x{x:08x}: delivered in the receiver's completion"),
            "covered",
        );
        at += 4;
    }
    if let Some(x) = r.ieth {
        let _ = writeln!(t, "  IETH [{}..{}]", at, at + 4);
        row(
            &mut t,
            d,
            at,
            4,
            &format!("R_Key 0x{x:08x} the receiver must invalidate"),
            "covered",
        );
        at += 4;
    }
    debug_assert_eq!(at, p.offsets.payload);
    let plen = r.payload.len();
    let _ = writeln!(
        t,
        "  payload [{}..{}]  {} bytes",
        p.offsets.payload, p.offsets.pad, plen
    );
    if plen > 0 {
        row(
            &mut t,
            d,
            p.offsets.payload,
            plen.min(16),
            if plen > 16 {
                "first 16 bytes ..."
            } else {
                "data"
            },
            "covered",
        );
    }
    let pad = usize::from(r.bth.pad_count);
    if pad > 0 {
        let _ = writeln!(t, "  pad [{}..{}]", p.offsets.pad, p.offsets.icrc);
        row(
            &mut t,
            d,
            p.offsets.pad,
            pad,
            &format!("{pad} zero bytes: the packet must be whole 32-bit words"),
            "covered",
        );
    }
    let i = p.offsets.icrc;
    let _ = writeln!(t, "  ICRC [{}..{}]", i, i + 4);
    let verdict = if p.icrc_ok() {
        "matches".to_string()
    } else {
        format!(
            "DOES NOT MATCH the computed 0x{:08x}: the packet was damaged",
            p.icrc_computed
        )
    };
    row(
        &mut t,
        d,
        i,
        4,
        &format!(
            "ICRC 0x{:08x}, sent least significant byte first; {verdict}. Computed as CRC-32 over 8 x 0xFF, then IP header .. pad with the [masked] bytes set to 0xFF",
            p.icrc_received
        ),
        "",
    );
    if p.trailer_len > 0 {
        let _ = writeln!(
            t,
            "  Ethernet padding: {} bytes after the IP packet",
            p.trailer_len
        );
    }
    t.push('\n');
    t
}

fn ack_req_meaning(r: &PacketRepr<'_>) -> String {
    let Some(info) = r.bth.opcode.info() else {
        return format!("AckReq {}", u8::from(r.bth.ack_req));
    };
    if info.is_response || !info.is_request {
        return format!(
            "AckReq {} (responses and CNPs are never acknowledged)",
            u8::from(r.bth.ack_req)
        );
    }
    if r.bth.ack_req {
        let why = if info.position == Position::Last || info.position == Position::Only {
            "the last packet of a message: the requester needs the ACK to complete the work request"
        } else {
            "a periodic request inside a long message, so the window keeps moving"
        };
        format!("AckReq 1: the responder must acknowledge this packet; {why}")
    } else if info.transport == xroce::wire::Transport::Rc {
        "AckReq 0: no ACK needed now; a later ACK will cover this PSN too (ACKs are cumulative)"
            .to_string()
    } else {
        "AckReq 0 (unreliable service: never acknowledged)".to_string()
    }
}

fn syndrome_meaning(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { credit: 0x1F } => {
            "ACK; credit code 31 = the responder does not limit by receive credits (what rxe sends)".into()
        }
        Syndrome::Ack { credit } => format!(
            "ACK; credit code {credit} = {} receive WQEs available at the responder",
            xroce::wire::credit_count(credit).map_or("?".to_string(), |n| n.to_string())
        ),
        Syndrome::RnrNak { timer } => format!(
            "RNR NAK: receiver not ready (no receive WQE); retry this PSN after {:?} (timer code {timer})",
            xroce::wire::rnr_timer(timer)
        ),
        Syndrome::Nak(code) => format!("NAK: {code}; the requester must act on the PSN in this BTH"),
        Syndrome::Reserved(b) => format!("reserved syndrome 0x{b:02x}"),
    }
}
