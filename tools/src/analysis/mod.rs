//! Capture analysis for `xroce dump`: each frame classified (RoCE, not RoCE and why,
//! malformed, cut by the snaplen), counted per opcode and per sender (NAKs, retransmissions),
//! and written as a line, a JSON object or a field-by-field explanation
//! ([`xroce::wire::PrettyPrint`]); then a summary. Reading the file is [`xroce::capture`]'s.

mod cm;
mod explain;
mod ladder;
mod line;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Value};

use xroce::capture::{to_ethernet, CapturedFrame};
use xroce::wire::{frame_icrc, parse_frame, NakCode, Opcode, ParsedFrame, Syndrome, WireError};

pub use cm::{cm_json, cm_text, CmConnections};
pub use explain::explain_frame;
pub use ladder::{Ladder, Rung, RungKind};
use line::addresses;
pub use line::{frame_json, frame_line};

/// How each RoCE frame is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// One line per frame.
    Line,
    /// One JSON object per frame.
    Json,
    /// Every header field by field ([`explain_frame`]).
    Explain,
}

/// What a capture holds so far: the counters behind [`CaptureSummary::report`].
#[derive(Default)]
pub struct CaptureSummary {
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
    /// CM MADs (UD SENDs to QP1) and the connections they make.
    cm: CmConnections,
    /// The ladder diagram being drawn (`xroce dump --ladder`), if asked for.
    ladder: Option<Ladder>,
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

impl CaptureSummary {
    /// Counts the frame for its sender; true if it repeats an earlier packet of that sender.
    fn count_sender(&mut self, p: &ParsedFrame<'_>) -> bool {
        let (src, _) = addresses(p);
        let r = &p.repr.roce;
        self.count_sender_bth(src, &r.bth, r.aeth)
    }

    /// As `count_sender`, from the BTH and AETH alone (all a snaplen-cut frame may show).
    fn count_sender_bth(
        &mut self,
        src: String,
        bth: &xroce::wire::BthRepr,
        aeth: Option<xroce::wire::AethRepr>,
    ) -> bool {
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
            return *n > 1;
        }
        false
    }
}

impl CaptureSummary {
    /// Counts one frame read from the capture, `rel` after its first, and returns what to
    /// print for it (`None` for a frame that is not RoCE).
    pub fn frame(&mut self, f: &CapturedFrame, rel: Duration, output: Output) -> Option<String> {
        self.frames += 1;
        handle_frame(output, f, rel, self)
    }

    /// The summary printed after the frames.
    pub fn report(&self) -> String {
        summary_text(self)
    }

    /// Also draws a ladder diagram of at most `limit` RoCE frames ([`CaptureSummary::ladder`]).
    pub fn with_ladder(mut self, limit: usize) -> CaptureSummary {
        self.ladder = Some(Ladder::new(limit));
        self
    }

    /// The ladder diagram of the frames so far, if [`CaptureSummary::with_ladder`] asked for one.
    pub fn ladder(&self) -> Option<&Ladder> {
        self.ladder.as_ref()
    }
}

/// Classifies one frame, updates the summary and returns what to print for it.
fn handle_frame(
    output: Output,
    f: &CapturedFrame,
    rel: Duration,
    s: &mut CaptureSummary,
) -> Option<String> {
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
            let repeated = s.count_sender(&p);
            if let Some(ladder) = &mut s.ladder {
                ladder.frame(f.number, rel, &p, repeated);
            }
            if let Some(mad) = xroce::wire::cm::gsi_cm_mad(&p.repr.roce) {
                let (src, dst) = addresses(&p);
                match mad {
                    Ok(mad) => s.cm.record(f.number, &src, &dst, &mad),
                    Err(e) => s.cm.bad.push((f.number, e.to_string())),
                }
            }
            if p.icrc_ok() {
                s.icrc_ok += 1;
            } else {
                s.icrc_bad.push(f.number);
            }
            Some(match output {
                Output::Json => {
                    let mut line = frame_json(f.number, rel, &p).to_string();
                    line.push('\n');
                    line
                }
                Output::Explain => explain_frame(f, data, rel, &p),
                Output::Line => frame_line(f.number, rel, &p),
            })
        }
        Err(_) if cut => snaplen_cut(output, f, data, rel, s),
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
            Some(if output == Output::Json {
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
    output: Output,
    f: &CapturedFrame,
    data: &[u8],
    rel: Duration,
    s: &mut CaptureSummary,
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
    if output == Output::Json {
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

fn summary_text(s: &CaptureSummary) -> String {
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
    // Loss recovery as each side performed it (IBTA Vol. 1 9.7: NAK a gap, go back, retry).
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
    if !s.cm.is_empty() {
        t.push_str(&s.cm.report());
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
