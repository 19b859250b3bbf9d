//! `xroce dump` end to end: the binary over the fixtures, corrupted copies, pcapng, bad files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use xroce::capture::read_capture;
use xroce::wire::parse_frame;

fn fixture(name: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .join("tests/fixtures")
        .join(name)
}

fn dump(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xroce"))
        .arg("dump")
        .args(args)
        .arg(file)
        .output()
        .expect("run xroce dump")
}

/// A file in the temp dir, unique to this process and test, removed on drop.
struct TempFile(PathBuf);
impl TempFile {
    fn new(tag: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("xroce-dump-{}-{tag}", std::process::id())))
    }
}
impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn summary_value(text: &str, key: &str) -> usize {
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no '{key}' line in:\n{text}"));
    line[key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn every_fixture_dumps_clean() {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("tests/fixtures");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("pcap") {
            continue;
        }
        seen += 1;
        let o = dump(&[], &path);
        assert!(
            o.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let text = stdout(&o);
        let roce = summary_value(&text, "RoCE frames:");
        assert!(roce > 0);
        assert_eq!(summary_value(&text, "ICRC ok:"), roce, "{}", path.display());
        assert_eq!(summary_value(&text, "ICRC bad:"), 0);
        assert_eq!(summary_value(&text, "did not parse:"), 0);
        assert_eq!(text.lines().filter(|l| l.starts_with('#')).count(), roce);
        assert_eq!(
            text.matches("ICRC ok").count(),
            roce + 1,
            "one per frame + the summary label"
        );
    }
    assert!(seen >= 9, "fixtures missing: {seen}");
}

#[test]
fn text_line_shows_the_fields() {
    let text = stdout(&dump(&[], &fixture("rxe_rc_pingpong.pcap")));
    let ack = text.lines().find(|l| l.starts_with("#16 ")).unwrap();
    for want in [
        "198.18.0.11 > 198.18.0.12",
        "RC_ACKNOWLEDGE",
        "qp=0x11",
        "psn=3122471",
        "ACK (credits unlimited)",
        "msn=1",
        "ICRC ok",
    ] {
        assert!(ack.contains(want), "{want:?} missing in {ack}");
    }
    assert!(text.contains("10  0x00 RC_SEND_FIRST"));
    assert!(text.contains("20  0x01 RC_SEND_MIDDLE"));
    assert!(text.contains("IP but not UDP (protocol 6)"));
    let ud = stdout(&dump(&[], &fixture("rxe_ud_pingpong.pcap")));
    assert!(ud.contains("qkey=0x11111111"), "{ud}");
    let nak = stdout(&dump(&[], &fixture("rxe_host_peer_loss.pcap")));
    let l = nak.lines().find(|l| l.starts_with("#28 ")).unwrap();
    assert!(l.contains("NAK (PSN sequence error)"), "{l}");
    let rd = stdout(&dump(&[], &fixture("rxe_read_lat.pcap")));
    let l = rd
        .lines()
        .find(|l| l.contains("RC_RDMA_READ_REQUEST"))
        .unwrap();
    assert!(
        l.contains("rkey=0x")
            && l.contains("va=0x")
            && l.contains("dma_len=64")
            && l.contains("flags=A"),
        "{l}"
    );
}

#[test]
fn json_has_the_agreed_fields() {
    let o = dump(&["--json"], &fixture("rxe_read_lat.pcap"));
    assert!(o.status.success());
    let mut n = 0;
    for line in stdout(&o).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        n += 1;
        for key in [
            "frame",
            "opcode",
            "opcode_name",
            "dest_qp",
            "psn",
            "ack_req",
            "payload_len",
            "icrc_ok",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {line}");
        }
        assert_eq!(v["icrc_ok"], true);
        match v["opcode"].as_u64().unwrap() {
            0x0c => {
                assert_eq!(v["opcode_name"], "RC_RDMA_READ_REQUEST");
                assert_eq!(v["reth"]["dma_len"], 64);
                assert!(v["reth"]["rkey"].is_u64() && v["reth"]["va"].is_u64());
                assert_eq!(v["payload_len"], 0);
            }
            0x10 => {
                assert_eq!(v["aeth"]["type"], "ACK");
                assert_eq!(v["aeth"]["credit"], 31);
                assert_eq!(v["payload_len"], 64);
            }
            other => panic!("unexpected opcode {other}"),
        }
    }
    assert_eq!(n, 40);
    // The summary goes to stderr so stdout stays one object per line.
    assert!(String::from_utf8_lossy(&o.stderr).contains("RoCE frames:        40"));
    let ud = stdout(&dump(&["--json"], &fixture("rxe_ud_pingpong.pcap")));
    let v: serde_json::Value = serde_json::from_str(ud.lines().next().unwrap()).unwrap();
    assert_eq!(v["deth"]["qkey"], 0x1111_1111);
}

#[test]
fn explain_draws_every_header() {
    let o = dump(&["--explain"], &fixture("rxe_ud_pingpong.pcap"));
    assert!(o.status.success());
    let text = stdout(&o);
    let first = text.split("=== frame").nth(1).unwrap();
    for want in [
        "Ethernet [0..14]",
        "IPv4 [14..34]",
        "UDP [34..42]",
        "BTH [42..54]",
        "DETH [54..62]",
        "Q_Key 0x11111111",
        "opcode 0x64 UD_SEND_ONLY",
        "TTL 64",
        "[ICRC: masked]",
        "ICRC [",
        "matches",
    ] {
        assert!(first.contains(want), "{want:?} missing in\n{first}");
    }
    // TOS, TTL, IP checksum, UDP checksum and BTH byte 4: five masked rows per IPv4 frame.
    assert_eq!(first.matches("[ICRC: masked]").count(), 5, "{first}");
}

/// Byte offset of every record's data in a little-endian classic pcap.
fn pcap_record_offsets(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut at = 24;
    let mut out = vec![];
    while at + 16 <= bytes.len() {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        out.push((at + 16, incl));
        at += 16 + incl;
    }
    out
}

#[test]
fn corrupted_copy_reports_exactly_the_corrupted_frames() {
    let src = fixture("rxe_write_bw.pcap");
    let mut bytes = std::fs::read(&src).unwrap();
    let frames = read_capture(&src).unwrap();
    let records = pcap_record_offsets(&bytes);
    assert_eq!(records.len(), frames.len());
    let roce: Vec<usize> = frames
        .iter()
        .filter(|f| parse_frame(&f.data).is_ok())
        .map(|f| f.number)
        .collect();
    // Damage every 7th RoCE frame, each in a different ICRC-covered place.
    let mut damaged = BTreeSet::new();
    for (k, &number) in roce.iter().enumerate().filter(|(k, _)| k % 7 == 3) {
        let (off, len) = records[number - 1];
        let at = match k % 4 {
            0 => off + 18,      // IP identification
            1 => off + 42 + 11, // PSN low byte
            2 => off + len - 5, // last byte before the ICRC
            _ => off + len - 1, // the ICRC itself
        };
        bytes[at] ^= 0x20;
        damaged.insert(number);
    }
    assert!(damaged.len() >= 10, "{damaged:?}");
    // Also flip a masked field in a frame left intact: it must still verify.
    let intact = roce.iter().copied().find(|n| !damaged.contains(n)).unwrap();
    bytes[records[intact - 1].0 + 22] ^= 0xFF; // TTL
    let tmp = TempFile::new("corrupt.pcap");
    std::fs::write(&tmp.0, &bytes).unwrap();

    let o = dump(&["--json"], &tmp.0);
    assert!(o.status.success(), "bad packets are reported, not fatal");
    let bad: BTreeSet<usize> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["icrc_ok"] == false)
        .map(|v| v["frame"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(bad, damaged);

    let text = stdout(&dump(&[], &tmp.0));
    let bad_lines: BTreeSet<usize> = text
        .lines()
        .filter(|l| l.contains("ICRC BAD (expected"))
        .map(|l| l[1..].split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(bad_lines, damaged);
    assert_eq!(summary_value(&text, "ICRC bad:"), damaged.len());
}

#[test]
fn pcapng_is_read_too() {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::DataLink;

    let frames = read_capture(fixture("rxe_send_lat.pcap")).unwrap();
    let tmp = TempFile::new("send_lat.pcapng");
    {
        let file = std::fs::File::create(&tmp.0).unwrap();
        let mut w = PcapNgWriter::new(file).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock::new(DataLink::ETHERNET, 65535))
            .unwrap();
        for f in &frames {
            let epb = EnhancedPacketBlock {
                interface_id: 0,
                timestamp: f.timestamp,
                original_len: f.orig_len,
                data: std::borrow::Cow::Borrowed(&f.data),
                options: vec![],
            };
            w.write_pcapng_block(epb).unwrap();
        }
    }
    let o = dump(&[], &tmp.0);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert_eq!(summary_value(&text, "RoCE frames:"), 80);
    assert_eq!(summary_value(&text, "ICRC ok:"), 80);
    assert_eq!(summary_value(&text, "frames read:"), frames.len());
}

#[test]
fn missing_or_malformed_files_fail_clearly() {
    let o = dump(&[], Path::new("/nonexistent/xroce.pcap"));
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("No such file"),
        "{o:?}"
    );

    let tmp = TempFile::new("not-a-capture");
    std::fs::write(&tmp.0, b"this is not a capture file").unwrap();
    let o = dump(&[], &tmp.0);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a pcap or pcapng file"),
        "{o:?}"
    );

    // A capture cut in the middle of a record: frames before it are reported, then an error.
    let bytes = std::fs::read(fixture("rxe_ud_pingpong.pcap")).unwrap();
    let cut = TempFile::new("cut.pcap");
    std::fs::write(&cut.0, &bytes[..bytes.len() - 100]).unwrap();
    let o = dump(&[], &cut.0);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("malformed after 20 frames"), "{err}");
    assert!(stdout(&o).contains("frames read:        20"));

    let empty = TempFile::new("empty");
    std::fs::write(&empty.0, b"").unwrap();
    assert!(!dump(&[], &empty.0).status.success());
}

#[test]
fn malformed_roce_frames_are_counted_with_their_reason() {
    // Turn the opcode of one UD frame into a reserved value: it still goes to port 4791,
    // so it is a RoCE frame that did not parse, and its ICRC no longer matches.
    let src = fixture("rxe_ud_pingpong.pcap");
    let mut bytes = std::fs::read(&src).unwrap();
    let frames = read_capture(&src).unwrap();
    let records = pcap_record_offsets(&bytes);
    let target = frames
        .iter()
        .find(|f| parse_frame(&f.data).is_ok())
        .unwrap()
        .number;
    bytes[records[target - 1].0 + 42] = 0x7f;
    let tmp = TempFile::new("badop.pcap");
    std::fs::write(&tmp.0, &bytes).unwrap();
    let o = dump(&[], &tmp.0);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(text.contains(&format!("#{target:<5}")), "{text}");
    assert!(
        text.contains("MALFORMED: unknown or unsupported opcode 0x7f"),
        "{text}"
    );
    assert_eq!(summary_value(&text, "did not parse:"), 1);
    assert_eq!(summary_value(&text, "ICRC bad:"), 1);
}

#[test]
fn summary_shows_each_senders_loss_recovery() {
    // The loss capture: each side NAKed one gap and resent from it (go-back-N).
    let text = stdout(&dump(&[], &fixture("rxe_host_peer_loss.pcap")));
    let per_sender: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "per sender:")
        .skip(1)
        .collect();
    assert_eq!(
        per_sender,
        [
            "  198.18.0.1: 28 frames, NAKs 1 (PSN sequence 1, RNR 0, other 0), retransmitted 2 (up to 2 copies of one packet)",
            "  198.18.0.11: 29 frames, NAKs 1 (PSN sequence 1, RNR 0, other 0), retransmitted 3 (up to 2 copies of one packet)",
        ],
        "{text}"
    );
    // A clean run: nothing NAKed, nothing sent twice, on either side.
    let text = stdout(&dump(&[], &fixture("rxe_write_bw.pcap")));
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" frames, NAKs "))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for l in lines {
        assert!(
            l.ends_with("NAKs 0 (PSN sequence 0, RNR 0, other 0), retransmitted 0"),
            "{l}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Link types other than Ethernet, and snaplen cuts

/// Writes `frames` (data, original length) as a pcap of `link_type` with `snaplen`, the
/// timestamps those of rxe_rc_pingpong.pcap (so the lines compare equal), then 1 ms apart.
fn write_pcap(path: &Path, link_type: u32, snaplen: u32, frames: &[(Vec<u8>, u32)]) {
    let times: Vec<std::time::Duration> = read_capture(fixture("rxe_rc_pingpong.pcap"))
        .unwrap()
        .iter()
        .map(|f| f.timestamp)
        .collect();
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    let file = std::fs::File::create(path).unwrap();
    let header = PcapHeader {
        datalink: pcap_file::DataLink::from(link_type),
        snaplen,
        ..PcapHeader::default()
    };
    let mut w = PcapWriter::with_header(file, header).unwrap();
    for (i, (data, orig)) in frames.iter().enumerate() {
        let ts = times
            .get(i)
            .copied()
            .unwrap_or_else(|| times[times.len() - 1] + std::time::Duration::from_millis(i as u64));
        w.write_packet(&PcapPacket::new(ts, *orig, data)).unwrap();
    }
}

/// An Ethernet frame re-wrapped in the link header of `link_type`, as tcpdump writes it.
fn rewrap(link_type: u32, eth: &[u8]) -> Vec<u8> {
    let (src, ether_type, ip) = (&eth[6..12], &eth[12..14], &eth[14..]);
    let mut out = match link_type {
        // SLL: packet type 0 (to us), ARPHRD_ETHER, address length 6, address + 2 pad.
        113 => [&[0, 0, 0, 1, 0, 6][..], src, &[0, 0], ether_type].concat(),
        // SLL2: protocol, reserved, ifindex 2, ARPHRD_ETHER, packet type 0, length 6.
        276 => [ether_type, &[0, 0, 0, 0, 0, 2, 0, 1, 0, 6], src, &[0, 0]].concat(),
        12 | 101 | 228 | 229 => Vec::new(),
        other => panic!("no wrapping for {other}"),
    };
    out.extend_from_slice(ip);
    out
}

/// The per-frame lines of a dump (those starting with '#').
fn frame_lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with('#')).collect()
}

#[test]
fn cooked_and_raw_ip_captures_decode_like_ethernet() {
    let frames = read_capture(fixture("rxe_rc_pingpong.pcap")).unwrap();
    let eth_text = stdout(&dump(&[], &fixture("rxe_rc_pingpong.pcap")));
    let roce = summary_value(&eth_text, "RoCE frames:");
    assert!(roce > 20);
    for link_type in [113, 276, 101, 228, 12] {
        let tmp = TempFile::new(&format!("link{link_type}.pcap"));
        let wrapped: Vec<(Vec<u8>, u32)> = frames
            .iter()
            .map(|f| {
                let d = rewrap(link_type, &f.data);
                let n = d.len() as u32;
                (d, n)
            })
            .collect();
        write_pcap(&tmp.0, link_type, 65535, &wrapped);
        let o = dump(&[], &tmp.0);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = stdout(&o);
        assert_eq!(
            summary_value(&text, "RoCE frames:"),
            roce,
            "link type {link_type}:\n{text}"
        );
        assert_eq!(
            summary_value(&text, "ICRC ok:"),
            roce,
            "link type {link_type}"
        );
        assert_eq!(
            frame_lines(&text),
            frame_lines(&eth_text),
            "link type {link_type}: the same decoded lines"
        );
        // --explain says where the Ethernet header came from.
        let x = stdout(&dump(&["--explain"], &tmp.0));
        assert!(
            x.contains(&format!("(link type {link_type} ")),
            "link type {link_type}: {}",
            &x[..x.len().min(600)]
        );
    }
    // Raw IPv6 (229) and SLL2 over IPv6, pcapng: an IPv6 RoCE frame built from frame #16.
    let mut repr = parse_frame(&frames[15].data).unwrap().repr;
    repr.ip = xroce::wire::IpRepr::V6 {
        src: "fd00::11".parse().unwrap(),
        dst: "fd00::12".parse().unwrap(),
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
    };
    let mut v6 = vec![0u8; repr.buffer_len()];
    repr.emit(&mut v6).unwrap();
    let tmp = TempFile::new("link229.pcap");
    let d = rewrap(229, &v6);
    write_pcap(&tmp.0, 229, 65535, &[(d.clone(), d.len() as u32)]);
    let text = stdout(&dump(&[], &tmp.0));
    let line = frame_lines(&text)[0].to_string();
    assert!(
        line.contains("fd00::11 > fd00::12")
            && line.contains("RC_ACKNOWLEDGE")
            && line.contains("ICRC ok"),
        "{text}"
    );
    {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
        use pcap_file::pcapng::PcapNgWriter;
        let tmp = TempFile::new("sll2.pcapng");
        {
            let file = std::fs::File::create(&tmp.0).unwrap();
            let mut w = PcapNgWriter::new(file).unwrap();
            w.write_pcapng_block(InterfaceDescriptionBlock::new(
                pcap_file::DataLink::LINUX_SLL2,
                65535,
            ))
            .unwrap();
            let d = rewrap(276, &v6);
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: std::time::Duration::ZERO,
                original_len: d.len() as u32,
                data: std::borrow::Cow::Borrowed(&d),
                options: vec![],
            })
            .unwrap();
        }
        let text = stdout(&dump(&[], &tmp.0));
        assert_eq!(frame_lines(&text), vec![line.as_str()], "{text}");
    }
    // A link type with no IP is counted by name, not decoded.
    let tmp = TempFile::new("link147.pcap");
    write_pcap(&tmp.0, 147, 65535, &[(vec![1, 2, 3], 3)]);
    let text = stdout(&dump(&[], &tmp.0));
    assert!(text.contains("link type 147 (not decoded)"), "{text}");
}

#[test]
fn snaplen_cut_frames_are_reported_as_cut() {
    let frames = read_capture(fixture("rxe_write_bw.pcap")).unwrap();
    let snaplen = 96u32;
    let long = frames
        .iter()
        .filter(|f| f.data.len() > snaplen as usize && parse_frame(&f.data).is_ok())
        .count();
    assert!(long > 10);
    for link_type in [1u32, 276] {
        let cut: Vec<(Vec<u8>, u32)> = frames
            .iter()
            .map(|f| {
                let d = if link_type == 1 {
                    f.data.clone()
                } else {
                    rewrap(link_type, &f.data)
                };
                let orig = d.len() as u32;
                (d[..d.len().min(snaplen as usize)].to_vec(), orig)
            })
            .collect();
        let tmp = TempFile::new(&format!("cut{link_type}.pcap"));
        write_pcap(&tmp.0, link_type, snaplen, &cut);
        let o = dump(&[], &tmp.0);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let text = stdout(&o);
        assert!(!text.contains("truncated IPv4 header"), "{text}");
        assert_eq!(summary_value(&text, "cut by snaplen:"), long, "{text}");
        assert_eq!(summary_value(&text, "did not parse:"), 0, "{text}");
        assert_eq!(summary_value(&text, "ICRC bad:"), 0, "{text}");
        // A WRITE of the capture, decoded as far as the snaplen goes.
        let (i, big) = cut
            .iter()
            .enumerate()
            .find(|(_, (d, orig))| d.len() < *orig as usize && *orig > 1000)
            .unwrap();
        let want = format!(
            "CUT: frame cut by the capture's snaplen: {snaplen} of {} bytes captured; ICRC not checkable",
            big.1
        );
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("#{} ", i + 1)))
            .unwrap();
        assert!(line.contains(&want), "{line}");
        assert!(
            line.contains("198.18.0.") && line.contains("RC_RDMA_WRITE"),
            "{line}"
        );
        assert!(line.contains(" qp=0x") && line.contains(" psn="), "{line}");
        // JSON says the same.
        let json = stdout(&dump(&["--json"], &tmp.0));
        let v: serde_json::Value = json
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["frame"] == i + 1)
            .unwrap();
        assert_eq!(v["snaplen_cut"], true);
        assert_eq!(v["captured_len"], snaplen);
        assert_eq!(v["original_len"], big.1);
        assert!(v["icrc_ok"].is_null());
        assert!(
            v["opcode_name"].as_str().unwrap().contains("RDMA_WRITE"),
            "{v}"
        );
    }
    // pcapng records carry the original length too.
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;
    let tmp = TempFile::new("cut.pcapng");
    {
        let file = std::fs::File::create(&tmp.0).unwrap();
        let mut w = PcapNgWriter::new(file).unwrap();
        w.write_pcapng_block(InterfaceDescriptionBlock::new(
            pcap_file::DataLink::ETHERNET,
            snaplen,
        ))
        .unwrap();
        for f in &frames {
            let n = f.data.len().min(snaplen as usize);
            w.write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: f.timestamp,
                original_len: f.orig_len,
                data: std::borrow::Cow::Borrowed(&f.data[..n]),
                options: vec![],
            })
            .unwrap();
        }
    }
    let text = stdout(&dump(&[], &tmp.0));
    assert_eq!(summary_value(&text, "cut by snaplen:"), long, "{text}");
    assert!(
        text.contains("CUT: frame cut by the capture's snaplen: 96 of "),
        "{text}"
    );
}

#[test]
fn ipv4_options_are_decoded_and_drawn() {
    // Frame #16 of rxe_rc_pingpong.pcap (an ACK) with a Router Alert option: IHL 6.
    let frames = read_capture(fixture("rxe_rc_pingpong.pcap")).unwrap();
    let ack = &frames[15].data;
    let mut f = ack[..34].to_vec();
    f.extend_from_slice(&[0x94, 0x04, 0x00, 0x00]);
    f.extend_from_slice(&ack[34..]);
    f[14] = 0x46;
    let total = u16::from_be_bytes([f[16], f[17]]) + 4;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let mut sum: u32 = f[14..38]
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let icrc_at = f.len() - 4;
    let crc = xroce::wire::icrc_ipv4(&f[14..38], &f[38..icrc_at]);
    f[icrc_at..].copy_from_slice(&crc.to_le_bytes());
    let tmp = TempFile::new("options.pcap");
    let n = f.len() as u32;
    write_pcap(&tmp.0, 1, 65535, &[(f, n)]);
    let text = stdout(&dump(&[], &tmp.0));
    let line = frame_lines(&text)[0];
    assert!(
        line.contains("RC_ACKNOWLEDGE") && line.contains("ICRC ok"),
        "{text}"
    );
    let x = stdout(&dump(&["--explain"], &tmp.0));
    assert!(
        x.contains("version 4, IHL 6 (24-byte header with options)"),
        "{x}"
    );
    assert!(x.contains("0022  94 04 00 00"), "{x}");
    assert!(x.contains("4 bytes of IPv4 options"), "{x}");
    assert!(x.contains("header checksum") && x.contains("(ok;"), "{x}");
}

/// The rungs of a ladder SVG: (class, frame number, label), in drawing order.
fn ladder_rungs(svg: &str) -> Vec<(String, usize, String)> {
    let mut rungs = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<line class=\"rung ") {
        rest = &rest[i + "<line class=\"rung ".len()..];
        let class = rest[..rest.find('"').unwrap()].to_string();
        let frame_at = rest.find("data-frame=\"").unwrap() + "data-frame=\"".len();
        let frame: usize = rest[frame_at..frame_at + rest[frame_at..].find('"').unwrap()]
            .parse()
            .unwrap();
        let label_at = rest.find("<text class=\"label").unwrap();
        let label = &rest[label_at..];
        let label = &label[label.find('>').unwrap() + 1..label.find("</text>").unwrap()];
        rungs.push((class, frame, label.to_string()));
    }
    rungs
}

#[test]
fn ladder_draws_every_roce_frame_in_order() {
    for (name, want_classes) in [
        ("rxe_rc_pingpong.pcap", &["request", "ack"][..]),
        (
            "rxe_host_peer_loss.pcap",
            &["request", "ack", "nak", "retransmit"][..],
        ),
        (
            "rxe_cm_rping.pcap",
            &["cm", "request", "response", "ack"][..],
        ),
    ] {
        let svg_file = TempFile::new(&format!("ladder-{name}.svg"));
        let out = dump(
            &["--json", "--ladder", svg_file.0.to_str().unwrap()],
            &fixture(name),
        );
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let frames: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let svg = std::fs::read_to_string(&svg_file.0).unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        let rungs = ladder_rungs(&svg);
        assert_eq!(rungs.len(), frames.len(), "{name}: one rung per RoCE frame");
        for (f, (class, number, label)) in frames.iter().zip(&rungs) {
            assert_eq!(f["frame"].as_u64().unwrap() as usize, *number, "{name}");
            assert!(label.starts_with(&format!("#{number} ")), "{name}: {label}");
            if class != "cm" {
                let psn = f["psn"].as_u64().unwrap();
                assert!(label.contains(&format!(" psn={psn}")), "{name}: {label}");
                let op = f["opcode_name"].as_str().unwrap();
                assert!(
                    label.contains(op.trim_start_matches("RC_")),
                    "{name}: {label} vs {op}"
                );
            }
        }
        for want in want_classes {
            assert!(
                rungs.iter().any(|(c, _, _)| c == want),
                "{name}: no rung of class {want}"
            );
        }
        // Both endpoints are columns.
        let ends: BTreeSet<String> = frames
            .iter()
            .flat_map(|f| {
                [
                    f["src"].as_str().unwrap().to_string(),
                    f["dst"].as_str().unwrap().to_string(),
                ]
            })
            .collect();
        for end in &ends {
            assert!(
                svg.contains(&format!(">{end}</text>")),
                "{name}: no column {end}"
            );
        }
    }
    // The CM handshake reads as such.
    let svg_file = TempFile::new("ladder-cm.svg");
    let out = dump(
        &["--ladder", svg_file.0.to_str().unwrap()],
        &fixture("rxe_cm_rping.pcap"),
    );
    assert!(out.status.success());
    let labels: Vec<String> = ladder_rungs(&std::fs::read_to_string(&svg_file.0).unwrap())
        .into_iter()
        .filter(|(c, _, _)| c == "cm")
        .map(|(_, _, l)| l.split_once(' ').unwrap().1.to_string())
        .collect();
    assert_eq!(labels[..3], ["CM REQ", "CM REP", "CM RTU"], "{labels:?}");
}

#[test]
fn ladder_limit_and_bad_values() {
    let svg_file = TempFile::new("ladder-limit.svg");
    let out = dump(
        &[
            "--ladder",
            svg_file.0.to_str().unwrap(),
            "--ladder-max",
            "5",
        ],
        &fixture("rxe_rc_pingpong.pcap"),
    );
    assert!(out.status.success());
    let svg = std::fs::read_to_string(&svg_file.0).unwrap();
    assert_eq!(ladder_rungs(&svg).len(), 5);
    assert!(svg.contains("more packets not drawn"), "{svg}");
    let out = dump(&["--ladder-max", "5"], &fixture("rxe_rc_pingpong.pcap"));
    assert!(!out.status.success(), "--ladder-max needs --ladder");
    let out = dump(
        &[
            "--ladder",
            svg_file.0.to_str().unwrap(),
            "--ladder-max",
            "0",
        ],
        &fixture("rxe_rc_pingpong.pcap"),
    );
    assert!(!out.status.success(), "--ladder-max 0 is refused");
    let out = dump(
        &["--ladder", "/nonexistent-dir/x.svg"],
        &fixture("rxe_rc_pingpong.pcap"),
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot write the ladder"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The ladders in docs/wire.md are what `xroce dump --ladder` draws today.
#[test]
fn the_docs_ladders_are_current() {
    for (fixture_name, doc, max) in [
        (
            "rxe_host_peer_loss.pcap",
            "ladder-rxe-host-peer-loss.svg",
            "2000",
        ),
        ("rxe_cm_rping.pcap", "ladder-rxe-cm-rping.svg", "18"),
    ] {
        let svg_file = TempFile::new(&format!("docs-{doc}"));
        let path = fixture(fixture_name);
        let out = dump(
            &[
                "--ladder",
                svg_file.0.to_str().unwrap(),
                "--ladder-max",
                max,
            ],
            &path,
        );
        assert!(out.status.success());
        let dir = format!("{}/", path.parent().unwrap().display());
        let drawn = std::fs::read_to_string(&svg_file.0)
            .unwrap()
            .replace(&dir, "");
        let docs = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .join("docs/img")
            .join(doc);
        let kept = std::fs::read_to_string(&docs).unwrap();
        assert!(
            drawn == kept,
            "{} is out of date: xroce dump --ladder {} --ladder-max {max} \
             tests/fixtures/{fixture_name}, then drop the folder from its title",
            docs.display(),
            docs.display()
        );
    }
}
