//! `xroce dump --explain`: a heading per frame, then every header explaining itself
//! ([`PrettyPrint`]).

use std::fmt::Write as _;
use std::time::Duration;

use xroce::capture::{link_type_name, CapturedFrame};
use xroce::wire::frame::ETH_LEN;
use xroce::wire::{ParsedFrame, PrettyPrint};

use super::addresses;

/// Frame `f`, `rel` after the capture's first, field by field. `ethernet` is the frame as
/// Ethernet (see [`xroce::capture::to_ethernet`]) and `p` its parse.
pub fn explain_frame(
    f: &CapturedFrame,
    ethernet: &[u8],
    rel: Duration,
    p: &ParsedFrame<'_>,
) -> String {
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
        p.repr.roce.bth.opcode
    );
    if ethernet != &f.data[..] {
        let link_len = f.data.len() + ETH_LEN - ethernet.len();
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
    t.push_str(&p.explain(ethernet, 0, 1));
    match xroce::wire::cm::gsi_cm_mad(&p.repr.roce) {
        Some(Ok(mad)) => {
            let _ = writeln!(
                t,
                "  the payload is a CM MAD (a UD SEND to QP1, the GSI: IBTA 13.5.1): {}",
                super::cm::cm_text(&mad)
            );
            t.push_str(&mad.explain(ethernet, p.offsets.payload, 2));
        }
        Some(Err(e)) => {
            let _ = writeln!(t, "  the payload is a CM MAD that does not parse: {e}");
        }
        None => {}
    }
    t.push('\n');
    t
}
