//! The out-of-band exchanges checked against real TCP bytes.
//!
//! `tests/fixtures/oob/<capture>.{client,server}.bin` are the two directions of the TCP
//! conversation in the rxe captures (`rxe_rc_pingpong.pcap`, `rxe_write_bw.pcap`, ...),
//! extracted by `xroce_tools::tcp_streams`. Each test replays one side's recorded bytes
//! to xroce's logic for the other side and compares what xroce sends with what the real
//! tool sent, field by field: fixed fields (versions, page size, MTU, LID, GID,
//! outstanding reads, "done") by value, per-run fields (QPN, PSN, R_Key, VA) by format
//! and by the echo rule (every later round repeats the first).
//!
//! Regenerate the fixtures from the captures with
//! `XROCE_REGEN_OOB_FIXTURES=1 XROCE_EXTRA_PCAPS=/path/to/pcaps cargo test --test tools_oob_replay`.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use xroce_tools::perftest::oob::{
    self as perftest_oob, BwReport, LocalSide, NegotiateParams, PeerWatch, PerftestComm,
    PerftestDest, PerftestRunner, Role, Step, SysData, TestKind,
};
use xroce_tools::pingpong::oob::{self as pingpong_oob, PingpongDest};
use xroce_tools::setup::OobStream;
use xroce_tools::tcp_streams;

const CAPTURES: [&str; 9] = [
    "rxe_rc_pingpong",
    "rxe_ud_pingpong",
    "rxe_host_peer_loss",
    "rxe_write_bw",
    "rxe_read_bw",
    "rxe_mtu9000_write_bw",
    "rxe_send_lat",
    "rxe_write_lat",
    "rxe_read_lat",
];

fn fixture_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("tests/fixtures/oob")
}

fn load(capture: &str) -> (Vec<u8>, Vec<u8>) {
    let dir = fixture_dir();
    let read = |side: &str| {
        let path = dir.join(format!("{capture}.{side}.bin"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("missing fixture {}: {e}", path.display()))
    };
    (read("client"), read("server"))
}

fn find_pcap(capture: &str) -> Option<PathBuf> {
    let manifest = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    let mut dirs = vec![manifest.join("tests/fixtures")];
    if let Ok(extra) = std::env::var("XROCE_EXTRA_PCAPS") {
        dirs.push(PathBuf::from(extra));
    }
    dirs.push(manifest.join("../shared/pcaps"));
    dirs.into_iter()
        .map(|d| d.join(format!("{capture}.pcap")))
        .find(|p| p.exists())
}

/// The fixtures are exactly what the captures contain (and can be regenerated).
#[test]
fn fixtures_match_the_captures() {
    let regen = std::env::var("XROCE_REGEN_OOB_FIXTURES").is_ok_and(|v| v == "1");
    let mut checked = 0;
    for capture in CAPTURES {
        let Some(pcap) = find_pcap(capture) else {
            continue;
        };
        let conversations = tcp_streams::tcp_conversations(&pcap, 18515).unwrap();
        assert_eq!(conversations.len(), 1, "{capture}: one TCP conversation");
        let conv = &conversations[0];
        assert_eq!(
            conv.server.port(),
            18515,
            "{capture}: server side is port 18515"
        );
        if regen {
            std::fs::create_dir_all(fixture_dir()).unwrap();
            std::fs::write(
                fixture_dir().join(format!("{capture}.client.bin")),
                &conv.client_bytes,
            )
            .unwrap();
            std::fs::write(
                fixture_dir().join(format!("{capture}.server.bin")),
                &conv.server_bytes,
            )
            .unwrap();
        }
        let (client, server) = load(capture);
        assert_eq!(
            conv.client_bytes, client,
            "{capture}: client stream differs from fixture"
        );
        assert_eq!(
            conv.server_bytes, server,
            "{capture}: server stream differs from fixture"
        );
        checked += 1;
    }
    if checked == 0 {
        let msg = "no capture found (tests/fixtures/*.pcap, $XROCE_EXTRA_PCAPS, ../shared/pcaps)";
        if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
            panic!("{msg}");
        }
        common::report_skip("fixtures_match_the_captures", msg);
    }
}

/// A stream that serves recorded bytes to reads and records writes.
struct Replay {
    input: std::io::Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Replay {
    fn new(input: Vec<u8>) -> Self {
        Replay {
            input: std::io::Cursor::new(input),
            output: Vec::new(),
        }
    }
    fn leftover(&self) -> &[u8] {
        &self.input.get_ref()[self.input.position() as usize..]
    }
}

impl Read for Replay {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl OobStream for Replay {
    fn bound_reads(&mut self, _limit: Option<std::time::Duration>) -> std::io::Result<()> {
        Ok(())
    }
    fn nonblocking_reads(&mut self, _on: bool) -> std::io::Result<()> {
        Ok(())
    }
}

impl Write for Replay {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn mapped_gid(ip: Ipv4Addr) -> [u8; 16] {
    ip.to_ipv6_mapped().octets()
}

/// Checks the shape of a pingpong message: `%04x:%06x:%06x:` + 32 lowercase hex + NUL.
fn assert_pingpong_format(msg: &[u8]) {
    assert_eq!(msg.len(), 52);
    assert_eq!(msg[51], 0);
    for (i, &b) in msg[..51].iter().enumerate() {
        if [4, 11, 18].contains(&i) {
            assert_eq!(b, b':', "separator at {i}");
        } else {
            assert!(
                b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
                "hex digit at {i}: {b}"
            );
        }
    }
}

fn pingpong_server_side(capture: &str, server_ip: Ipv4Addr) {
    let (client, server) = load(capture);
    assert_eq!(
        client.len(),
        52 + 5,
        "{capture}: client sends address + done"
    );
    assert_eq!(server.len(), 52, "{capture}: server sends its address only");
    let mine = PingpongDest {
        lid: 0,
        qpn: 0x77,
        psn: 0x123456,
        gid: mapped_gid(server_ip),
    };
    let mut stream = Replay::new(client.clone());
    let mut connected_to = None;
    let remote = pingpong_oob::server_exchange(&mut stream, &mine, |rem| {
        connected_to = Some(*rem);
        Ok(())
    })
    .unwrap();
    // Echo rule: the QP we connect is exactly what the client announced.
    let announced = PingpongDest::decode(&client[..52]).unwrap();
    assert_eq!(connected_to, Some(announced));
    assert_eq!(remote, announced);
    assert!(
        stream.leftover().is_empty(),
        "we consumed the client's done"
    );
    // Field by field against the real server's reply.
    assert_pingpong_format(&stream.output);
    assert_pingpong_format(&server);
    let ours = PingpongDest::decode(&stream.output).unwrap();
    let real = PingpongDest::decode(&server).unwrap();
    assert_eq!(ours.lid, real.lid, "LID");
    assert_eq!(
        ours.gid, real.gid,
        "GID (we were given the server's address)"
    );
    assert_eq!((ours.qpn, ours.psn), (0x77, 0x123456));
}

fn pingpong_client_side(capture: &str, client_ip: Ipv4Addr) {
    let (client, server) = load(capture);
    let mine = PingpongDest {
        lid: 0,
        qpn: 0x42,
        psn: 0xabcdef,
        gid: mapped_gid(client_ip),
    };
    let mut stream = Replay::new(server.clone());
    let remote = pingpong_oob::client_exchange(&mut stream, &mine).unwrap();
    assert_eq!(remote, PingpongDest::decode(&server).unwrap());
    assert_eq!(stream.output.len(), client.len());
    assert_pingpong_format(&stream.output[..52]);
    let (ours, real) = (
        PingpongDest::decode(&stream.output[..52]).unwrap(),
        PingpongDest::decode(&client[..52]).unwrap(),
    );
    assert_eq!((ours.lid, ours.gid), (real.lid, real.gid));
    assert_eq!(&stream.output[52..], &client[52..], "\"done\\0\"");
}

#[test]
fn rc_pingpong_server_reply_matches_rxe() {
    pingpong_server_side("rxe_rc_pingpong", Ipv4Addr::new(198, 18, 0, 11));
    pingpong_client_side("rxe_rc_pingpong", Ipv4Addr::new(198, 18, 0, 12));
}

#[test]
fn ud_pingpong_server_reply_matches_rxe() {
    pingpong_server_side("rxe_ud_pingpong", Ipv4Addr::new(198, 18, 0, 11));
    pingpong_client_side("rxe_ud_pingpong", Ipv4Addr::new(198, 18, 0, 12));
}

#[test]
fn rc_pingpong_against_host_peer_capture() {
    // Here the client is the rxe guest (198.18.0.11) and the server a host-side peer.
    pingpong_server_side("rxe_host_peer_loss", Ipv4Addr::new(198, 18, 0, 1));
    pingpong_client_side("rxe_host_peer_loss", Ipv4Addr::new(198, 18, 0, 11));
}

#[test]
fn truncated_pingpong_stream_is_a_typed_error() {
    let (client, _) = load("rxe_rc_pingpong");
    let mine = PingpongDest {
        lid: 0,
        qpn: 1,
        psn: 1,
        gid: [0; 16],
    };
    let mut stream = Replay::new(client[..30].to_vec());
    let err = pingpong_oob::server_exchange(&mut stream, &mine, |_| Ok(())).unwrap_err();
    assert!(
        matches!(err, pingpong_oob::PingpongOobError::Io { .. }),
        "{err}"
    );
    let mut bad_done = client.clone();
    bad_done[52] = b'D';
    let mut stream = Replay::new(bad_done);
    let err = pingpong_oob::server_exchange(&mut stream, &mine, |_| Ok(())).unwrap_err();
    assert!(
        matches!(err, pingpong_oob::PingpongOobError::BadDone { .. }),
        "{err}"
    );
}

/// What the RDMA side of a replay does: nothing, but it records and reports.
struct FakeRunner {
    connected: Option<Vec<PerftestDest>>,
    report: BwReport,
    bw: bool,
}

impl PerftestRunner for FakeRunner {
    fn connect(&mut self, remote: &[PerftestDest], _mtu: u8) -> anyhow::Result<()> {
        self.connected = Some(remote.to_vec());
        Ok(())
    }
    fn run(&mut self, _size: u64, _peer: &mut dyn PeerWatch) -> anyhow::Result<Option<BwReport>> {
        Ok(self.bw.then_some(self.report))
    }
}

/// Splits a recorded direction into the messages the script says it has.
fn message_lengths(
    steps: &[Step],
    remote_version: f64,
    with_gid: bool,
) -> Vec<(&'static str, usize)> {
    let dest = PerftestDest::wire_len(with_gid);
    let mut out = Vec::new();
    for step in steps {
        match step {
            Step::Versions => out.push(("version", 16)),
            Step::SysData => out.extend([("page size", 4), ("cache line", 4)]),
            Step::Mtu => out.push(("mtu", 2)),
            Step::Negotiate => {
                if remote_version >= perftest_oob::NEGOTIATE_MIN_VERSION {
                    out.push(("params", NegotiateParams::wire_len(true)));
                }
            }
            Step::HandShake(_) => out.push(("dest", dest)),
            Step::BwReports | Step::DuplexReports => out.extend([
                ("report size", 8),
                ("report iters", 8),
                ("report peak", 8),
                ("report avg", 8),
                ("report rate", 8),
            ]),
            Step::Close => out.extend([("dest", dest), ("done", 5)]),
            // -R only, and -R has no TCP to replay.
            Step::SyncHandShake => out.push(("sync dest", dest)),
            Step::Connect | Step::CmConnect | Step::Run(_) => {}
        }
    }
    out
}

fn local_side(kind: TestKind, ip: Ipv4Addr, out_reads: u32) -> LocalSide {
    let dest = PerftestDest {
        lid: 0,
        out_reads,
        qpn: 0x99,
        psn: 0x654321,
        rkey: 0xabcd,
        vaddr: 0x7f12_3456_7000,
        gid: Some(mapped_gid(ip)),
        srqn: 0,
    };
    LocalSide {
        sys_data: SysData {
            page_size: 4096,
            cache_line: 64,
        },
        mtu_enum: 3,
        params: NegotiateParams {
            test_method: 0,
            connection_type: 0,
            verb: kind.verb(),
            tst: i32::from(kind.is_bw()),
            atomic_type: 0,
            test_type: 0,
            report_fmt: 1,
            size: 4096,
            iters: 20,
            aes_xts: 0,
            num_of_qps: 1,
            duration: 0,
            use_rdma_cm: 0,
            use_write_with_imm: 0,
            no_enhanced_reorder: 0,
            sig_offload: 0,
            data_validation: 0,
            device_attr: NegotiateParams::device_attr_block(out_reads as i32),
            mlx5dv_comp_mask: Some(0),
        },
        dests: vec![dest],
    }
}

/// Compares our direction with the real one, message by message.
fn compare_perftest_streams(capture: &str, ours: &[u8], real: &[u8], lengths: &[(&str, usize)]) {
    let total: usize = lengths.iter().map(|l| l.1).sum();
    assert_eq!(
        real.len(),
        total,
        "{capture}: the script explains every recorded byte"
    );
    assert_eq!(
        ours.len(),
        total,
        "{capture}: we sent as many bytes as the real tool"
    );
    let mut at = 0;
    let mut first_dest: Option<PerftestDest> = None;
    let mut our_first: Option<PerftestDest> = None;
    for &(what, len) in lengths {
        let (o, r) = (&ours[at..at + len], &real[at..at + len]);
        match what {
            "dest" => {
                let od = PerftestDest::decode(o, true).unwrap();
                let rd = PerftestDest::decode(r, true).unwrap();
                assert_eq!(
                    (od.lid, od.out_reads, od.gid, od.srqn),
                    (rd.lid, rd.out_reads, rd.gid, rd.srqn),
                    "{capture}: fixed fields of {what} at {at}"
                );
                // Echo rule on both sides: every round repeats the first.
                assert_eq!(
                    *first_dest.get_or_insert(rd),
                    rd,
                    "{capture}: real rounds repeat"
                );
                assert_eq!(
                    *our_first.get_or_insert(od),
                    od,
                    "{capture}: our rounds repeat"
                );
                assert_eq!(o.len(), r.len());
            }
            // The real server sends uninitialised memory as its half-duplex report.
            w if w.starts_with("report") => {}
            _ => assert_eq!(o, r, "{capture}: {what} at byte {at}"),
        }
        at += len;
    }
}

fn perftest_replay(capture: &str, kind: TestKind, out_reads: u32, mtu_enum: u8) {
    let (client, server) = load(capture);
    // Server side: replay the client's bytes.
    let steps = perftest_oob::script(kind, Role::Server, &[4096], 1);
    let mut local = local_side(kind, Ipv4Addr::new(198, 18, 0, 11), out_reads);
    local.mtu_enum = mtu_enum;
    let mut runner = FakeRunner {
        connected: None,
        report: BwReport::default(),
        bw: kind.is_bw(),
    };
    let mut comm = PerftestComm::new(
        Replay::new(client.clone()),
        Role::Server,
        "6.06",
        false,
        true,
    );
    let outcome = perftest_oob::run_script(&mut comm, &steps, &local, &mut runner).unwrap();
    assert_eq!(outcome.remote_version.as_deref(), Some("6.06"));
    assert_eq!(outcome.mtu_enum, mtu_enum);
    assert!(
        outcome.remote_params.is_none(),
        "6.06 sends no parameter block"
    );
    let client_first = PerftestDest::decode(&client[26..26 + 108], true).unwrap();
    assert_eq!(
        runner.connected.as_deref(),
        Some(&[client_first][..]),
        "connect uses the client's QP"
    );
    if kind.is_bw() {
        let rep = outcome.remote_report.unwrap();
        assert_eq!(
            (rep.size, rep.iters),
            (4096, 20),
            "client's report: -s 4096 -n 20"
        );
        assert!(rep.bw_avg > 0.0 && rep.bw_avg.is_finite());
    }
    let stream = comm.into_inner();
    let leftover = stream.leftover();
    let expect_done: &[u8] = if steps.contains(&Step::Close) {
        b"done\0"
    } else {
        b""
    };
    assert_eq!(
        leftover, expect_done,
        "{capture}: all client bytes consumed except its done"
    );
    let lengths = message_lengths(&steps, 6.06, true);
    compare_perftest_streams(capture, &stream.output, &server, &lengths);

    // Client side: replay the server's bytes.
    let sizes = [4096u64];
    let steps = perftest_oob::script(kind, Role::Client, &sizes, 1);
    let mut local = local_side(kind, Ipv4Addr::new(198, 18, 0, 12), out_reads);
    local.mtu_enum = mtu_enum;
    let report = BwReport {
        size: 4096,
        iters: 20,
        bw_peak: 5.0,
        bw_avg: 4.0,
        msg_rate_avg: 0.001,
    };
    let mut runner = FakeRunner {
        connected: None,
        report,
        bw: kind.is_bw(),
    };
    let mut comm = PerftestComm::new(
        Replay::new(server.clone()),
        Role::Client,
        "6.06",
        false,
        true,
    );
    perftest_oob::run_script(&mut comm, &steps, &local, &mut runner).unwrap();
    let stream = comm.into_inner();
    assert_eq!(
        stream.leftover(),
        expect_done,
        "{capture}: all server bytes consumed except its done"
    );
    let lengths = message_lengths(&steps, 6.06, true);
    compare_perftest_streams(capture, &stream.output, &client, &lengths);
    if kind.is_bw() {
        // Our report's size and iteration count are exactly where the real client's are.
        let at = lengths
            .iter()
            .take_while(|l| l.0 != "report size")
            .map(|l| l.1)
            .sum::<usize>();
        assert_eq!(&stream.output[at..at + 16], &client[at..at + 16]);
    }
}

#[test]
fn write_bw_exchange_matches_perftest_6_06() {
    perftest_replay("rxe_write_bw", TestKind::WriteBw, 1, 3);
}

#[test]
fn write_bw_mtu4096_exchange_matches_perftest_6_06() {
    perftest_replay("rxe_mtu9000_write_bw", TestKind::WriteBw, 1, 5);
}

#[test]
fn read_bw_exchange_matches_perftest_6_06() {
    perftest_replay("rxe_read_bw", TestKind::ReadBw, 128, 3);
}

#[test]
fn send_lat_exchange_matches_perftest_6_06() {
    perftest_replay("rxe_send_lat", TestKind::SendLat, 1, 3);
}

#[test]
fn write_lat_exchange_matches_perftest_6_06() {
    perftest_replay("rxe_write_lat", TestKind::WriteLat, 1, 3);
}

#[test]
fn read_lat_exchange_matches_perftest_6_06() {
    perftest_replay("rxe_read_lat", TestKind::ReadLat, 128, 3);
}

#[test]
fn the_real_server_values_are_what_the_facts_say() {
    let (_, server) = load("rxe_write_bw");
    assert_eq!(&server[..16], b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
    assert_eq!(&server[16..20], &4096u32.to_be_bytes());
    assert_eq!(&server[20..24], &64u32.to_be_bytes());
    assert_eq!(&server[24..26], b"3\0");
    let dest = PerftestDest::decode(&server[26..134], true).unwrap();
    assert_eq!(dest.gid, Some(mapped_gid(Ipv4Addr::new(198, 18, 0, 11))));
}

#[test]
fn newer_peer_gets_the_parameter_block_and_mismatches_are_named() {
    // Two xroce ends that both claim 6.29 exchange the block; a size mismatch fails.
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let kind = TestKind::WriteBw;
    let server = std::thread::spawn(move || {
        let local = local_side(kind, Ipv4Addr::new(198, 18, 0, 11), 16);
        let mut comm = PerftestComm::new(a, Role::Server, "6.29", false, true);
        comm.exchange_versions().unwrap();
        comm.negotiate(&local.params)
    });
    let mut local = local_side(kind, Ipv4Addr::new(198, 18, 0, 12), 16);
    local.params.size = 65536;
    let mut comm = PerftestComm::new(b, Role::Client, "6.29", false, true);
    comm.exchange_versions().unwrap();
    let client_result = comm.negotiate(&local.params);
    let server_result = server.join().unwrap();
    let err = client_result.unwrap_err().to_string();
    assert!(err.contains("size: local=65536, remote=4096"), "{err}");
    assert!(server_result.is_err());
}

#[test]
fn old_peer_is_refused_with_a_reason() {
    let mut input = b"5.60".to_vec();
    input.resize(16, 0);
    let mut comm = PerftestComm::new(Replay::new(input), Role::Server, "6.06", false, true);
    let err = comm.exchange_versions().unwrap_err().to_string();
    assert!(err.contains("older than 5.70"), "{err}");
}

/// Runs `f` on a thread and fails the test if it has not returned within `secs` (a hang
/// without the set-up bound is a failure, not a stuck test run).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs))
        .expect("the exchange hung: no set-up timeout fired")
}

fn perf_server_error(
    kind: TestKind,
    stream: impl OobStream + Send + 'static,
    dont_xchg_versions: bool,
    bound_secs: u64,
) -> String {
    let steps = perftest_oob::script(kind, Role::Server, &[4096], 1);
    let local = local_side(kind, Ipv4Addr::new(198, 18, 0, 11), 16);
    let mut runner = FakeRunner {
        connected: None,
        report: BwReport::default(),
        bw: kind.is_bw(),
    };
    let mut comm = PerftestComm::new(stream, Role::Server, "6.06", dont_xchg_versions, true)
        .with_setup_bound(Some(std::time::Duration::from_secs(bound_secs)));
    perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)
        .unwrap_err()
        .to_string()
}

#[test]
fn pingpong_client_against_a_perf_server_is_named_not_called_old_perftest() {
    // ibv_rc_pingpong's real first message, as a perf server reads it.
    let (client, _) = load("rxe_rc_pingpong");
    let err = perf_server_error(
        TestKind::WriteBw,
        Replay::new(client[..52].to_vec()),
        false,
        5,
    );
    assert!(!err.contains("older than 5.70"), "{err}");
    assert!(
        err.contains("does not speak perftest's exchange")
            && err.contains("ibv_rc_pingpong/ibv_ud_pingpong or xroce pingpong")
            && err.contains("run xroce pingpong"),
        "{err}"
    );
}

#[test]
fn silent_client_times_out_with_the_bound_in_the_message() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let err = within(10, move || {
        perf_server_error(TestKind::WriteBw, a, false, 1)
    });
    drop(b);
    assert!(
        err.contains(
            "no answer from the peer within 1 s while exchanging versions (got 0 of 16 bytes)"
        ) && err.contains("the peer connected but sent nothing"),
        "{err}"
    );
}

#[test]
fn dont_xchg_versions_on_one_side_only_times_out_naming_the_option() {
    // The server skips versions and waits for a 108-byte address; the client (real
    // perftest bytes from rxe_write_bw) sends its 16-byte version and waits for ours.
    let (client, _) = load("rxe_write_bw");
    let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    b.write_all(&client[..16]).unwrap();
    let err = within(10, move || perf_server_error(TestKind::WriteBw, a, true, 1));
    drop(b);
    assert!(
        err.contains("within 1 s while exchanging QP addresses (got 16 of 108 bytes)")
            && err.contains("perftest version string \"6.06\"")
            && err.contains("--dont_xchg_versions"),
        "{err}"
    );
    // The other way round: a server that exchanges versions reads the client's address.
    let err = perf_server_error(
        TestKind::WriteBw,
        Replay::new(client[26..134].to_vec()),
        false,
        5,
    );
    assert!(
        err.contains("with --dont_xchg_versions")
            && err.contains("use --dont_xchg_versions on both sides or on neither"),
        "{err}"
    );
}

#[test]
fn perf_client_against_a_file_receiver_names_xroce_file() {
    let hello = br#"{"qpn":17,"psn":1193046,"gid":"00000000000000000000ffffc612000b","addr":1,"rkey":2,"chunk_size":1048576,"slots":4}
"#;
    let mut comm = PerftestComm::new(
        Replay::new(hello.to_vec()),
        Role::Client,
        "6.06",
        false,
        true,
    );
    let err = comm.exchange_versions().unwrap_err().to_string();
    assert!(err.contains("xroce file or xroce mr-check"), "{err}");
}

#[test]
fn pingpong_server_against_a_perf_client_times_out_naming_perftest() {
    let (client, _) = load("rxe_write_bw");
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
    b.write_all(&client[..16]).unwrap();
    let mine = PingpongDest {
        lid: 0,
        qpn: 1,
        psn: 1,
        gid: [0; 16],
    };
    let err = within(10, move || {
        pingpong_oob::server_exchange_within(
            &mut a,
            &mine,
            |_| Ok(()),
            std::time::Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string()
    });
    drop(b);
    assert!(
        err.contains("no answer from the peer within 1 s while reading the remote address (got 16 of 52 bytes)")
            && err.contains("perftest or xroce perf"),
        "{err}"
    );
    // A silent client: the bound and the reason.
    let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let err = within(10, move || {
        pingpong_oob::server_exchange_within(
            &mut a,
            &mine,
            |_| Ok(()),
            std::time::Duration::from_secs(1),
        )
        .unwrap_err()
        .to_string()
    });
    drop(b);
    assert!(
        err.contains("within 1 s") && err.contains("sent nothing"),
        "{err}"
    );
}

#[test]
fn a_peer_running_another_test_is_refused() {
    // Real ib_write_bw client bytes against our read_bw server, and real ib_read_bw client
    // bytes against our write_bw server: perftest 6.06 tells them apart only by the
    // outstanding-reads field of the QP address (1 for write, 0x80 on rxe for read).
    let (write_client, _) = load("rxe_write_bw");
    let err = perf_server_error(TestKind::ReadBw, Replay::new(write_client), false, 5);
    assert!(
        err.contains("the peer runs another test")
            && err.contains("allows 1 outstanding RDMA READs/atomics")
            && err.contains("we run ib_read_bw"),
        "{err}"
    );
    let (read_client, _) = load("rxe_read_bw");
    let err = perf_server_error(
        TestKind::WriteBw,
        Replay::new(read_client.clone()),
        false,
        5,
    );
    assert!(
        err.contains("allows 128 outstanding") && err.contains("we run ib_write_bw"),
        "{err}"
    );
    // The same bytes against the test they came from still run.
    let steps = perftest_oob::script(TestKind::ReadBw, Role::Server, &[4096], 1);
    let local = local_side(TestKind::ReadBw, Ipv4Addr::new(198, 18, 0, 11), 128);
    let mut runner = FakeRunner {
        connected: None,
        report: BwReport::default(),
        bw: true,
    };
    let mut comm = PerftestComm::new(Replay::new(read_client), Role::Server, "6.06", false, true);
    perftest_oob::run_script(&mut comm, &steps, &local, &mut runner).unwrap();
}
