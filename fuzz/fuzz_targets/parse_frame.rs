//! Fuzzes the frame parser: no input may panic, and whatever parses must re-emit into a
//! frame that parses back to the same fields with a valid ICRC, and explain itself
//! (`PrettyPrint`) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xroce::wire::{frame_icrc, parse_frame, parse_frame_verified, PacketRepr, PrettyPrint};

fuzz_target!(|data: &[u8]| {
    // The RoCE part alone, as if `data` were a UDP payload without its ICRC.
    if let Ok(p) = PacketRepr::parse(data) {
        let mut buf = vec![0u8; p.buffer_len()];
        p.emit(&mut buf).expect("a parsed packet can be emitted");
        assert_eq!(PacketRepr::parse(&buf).expect("re-parse"), p);
    }
    let _ = frame_icrc(data);
    let verified = parse_frame_verified(data);
    match parse_frame(data) {
        Ok(parsed) => {
            assert_eq!(verified.is_ok(), parsed.icrc_ok());
            assert!(!parsed.explain(data, 0, 1).is_empty());
            let mut buf = vec![0u8; parsed.repr.buffer_len()];
            parsed.repr.emit(&mut buf).expect("a parsed frame can be emitted");
            let again = parse_frame(&buf).expect("an emitted frame parses");
            assert!(again.icrc_ok());
            assert_eq!(again.repr, parsed.repr);
        }
        Err(_) => assert!(verified.is_err()),
    }
});
