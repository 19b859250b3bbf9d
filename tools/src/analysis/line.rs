//! One line, or one JSON object, per RoCE frame.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{json, Map, Value};

use xroce::wire::{IpRepr, PacketRepr, ParsedFrame, Syndrome};

/// Source and destination IP addresses.
pub(super) fn addresses(p: &ParsedFrame<'_>) -> (String, String) {
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

/// One line per frame: time, addresses, opcode, QP, PSN, flags, extension header fields,
/// payload length and the ICRC verdict.
pub fn frame_line(number: usize, rel: Duration, p: &ParsedFrame<'_>) -> String {
    let r = &p.repr.roce;
    let (src, dst) = addresses(p);
    let pkey = if r.bth.pkey != 0xFFFF {
        format!(" pkey=0x{:04x}", r.bth.pkey)
    } else {
        String::new()
    };
    let cm = match xroce::wire::cm::gsi_cm_mad(r) {
        Some(Ok(mad)) => format!("        {}\n", super::cm::cm_text(&mad)),
        Some(Err(e)) => format!("        CM MAD does not parse: {e}\n"),
        None => String::new(),
    };
    format!(
        "#{:<5} {:>10.6}  {} > {}  {:<28} qp=0x{:x} psn={} flags={}{}{} payload={}  {}\n{cm}",
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
pub fn frame_json(number: usize, rel: Duration, p: &ParsedFrame<'_>) -> Value {
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
    match xroce::wire::cm::gsi_cm_mad(r) {
        Some(Ok(mad)) => {
            o.insert("cm".into(), super::cm::cm_json(&mad));
        }
        Some(Err(e)) => {
            o.insert("cm".into(), json!({ "error": e.to_string() }));
        }
        None => {}
    }
    Value::Object(o)
}
