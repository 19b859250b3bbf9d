//! `xroce dump` on CM MADs (the rxe rping, udaddy and rejected-connect captures): a line per
//! message, `--json`'s `cm` member, `--explain`'s field by field decoding, and the summary's
//! handshakes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The lines under frame lines that decode a CM MAD (indented; the summary's are not).
fn cm_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.starts_with("        CM "))
        .collect()
}

#[test]
fn rping_shows_one_line_per_cm_message_and_the_handshake() {
    let text = stdout(&dump(&[], &fixture("rxe_cm_rping.pcap")));
    let lines = cm_lines(&text);
    assert_eq!(lines.len(), 5, "{text}");
    let names: Vec<&str> = lines
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "DREQ", "DREP"]);
    assert!(lines[0].contains("comm=0x35cffad4"), "{}", lines[0]);
    assert!(
        lines[0].contains("service=0x1061c06(RDMA_PS_TCP port 7174)"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("qpn=0x11 psn=8029245"), "{}", lines[0]);
    assert!(
        lines[0].contains("rdma_cm 198.18.0.12:40909 > 198.18.0.11"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("comm=0xc9b7e32a remote_comm=0x35cffad4 qpn=0x11 psn=8670083"),
        "{}",
        lines[1]
    );
    assert!(lines[3].contains("remote_qpn=0x11"), "{}", lines[3]);
    // Each CM line follows the frame line of its UD SEND to QP1.
    let all: Vec<&str> = text.lines().collect();
    let at = all.iter().position(|l| *l == lines[0]).unwrap();
    assert!(all[at - 1].starts_with("#1 ") && all[at - 1].contains("qp=0x1 "));

    let summary = &text[text.find("--- summary ---").unwrap()..];
    assert!(
        summary.contains("CM connections:     1 (5 CM MADs)"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "198.18.0.12 comm 0x35cffad4 -> 198.18.0.11 comm 0xc9b7e32a, service \
             0x1061c06(RDMA_PS_TCP port 7174), QPN 0x11 <-> 0x11"
        ),
        "{summary}"
    );
    assert!(
        summary.contains("REQ -> REP -> RTU -> DREQ -> DREP  (frames #1 #2 #3 #40 #41)"),
        "{summary}"
    );
    assert!(summary.contains("established, then disconnected"));
}

#[test]
fn a_rejected_connect_shows_the_reason() {
    let text = stdout(&dump(&[], &fixture("rxe_cm_reject.pcap")));
    let lines = cm_lines(&text);
    assert_eq!(lines.len(), 2);
    assert!(
        lines[1].contains("CM REJ comm=0x00000000 remote_comm=0x37cffad4 rejects=Req reason=8"),
        "{}",
        lines[1]
    );
    assert!(
        text.contains("REQ -> REJ(passive)  (frames #1 #2)"),
        "{text}"
    );
    assert!(
        text.contains("rejected by the passive side: reason 8 \"invalid service id\""),
        "{text}"
    );
    assert!(text.contains("(no comm id), service 0x106270f(RDMA_PS_TCP port 9999), QPN 0x13"));
}

#[test]
fn udaddy_shows_the_sidr_exchange() {
    let text = stdout(&dump(&[], &fixture("rxe_cm_udaddy.pcap")));
    assert!(
        text.contains(
            "CM SIDR_REP request=0x34cffad4 status=0 \"success\" qpn=0x12 qkey=0x01234567"
        ),
        "{text}"
    );
    assert!(
        text.contains("SIDR_REQ -> SIDR_REP  (frames #1 #2)"),
        "{text}"
    );
    assert!(
        text.contains("service 0x1111c06(RDMA_PS_UDP port 7174), QPN 0x12"),
        "{text}"
    );
}

#[test]
fn json_carries_a_cm_member() {
    let text = stdout(&dump(&["--json"], &fixture("rxe_cm_rping.pcap")));
    let objects: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let cm: Vec<&serde_json::Value> = objects.iter().filter_map(|o| o.get("cm")).collect();
    assert_eq!(cm.len(), 5);
    assert_eq!(cm[0]["message"], "REQ");
    assert_eq!(cm[0]["service_id"], 0x0106_1C06);
    assert_eq!(cm[0]["local_qpn"], 0x11);
    assert_eq!(cm[0]["rdma_cm"]["src_addr"], "198.18.0.12");
    assert_eq!(cm[1]["remote_comm_id"], cm[0]["local_comm_id"]);
    assert_eq!(cm[1]["starting_psn"], 8670083);
    assert!(objects
        .iter()
        .filter(|o| o["dest_qp"] != 1)
        .all(|o| o.get("cm").is_none()));
}

#[test]
fn explain_decodes_every_field_that_matters_with_its_ibta_section() {
    let text = stdout(&dump(&["--explain"], &fixture("rxe_cm_rping.pcap")));
    for needle in [
        "the payload is a CM MAD (a UD SEND to QP1, the GSI: IBTA 13.5.1): CM REQ",
        "MAD header [62..86]  common MAD header (IBTA 13.4.3)",
        "CM REQ [86..318]  request for communication (IBTA 12.6.5)",
        "005e  00 00 00 00 01 06 1c 06  service id 0x0000000001061c06 (RDMA_PS_TCP port 7174)",
        "0076  00 00 11                 local QPN 0x11",
        "remote CM response timeout 20 (4.096 µs × 2^20 = 4.295 s)",
        "starting PSN 0x7a843d (8029245): the PSN the passive side starts sending with",
        "max CM retries 15",
        "primary local port GID ::ffff:198.18.0.12",
        "primary flow label 0x375d9 (20 bits; RoCEv2 folds it into UDP source port 62932)",
        "rdma_cm header version 0",
        "source port 40909",
        "destination address 198.18.0.11",
        "CM REP [86..318]  reply to request for communication (IBTA 12.6.8)",
        "CM RTU [86..318]  ready to use (IBTA 12.6.9)",
        "CM DREQ [86..318]  request for communication release (IBTA 12.6.10)",
        "CM DREP [86..318]  reply to request for release (IBTA 12.6.11)",
    ] {
        assert!(text.contains(needle), "missing {needle:?}");
    }
    let rej = stdout(&dump(&["--explain"], &fixture("rxe_cm_reject.pcap")));
    assert!(
        rej.contains("reason 8: invalid service id (IBTA 12.6.7, reject reasons)"),
        "{rej}"
    );
}

#[test]
fn a_cm_mad_that_does_not_parse_is_reported_not_fatal() {
    // Frame 1's MAD class version byte: 24-byte pcap header, 16-byte record header, then
    // 62 bytes of Ethernet, IP, UDP, BTH, DETH, then base version, class, class version.
    let mut bytes = std::fs::read(fixture("rxe_cm_rping.pcap")).unwrap();
    assert_eq!(bytes[24 + 16 + 62 + 1], 0x07);
    bytes[24 + 16 + 62 + 2] = 9;
    let path = std::env::temp_dir().join(format!("xroce-dump-cm-{}.pcap", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let out = dump(&[], &path);
    let _ = std::fs::remove_file(&path);
    let text = stdout(&out);
    assert!(
        text.contains("CM MAD does not parse: CM class version 9 is not 2"),
        "{text}"
    );
    assert!(text.contains("frame #1: CM MAD does not parse"), "{text}");
    // The rest of the handshake is still decoded, and the summary opens the connection at
    // the REP.
    let lines = cm_lines(&text);
    assert_eq!(lines.len(), 5);
    assert!(lines[0].contains("does not parse"));
    assert!(
        text.contains("REP -> RTU -> DREQ -> DREP  (frames #2 #3 #40 #41)"),
        "{text}"
    );
}

#[test]
fn resends_and_mras_show_in_the_handshake() {
    let text = stdout(&dump(&[], &fixture("rxe_cm_slow_accept.pcap")));
    assert!(
        text.contains(
            "REQ x2 -> MRA(passive) -> REP -> RTU -> DREQ -> DREP  (frames #1 #2 #3 #4 #5 #18 #19)"
        ),
        "{text}"
    );
    assert!(
        text.contains("CM MRA comm=0xc0b7e32a remote_comm=0x31cffad4 mraed=Req service_timeout=24"),
        "{text}"
    );
    let lost = stdout(&dump(&[], &fixture("rxe_cm_lost_req.pcap")));
    assert!(
        lost.contains("REQ x2 -> REP -> RTU -> DREQ -> DREP  (frames #1 #2 #3 #4 #17 #18)"),
        "{lost}"
    );
}

#[test]
fn interleaved_connections_each_get_their_handshake() {
    let text = stdout(&dump(&[], &fixture("rxe_cm_ucmatose.pcap")));
    assert!(
        text.contains("CM connections:     3 (15 CM MADs)"),
        "{text}"
    );
    for frames in [
        "(frames #1 #2 #7 #34 #37)",
        "(frames #3 #4 #8 #35 #38)",
        "(frames #5 #6 #9 #36 #39)",
    ] {
        assert!(
            text.contains(&format!(
                "REQ -> REP -> RTU -> DREQ(passive) -> DREP  {frames}"
            )),
            "{frames}: {text}"
        );
    }
}

#[test]
fn ipv6_rdma_cm_addresses_are_bracketed_with_their_port() {
    let text = stdout(&dump(&[], &fixture("rxe_cm_rping_ipv6.pcap")));
    assert!(
        text.contains("rdma_cm [fe80::5054:ff:fe18:c]:51558 > fe80::5054:ff:fe18:b"),
        "{text}"
    );
    assert!(text.contains("REQ -> REP -> RTU -> DREQ -> DREP  (frames #1 #2 #3 #16 #17)"));
}
