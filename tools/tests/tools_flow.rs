//! The tools' loops (pingpong, all eight perf tests, file transfer, the demo's story) run end
//! to end, both roles in two threads, over an in-process model of two connected RC/UD QPs.
//!
//! The model (`ModelEndpoint`) executes each work request at once against the peer's
//! memory: SEND/WRITE_WITH_IMM consume the peer's oldest receive (or wait for one, like
//! `rnr_retry = 7`; a WRITE_WITH_IMM's completion counts the bytes written, as in verbs),
//! WRITE/READ copy after checking the R_Key and bounds, atomics act on
//! little-endian u64s, unsignaled WRs complete silently. It is a test double for the tool
//! logic; the real transport is tested over AF_XDP in `tools/tests/tools_netns.rs`.

use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xroce_tools::demo::{self, Side as DemoSide};
use xroce_tools::endpoint::{
    ConnectParams, LocalInfo, RemoteInfo, ToolEndpoint, ToolWc, ToolWr, WcKind, WrOp,
};
use xroce_tools::file::{self, FileOptions};
use xroce_tools::perftest::oob::{self as perftest_oob, LocalSide, PerftestComm, Role, TestKind};
use xroce_tools::perftest::report::TestInfo;
use xroce_tools::perftest::run::{PerfOptions, PerfRunner};
use xroce_tools::pingpong::{self, PingpongOptions};

#[derive(Default)]
struct Side {
    base: u64,
    rkey: u32,
    mem: Vec<u8>,
    recvs: VecDeque<(u64, usize, usize)>,
    cq: VecDeque<ToolWc>,
    /// Deliveries waiting for a receive: (data, imm, sender's wr_id, signaled).
    waiting: VecDeque<(Vec<u8>, Option<u32>, bool)>,
    connected_to: Option<u32>,
}

struct Shared {
    sides: [Side; 2],
}

struct ModelEndpoint {
    shared: Arc<Mutex<Shared>>,
    me: usize,
    qpn: u32,
    ud: bool,
}

fn pair(buf_len: usize, ud: bool) -> (ModelEndpoint, ModelEndpoint) {
    let mut sides: [Side; 2] = Default::default();
    for (i, s) in sides.iter_mut().enumerate() {
        s.base = 0x7f00_0000_0000 + (i as u64) * 0x1_0000_0000;
        s.rkey = 0x100 + i as u32;
        s.mem = vec![0; buf_len];
    }
    let shared = Arc::new(Mutex::new(Shared { sides }));
    (
        ModelEndpoint {
            shared: shared.clone(),
            me: 0,
            qpn: 0x11,
            ud,
        },
        ModelEndpoint {
            shared,
            me: 1,
            qpn: 0x12,
            ud,
        },
    )
}

fn deliver(peer: &mut Side, data: Vec<u8>, imm: Option<u32>, write_imm: bool) {
    if let Some((wr_id, off, len)) = peer.recvs.pop_front() {
        let n = if write_imm { 0 } else { data.len().min(len) };
        peer.mem[off..off + n].copy_from_slice(&data[..n]);
        peer.cq.push_back(ToolWc {
            wr_id,
            status: xroce::verbs::WcStatus::Success,
            kind: if write_imm {
                WcKind::RecvRdmaWithImm
            } else {
                WcKind::Recv
            },
            byte_len: data.len() as u32,
            imm,
        });
    } else {
        peer.waiting.push_back((data, imm, write_imm));
    }
}

impl ToolEndpoint for ModelEndpoint {
    fn local(&self) -> LocalInfo {
        let s = self.shared.lock().unwrap();
        let side = &s.sides[self.me];
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[198, 18, 0, 11 + self.me as u8]);
        LocalInfo {
            qpn: self.qpn,
            gid,
            buf_addr: side.base,
            rkey: side.rkey,
            buf_len: side.mem.len(),
            active_mtu: 1024,
            max_inline: 0,
            max_rd_atomic: 16,
        }
    }

    fn connect(&mut self, remote: &RemoteInfo, params: &ConnectParams) -> anyhow::Result<()> {
        anyhow::ensure!(params.mtu >= 256, "bad mtu");
        let mut s = self.shared.lock().unwrap();
        s.sides[self.me].connected_to = Some(remote.qpn);
        Ok(())
    }

    fn post_send(&mut self, wr: &ToolWr) -> anyhow::Result<()> {
        let mut s = self.shared.lock().unwrap();
        let peer_qpn = if self.me == 0 { 0x12 } else { 0x11 };
        anyhow::ensure!(
            s.sides[self.me].connected_to == Some(peer_qpn),
            "post_send before connect"
        );
        let (me, peer) = if self.me == 0 {
            let [a, b] = &mut s.sides;
            (a, b)
        } else {
            let [a, b] = &mut s.sides;
            (b, a)
        };
        let local = me.mem[wr.offset..wr.offset + wr.len].to_vec();
        let remote_range = |addr: u64,
                            rkey: u32,
                            len: usize,
                            peer: &Side|
         -> anyhow::Result<std::ops::Range<usize>> {
            anyhow::ensure!(rkey == peer.rkey, "bad rkey");
            let off = addr
                .checked_sub(peer.base)
                .ok_or_else(|| anyhow::anyhow!("below MR"))? as usize;
            anyhow::ensure!(off + len <= peer.mem.len(), "beyond MR");
            Ok(off..off + len)
        };
        let kind = match wr.op {
            WrOp::Send | WrOp::SendWithImm { .. } => {
                let imm = match wr.op {
                    WrOp::SendWithImm { imm } => Some(imm),
                    _ => None,
                };
                let mut data = local;
                if self.ud {
                    let mut grh = vec![0u8; 40];
                    grh.extend_from_slice(&data);
                    data = grh;
                }
                deliver(peer, data, imm, false);
                WcKind::Send
            }
            WrOp::Write { remote_addr, rkey }
            | WrOp::WriteWithImm {
                remote_addr, rkey, ..
            } => {
                let imm = match wr.op {
                    WrOp::WriteWithImm { imm, .. } => Some(imm),
                    _ => None,
                };
                let r = remote_range(remote_addr, rkey, wr.len, peer)?;
                peer.mem[r].copy_from_slice(&local);
                if imm.is_some() {
                    // The receive gets no data, only the length written and the immediate.
                    deliver(peer, local, imm, true);
                }
                WcKind::Write
            }
            WrOp::Read { remote_addr, rkey } => {
                let r = remote_range(remote_addr, rkey, wr.len, peer)?;
                let data = peer.mem[r].to_vec();
                me.mem[wr.offset..wr.offset + wr.len].copy_from_slice(&data);
                WcKind::Read
            }
            WrOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            }
            | WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare: add,
                swap: _,
            } => {
                let r = remote_range(remote_addr, rkey, 8, peer)?;
                let old = u64::from_le_bytes(peer.mem[r.clone()].try_into().unwrap());
                let new = match wr.op {
                    WrOp::FetchAdd { .. } => old.wrapping_add(add),
                    WrOp::CompareSwap { compare, swap, .. } => {
                        if old == compare {
                            swap
                        } else {
                            old
                        }
                    }
                    _ => unreachable!(),
                };
                peer.mem[r].copy_from_slice(&new.to_le_bytes());
                me.mem[wr.offset..wr.offset + 8].copy_from_slice(&old.to_le_bytes());
                WcKind::Atomic
            }
            other => anyhow::bail!("the QP model does not do {other:?}"),
        };
        if wr.signaled {
            me.cq.push_back(ToolWc {
                wr_id: wr.wr_id,
                status: xroce::verbs::WcStatus::Success,
                kind,
                byte_len: wr.len as u32,
                imm: None,
            });
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> anyhow::Result<()> {
        let mut s = self.shared.lock().unwrap();
        let side = &mut s.sides[self.me];
        anyhow::ensure!(offset + len <= side.mem.len(), "recv beyond buffer");
        side.recvs.push_back((wr_id, offset, len));
        if let Some((data, imm, write_imm)) = side.waiting.pop_front() {
            deliver(side, data, imm, write_imm);
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<ToolWc>, max: usize) -> anyhow::Result<usize> {
        let mut s = self.shared.lock().unwrap();
        let cq = &mut s.sides[self.me].cq;
        let n = cq.len().min(max);
        out.extend(cq.drain(..n));
        Ok(n)
    }

    fn write_local(&mut self, offset: usize, data: &[u8]) -> anyhow::Result<()> {
        let mut s = self.shared.lock().unwrap();
        let mem = &mut s.sides[self.me].mem;
        anyhow::ensure!(offset + data.len() <= mem.len(), "write beyond buffer");
        mem[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn read_local(&self, offset: usize, out: &mut [u8]) -> anyhow::Result<()> {
        let s = self.shared.lock().unwrap();
        let mem = &s.sides[self.me].mem;
        anyhow::ensure!(offset + out.len() <= mem.len(), "read beyond buffer");
        out.copy_from_slice(&mem[offset..offset + out.len()]);
        Ok(())
    }
}

fn pingpong_pair(opts: PingpongOptions) -> (String, String) {
    let (mut a, mut b) = pair(pingpong::buffer_len(&opts), opts.ud);
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || {
        let mut out = Vec::new();
        pingpong::run(&mut a, || Ok(sa), Role::Server, &o2, 0x111111, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    });
    let mut out = Vec::new();
    pingpong::run(&mut b, || Ok(sb), Role::Client, &opts, 0x222222, &mut out).unwrap();
    (server.join().unwrap(), String::from_utf8(out).unwrap())
}

#[test]
fn rc_pingpong_both_roles() {
    let opts = PingpongOptions {
        iters: 200,
        rx_depth: 10,
        validate: true,
        ..Default::default()
    };
    let (server, client) = pingpong_pair(opts);
    for out in [&server, &client] {
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("  local address:  LID 0x0000, QPN 0x0000"),
            "{out}"
        );
        assert!(
            lines[1].starts_with("  remote address: LID 0x0000, QPN 0x0000"),
            "{out}"
        );
        assert!(lines[2].starts_with("1638400 bytes in "), "{out}");
        assert!(lines[3].starts_with("200 iters in "), "{out}");
        assert!(!out.contains("invalid data"), "{out}");
    }
    assert!(server.contains("PSN 0x111111, GID ::ffff:198.18.0.11"));
    assert!(client.contains("remote address: LID 0x0000, QPN 0x000011, PSN 0x111111"));
}

#[test]
fn ud_pingpong_both_roles_and_size_limit() {
    let opts = PingpongOptions {
        ud: true,
        size: 1024,
        iters: 50,
        rx_depth: 8,
        ..Default::default()
    };
    let (server, _client) = pingpong_pair(opts);
    assert!(
        server.lines().next().unwrap().contains("PSN 0x111111: GID"),
        "ud's local line: {server}"
    );
    // Larger than the MTU: the same error ibv_ud_pingpong gives.
    let opts = PingpongOptions {
        ud: true,
        size: 2048,
        ..Default::default()
    };
    let (mut a, _b) = pair(4096, true);
    let (sa, _sb) = UnixStream::pair().unwrap();
    let err =
        pingpong::run(&mut a, || Ok(sa), Role::Server, &opts, 1, &mut Vec::new()).unwrap_err();
    assert!(
        err.to_string()
            .contains("Requested size larger than port MTU (1024)"),
        "{err}"
    );
}

fn local_side(ep: &dyn ToolEndpoint, opts: &PerfOptions, psn: u32) -> LocalSide {
    let info = ep.local();
    let dest = opts.dest(&info, psn);
    opts.local_side(3, 16, vec![dest])
}

fn perf_side(
    mut ep: ModelEndpoint,
    stream: UnixStream,
    role: Role,
    opts: PerfOptions,
    version: &str,
) -> (String, usize) {
    let local = local_side(&ep, &opts, if role == Role::Server { 0xabc } else { 0xdef });
    let sizes = opts.sizes(1024);
    let steps = perftest_oob::script(opts.kind, role, &sizes, 1);
    let mut out = Vec::new();
    let results;
    {
        let mut runner = PerfRunner::new(
            vec![&mut ep],
            opts.clone(),
            role,
            local.dests.clone(),
            &mut out,
        );
        let mut comm = PerftestComm::new(stream, role, version, false, true);
        let outcome = perftest_oob::run_script(&mut comm, &steps, &local, &mut runner).unwrap();
        if role == Role::Server && opts.kind.is_bw() && opts.kind != TestKind::SendBw {
            runner
                .print_remote_bw(&outcome.remote_report.unwrap())
                .unwrap();
        }
        runner.finish().unwrap();
        results = runner.results.len();
    }
    (String::from_utf8(out).unwrap(), results)
}

fn perf_pair(opts: PerfOptions, version: &str) -> ((String, usize), (String, usize)) {
    let buf = 2 * opts.half_len();
    let (a, b) = pair(buf, opts.ud);
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let v2 = version.to_string();
    let server = std::thread::spawn(move || perf_side(a, sa, Role::Server, o2, &v2));
    let client = perf_side(b, sb, Role::Client, opts, version);
    (server.join().unwrap(), client)
}

#[test]
fn every_perf_test_runs_both_roles() {
    for kind in TestKind::ALL {
        let mut opts = PerfOptions::defaults(kind);
        opts.iters = 200;
        opts.stall_timeout = Duration::from_secs(10);
        let ((server, _), (client, client_rows)) = perf_pair(opts, "6.06");
        assert_eq!(client_rows, 1, "{kind:?}: one result row\n{client}");
        assert!(
            client.contains(" remote address: LID 0000 QPN 0x0011"),
            "{kind:?}\n{client}"
        );
        if kind.is_bw() {
            assert!(client.contains("BW peak[MB/sec]"), "{kind:?}\n{client}");
            assert!(
                server.contains("BW average[MB/sec]"),
                "{kind:?} server shows the client's result\n{server}"
            );
        } else {
            assert!(client.contains("t_typical[usec]"), "{kind:?}\n{client}");
        }
    }
}

#[test]
fn latency_samples_print_unsorted_and_sorted_before_the_row() {
    // -U then -H, as perftest prints them: every sample in the order measured (iters - 1
    // gaps), then the kept ones sorted (two fewer), then the header again and the row.
    let mut opts = PerfOptions::defaults(TestKind::SendLat);
    opts.iters = 50;
    opts.report_unsorted = true;
    opts.report_histogram = true;
    let (_, (client, _)) = perf_pair(opts, "6.06");
    let lists: Vec<Vec<f64>> = client
        .split("#, usec\n")
        .skip(1)
        .map(|list| {
            list.lines()
                .map_while(|l| l.split_once(", "))
                .enumerate()
                .map(|(i, (n, v))| {
                    assert_eq!(n, (i + 1).to_string(), "{client}");
                    v.parse::<f64>().unwrap()
                })
                .collect()
        })
        .collect();
    assert_eq!(lists.len(), 2, "{client}");
    let (unsorted, sorted) = (&lists[0], &lists[1]);
    assert_eq!((unsorted.len(), sorted.len()), (49, 47), "{client}");
    assert!(sorted.windows(2).all(|w| w[0] <= w[1]), "{client}");
    let mut expected = unsorted.clone();
    expected.sort_by(|a, b| a.total_cmp(b));
    assert_eq!(&expected[..47], &sorted[..], "{client}");
    let after = client.rsplit("#, usec\n").next().unwrap();
    assert!(after.contains("t_typical[usec]"), "{client}");
}

#[test]
fn run_all_sizes_and_new_version_parameter_block() {
    for kind in [
        TestKind::WriteBw,
        TestKind::SendBw,
        TestKind::ReadLat,
        TestKind::WriteLat,
        TestKind::SendLat,
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.all_sizes = true;
        opts.iters = 5;
        let ((server, _), (client, rows)) = perf_pair(opts, "6.29");
        assert_eq!(rows, 23, "{kind:?}: 2 B .. 8 MiB\n{client}\n{server}");
        assert!(client.contains(" 8388608 "), "{kind:?}\n{client}");
    }
}

#[test]
fn ud_send_tests_run() {
    for kind in [TestKind::SendBw, TestKind::SendLat] {
        let mut opts = PerfOptions::defaults(kind);
        opts.ud = true;
        opts.size = 512;
        opts.iters = 100;
        let (_, (client, rows)) = perf_pair(opts, "6.06");
        assert_eq!(rows, 1, "{client}");
    }
}

#[test]
fn perf_option_errors_say_what_to_change() {
    let mut o = PerfOptions::defaults(TestKind::WriteBw);
    o.ud = true;
    assert!(o.validate().unwrap_err().to_string().contains("use -c RC"));
    let mut o = PerfOptions::defaults(TestKind::AtomicBw);
    o.size = 16;
    assert!(o.validate().unwrap_err().to_string().contains("8-byte"));
    let mut o = PerfOptions::defaults(TestKind::SendLat);
    o.num_qps = 2;
    assert!(o.validate().unwrap_err().to_string().contains("drop -q"));
}

fn transfer(
    data: Vec<u8>,
    opts: FileOptions,
) -> (file::TransferOutcome, file::TransferOutcome, Vec<u8>) {
    // One model pair, each side's buffer big enough for the sender's layout.
    let (mut rx_ep, mut b) = pair(opts.sender_buffer_len(), false);
    let (mut sa, mut sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let receiver = std::thread::spawn(move || {
        let mut written = Vec::new();
        let outcome =
            file::recv(&mut rx_ep, &mut sa, &mut written, &o2, 7, &mut |_, _| {}).unwrap();
        (outcome, written)
    });
    let len = data.len() as u64;
    let mut reader = std::io::Cursor::new(data);
    let mut acked = Vec::new();
    let sent = file::send(
        &mut b,
        &mut sb,
        &mut reader,
        "blob.bin",
        len,
        &opts,
        9,
        &mut |n| acked.push(n),
    )
    .unwrap();
    assert!(
        acked.windows(2).all(|w| w[0] <= w[1]),
        "progress is monotonic"
    );
    let (received, written) = receiver.join().unwrap();
    (sent, received, written)
}

#[test]
fn file_transfer_verifies_sha256() {
    let data: Vec<u8> = (0..(3 << 20) + 12345u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let opts = FileOptions {
        chunk_size: 256 << 10,
        slots: 4,
        ..Default::default()
    };
    let (sent, received, written) = transfer(data.clone(), opts);
    assert!(sent.verified && received.verified);
    assert_eq!(sent.sha256, received.sha256);
    assert_eq!(written, data);
    assert_eq!(received.name, "blob.bin");
    // Empty and one-byte files.
    for data in [vec![], vec![42u8]] {
        let (s, r, w) = transfer(
            data.clone(),
            FileOptions {
                chunk_size: 4096,
                slots: 2,
                ..Default::default()
            },
        );
        assert!(s.verified && r.verified);
        assert_eq!(w, data);
    }
}

/// One side of a perf test that announces `mtu_enum` and prints perftest's header block.
fn perf_side_announcing(
    mut ep: ModelEndpoint,
    stream: UnixStream,
    role: Role,
    opts: PerfOptions,
    mtu_enum: u8,
) -> String {
    let dest = opts.dest(&ep.local(), 0x123);
    let local = opts.local_side(mtu_enum, 16, vec![dest]);
    let steps = perftest_oob::script(opts.kind, role, &opts.sizes(1024), 1);
    let info = TestInfo {
        kind: opts.kind,
        device: "model0".into(),
        num_qps: 1,
        connection: "RC",
        is_client: role == Role::Client,
        tx_depth: opts.tx_depth,
        rx_depth: opts.rx_depth,
        cq_mod: opts.cq_mod,
        // What the local link alone would allow; the header must show the QP's MTU.
        mtu: perftest_oob::mtu_bytes(mtu_enum).unwrap(),
        gid_index: Some(1),
        inline_size: 0,
        out_reads: 16,
        atomic_type: None,
        use_srq: false,
        duplex: false,
        rdma_cm: false,
    };
    let mut out = Vec::new();
    {
        let mut runner = PerfRunner::new(vec![&mut ep], opts, role, local.dests.clone(), &mut out)
            .with_test_info(info);
        let mut comm = PerftestComm::new(stream, role, "6.06", false, true);
        perftest_oob::run_script(&mut comm, &steps, &local, &mut runner).unwrap();
        runner.finish().unwrap();
    }
    String::from_utf8(out).unwrap()
}

/// Client link 9000 (path MTU 4096), server link 1500 (1024): the QPs use 1024, and the
/// client's header says so (it said 4096).
#[test]
fn perf_header_shows_the_negotiated_mtu() {
    let mut opts = PerfOptions::defaults(TestKind::WriteBw);
    opts.iters = 50;
    let (a, b) = pair(2 * opts.half_len(), false);
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || perf_side_announcing(a, sa, Role::Server, o2, 3));
    let client = perf_side_announcing(b, sb, Role::Client, opts, 5);
    let server = server.join().unwrap();
    for (who, text) in [("client", &client), ("server", &server)] {
        assert!(
            text.contains(" Mtu             : 1024[B]\n"),
            "{who} header must show the MTU the QP uses\n{text}"
        );
        assert!(!text.contains("4096[B]"), "{who}\n{text}");
        // perftest's order: the header block before the address lines.
        assert!(text.find(" Mtu ").unwrap() < text.find(" local address").unwrap());
    }
}

/// The send_bw server reports no peak (perftest: "BW peak won't be measured"), only the
/// average; it printed 100+ GB/s from bursts of receive completions.
#[test]
fn send_bw_server_reports_no_peak() {
    let mut opts = PerfOptions::defaults(TestKind::SendBw);
    opts.iters = 300;
    assert!(!opts.measures_peak_as(Role::Server) && opts.measures_peak_as(Role::Client));
    let ((server, _), (client, _)) = perf_pair(opts, "6.06");
    let row = |text: &str| -> Vec<f64> {
        let line = text
            .lines()
            .find(|l| l.starts_with(" 65536 "))
            .unwrap_or_else(|| panic!("no result row\n{text}"))
            .to_string();
        line.split_whitespace()
            .map(|w| w.parse::<f64>().unwrap())
            .collect()
    };
    let s = row(&server);
    assert_eq!(s[2], 0.0, "server peak\n{server}");
    assert!(s[3] > 0.0, "server average\n{server}");
    let c = row(&client);
    assert!(c[2] >= c[3], "client peak >= average\n{client}");
}

/// A model endpoint whose own CPU reads byte `flip_at` of its buffer wrong, or whose
/// atomics return a wrong old value: the demo must notice either.
struct Lying {
    inner: ModelEndpoint,
    flip_at: Option<usize>,
    wrong_atomic_result_at: Option<usize>,
}

impl ToolEndpoint for Lying {
    fn local(&self) -> LocalInfo {
        self.inner.local()
    }
    fn connect(&mut self, remote: &RemoteInfo, params: &ConnectParams) -> anyhow::Result<()> {
        self.inner.connect(remote, params)
    }
    fn post_send(&mut self, wr: &ToolWr) -> anyhow::Result<()> {
        self.inner.post_send(wr)
    }
    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> anyhow::Result<()> {
        self.inner.post_recv(wr_id, offset, len)
    }
    fn poll(&mut self, out: &mut Vec<ToolWc>, max: usize) -> anyhow::Result<usize> {
        self.inner.poll(out, max)
    }
    fn write_local(&mut self, offset: usize, data: &[u8]) -> anyhow::Result<()> {
        self.inner.write_local(offset, data)
    }
    fn read_local(&self, offset: usize, out: &mut [u8]) -> anyhow::Result<()> {
        self.inner.read_local(offset, out)?;
        for at in [self.flip_at, self.wrong_atomic_result_at]
            .into_iter()
            .flatten()
        {
            if (offset..offset + out.len()).contains(&at) {
                out[at - offset] ^= 0x01;
            }
        }
        Ok(())
    }
}

/// Runs the demo's story between `client` and `server`; returns whether the client saw every
/// check pass, and both sides' narration.
fn demo_pair(
    client: &mut (dyn ToolEndpoint + Send),
    server: &mut (dyn ToolEndpoint + Send),
    size: usize,
) -> (bool, String, String) {
    let (mut a, mut b) = UnixStream::pair().unwrap();
    std::thread::scope(|scope| {
        let server = scope.spawn(move || {
            let mut log = Vec::new();
            demo::server(server, &mut b, size, "model1", &mut log).unwrap();
            String::from_utf8(log).unwrap()
        });
        let mut log = Vec::new();
        let ok = demo::client(client, &mut a, size, "model0", "model", &mut log).unwrap();
        let server_log = server.join().unwrap();
        (ok, String::from_utf8(log).unwrap(), server_log)
    })
}

#[test]
fn demo_story_verifies_every_operation() {
    for size in [0, 1, 4096, 20000] {
        let len = DemoSide::Server.buf_len(size);
        assert!(DemoSide::Client.buf_len(size) <= len);
        let (mut client, mut server) = pair(len, false);
        let (ok, client_log, server_log) = demo_pair(&mut client, &mut server, size);
        assert!(ok, "size {size}:\n{client_log}\n{server_log}");
        assert_eq!(
            client_log.matches("  ✓ completed").count(),
            7,
            "{client_log}"
        );
        assert_eq!(
            server_log.matches("server check: ✓").count(),
            6,
            "{server_log}"
        );
        assert!(!client_log.contains('✗') && !server_log.contains('✗'));
        assert!(
            client_log
                .starts_with("client model0 (driver model): QP 0x11, GID ::ffff:198.18.0.11\n"),
            "{client_log}"
        );
        assert!(
            server_log.starts_with("server model1: QP 0x12 connected to client QP 0x11;"),
            "{server_log}"
        );
        assert!(client_log.contains("returned old value 100 (expected 100)"));
        assert!(client_log.contains("atomic target now holds 0xc0ffee (expected 0xc0ffee)"));
    }
}

#[test]
fn demo_story_catches_a_wrong_byte_on_either_side() {
    let size = 4096;
    let len = DemoSide::Server.buf_len(size);
    let layout = demo::Layout { size };
    // The server reads one byte of the RDMA WRITE area wrong: its check of RDMA_WRITE fails.
    let (mut client, server) = pair(len, false);
    let mut server = Lying {
        inner: server,
        flip_at: Some(layout.write() + 100),
        wrong_atomic_result_at: None,
    };
    let (ok, client_log, server_log) = demo_pair(&mut client, &mut server, size);
    assert!(!ok, "{client_log}");
    assert!(
        server_log.contains("server check: ✗ 4096 bytes at offset 4096 DIFFER"),
        "{server_log}"
    );
    assert!(client_log.contains("  ✗ completed"), "{client_log}");
    // The client reads its READ destination wrong (one step fails), then the slot both
    // atomics return their old value into (both fail).
    for (at, what, failed) in [
        (size + 7, "4096 bytes read DIFFER", 1),
        (2 * size, "returned old value 101 (expected 100)", 2),
    ] {
        let (client, mut server) = pair(len, false);
        let mut client = Lying {
            inner: client,
            flip_at: None,
            wrong_atomic_result_at: Some(at),
        };
        let (ok, client_log, _) = demo_pair(&mut client, &mut server, size);
        assert!(!ok, "{client_log}");
        assert!(client_log.contains(what), "{what}: {client_log}");
        assert_eq!(client_log.matches('✗').count(), failed, "{client_log}");
    }
}
