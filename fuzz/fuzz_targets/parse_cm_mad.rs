//! Fuzzes the CM MAD parser (IBTA 12.6, 13.4): no input may panic; whatever parses must
//! re-emit to bytes that parse back to the same message, explain itself and print its dump
//! line. The input is tried as a MAD, as CM data under every attribute id, as an rdma_cm
//! private-data header, and as a whole frame (a UD SEND to QP1 carrying a MAD).
#![no_main]

use libfuzzer_sys::fuzz_target;
use xroce_tools::analysis::{cm_json, cm_text, CmConnections};
use xroce::wire::cm::{gsi_cm_mad, CmMad, CmMessage};
use xroce::wire::cma::CmaHeader;
use xroce::wire::{parse_frame, PrettyPrint};

fn check_mad(mad: &CmMad) {
    let bytes = mad.to_bytes().expect("a parsed MAD can be emitted");
    assert_eq!(&CmMad::parse(&bytes).expect("re-parse"), mad);
    assert!(!mad.explain(&bytes, 0, 1).is_empty());
    assert!(cm_text(mad).starts_with("CM "));
    let _ = cm_json(mad);
    let mut connections = CmConnections::default();
    connections.record(1, "a", "b", mad);
    connections.record(2, "b", "a", mad);
    assert!(!connections.report().is_empty());
}

fuzz_target!(|data: &[u8]| {
    if let Ok(mad) = CmMad::parse(data) {
        check_mad(&mad);
    }
    if data.len() >= 2 {
        let attribute_id = u16::from_be_bytes([data[0], data[1]]);
        if let Ok(m) = CmMessage::parse(attribute_id, &data[2..]) {
            let mut again = [0u8; 232];
            m.emit(&mut again).expect("a parsed message can be emitted");
            assert_eq!(CmMessage::parse(attribute_id, &again).expect("re-parse"), m);
        }
    }
    if let Ok(h) = CmaHeader::parse(data) {
        let mut again = [0u8; 36];
        h.emit(&mut again).expect("emit");
        assert_eq!(CmaHeader::parse(&again).expect("re-parse"), h);
    }
    if let Ok(p) = parse_frame(data) {
        if let Some(Ok(mad)) = gsi_cm_mad(&p.repr.roce) {
            check_mad(&mad);
        }
    }
});
