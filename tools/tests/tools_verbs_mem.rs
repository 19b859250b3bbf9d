//! The tools over the real stack (verbs, engine, progress threads) on two devices joined
//! in memory: no root needed. Every perf test, pingpong RC and UD, and the file transfer,
//! both roles, over a clean link and over a lossy one (RC must still deliver everything).

use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xroce::engine::QpType;
use xroce::verbs::{mem_link_config, Device, DeviceConfig, MemLink};
use xroce_tools::endpoint::verbs::{open_on, DriverChoice, EndpointSpec};
use xroce_tools::endpoint::{ConnectParams, LocalInfo, RemoteInfo, ToolEndpoint, ToolWc, ToolWr};
use xroce_tools::file::{self, FileOptions};
use xroce_tools::perftest::oob::{self as perftest_oob, PerftestComm, Role, TestKind};
use xroce_tools::perftest::report::JsonResult;
use xroce_tools::perftest::run::{PerfOptions, PerfRunner};
use xroce_tools::pingpong::{self, PingpongOptions};

fn devices(loss: f64) -> (Device, Device, MemLink) {
    Device::mem_pair(&mem_link_config(1500, loss, 7), DeviceConfig::default()).unwrap()
}

fn spec(rc: bool, buf_len: usize, send: u32, recv: u32) -> EndpointSpec {
    EndpointSpec {
        qp_type: if rc {
            xroce::engine::QpType::Rc
        } else {
            xroce::engine::QpType::Ud
        },
        buf_len,
        max_send_wr: send,
        max_recv_wr: recv,
        driver: DriverChoice::Xdp,
        events: false,
        pcap: None,
        progress: Default::default(),
        shards: 1,
    }
}

fn endpoint(dev: &Device, s: &EndpointSpec) -> Box<dyn ToolEndpoint> {
    let gid = dev.ipv4_gid_index().unwrap();
    open_on(dev, gid, s, 1).unwrap().pop().unwrap()
}

fn pingpong_over(opts: PingpongOptions, loss: f64) -> (String, String) {
    let qp_type = if opts.ud { QpType::Ud } else { QpType::Rc };
    pingpong_over_qp(opts, loss, qp_type)
}

fn pingpong_over_qp(opts: PingpongOptions, loss: f64, qp_type: QpType) -> (String, String) {
    let (a, b, _link) = devices(loss);
    let mut s = spec(true, pingpong::buffer_len(&opts), 2, opts.rx_depth);
    s.qp_type = qp_type;
    s.events = opts.events;
    let (mut ea, mut eb) = (endpoint(&a, &s), endpoint(&b, &s));
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || {
        let mut out = Vec::new();
        pingpong::run(ea.as_mut(), || Ok(sa), Role::Server, &o2, 0x1234, &mut out)
            .map(|_| String::from_utf8(out).unwrap())
    });
    let mut out = Vec::new();
    pingpong::run(
        eb.as_mut(),
        || Ok(sb),
        Role::Client,
        &opts,
        0xabcdef,
        &mut out,
    )
    .unwrap();
    (
        server.join().unwrap().unwrap(),
        String::from_utf8(out).unwrap(),
    )
}

#[test]
fn rc_pingpong_over_verbs() {
    let opts = PingpongOptions {
        iters: 300,
        rx_depth: 50,
        validate: true,
        ..Default::default()
    };
    let (server, client) = pingpong_over(opts, 0.0);
    assert!(server.contains("GID ::ffff:198.18.0.1"), "{server}");
    assert!(client.contains("remote address: LID 0x0000"), "{client}");
    assert!(client.contains("2457600 bytes in"), "{client}");
    assert!(!server.contains("invalid data"), "{server}");
}

#[test]
fn rc_pingpong_with_events_sleeps_on_the_completion_channel() {
    let opts = PingpongOptions {
        iters: 200,
        rx_depth: 20,
        events: true,
        ..Default::default()
    };
    let (_, client) = pingpong_over(opts, 0.0);
    assert!(client.contains("200 iters in"), "{client}");
}

#[test]
fn rc_pingpong_survives_loss() {
    let opts = PingpongOptions {
        iters: 100,
        rx_depth: 20,
        size: 8192,
        ..Default::default()
    };
    let (_, client) = pingpong_over(opts, 0.02);
    assert!(client.contains("100 iters in"), "{client}");
}

#[test]
fn uc_pingpong_over_verbs() {
    // ibv_uc_pingpong's exchange: RC's, on a UC QP (multi-packet messages, no ACKs).
    let opts = PingpongOptions {
        iters: 300,
        rx_depth: 50,
        size: 5000,
        validate: true,
        ..Default::default()
    };
    let (server, client) = pingpong_over_qp(opts, 0.0, QpType::Uc);
    assert!(server.contains("GID ::ffff:198.18.0.1"), "{server}");
    assert!(client.contains("3000000 bytes in"), "{client}");
    assert!(client.contains("300 iters in"), "{client}");
    assert!(!server.contains("invalid data"), "{server}");
}

#[test]
fn ud_pingpong_over_verbs() {
    let opts = PingpongOptions {
        ud: true,
        size: 1024,
        iters: 200,
        rx_depth: 50,
        ..Default::default()
    };
    let (server, client) = pingpong_over(opts, 0.0);
    assert!(
        server.starts_with("  local address:  LID 0x0000"),
        "{server}"
    );
    assert!(client.contains("200 iters in"), "{client}");
}

fn perf_side(
    ep: &mut Box<dyn ToolEndpoint>,
    stream: UnixStream,
    role: Role,
    opts: PerfOptions,
) -> anyhow::Result<(String, usize)> {
    let info = ep.local();
    let dest = opts.dest(&info, if role == Role::Server { 0x111 } else { 0x222 });
    let local = opts.local_side(3, 16, vec![dest]);
    let steps = opts.script(role, &opts.sizes(1024));
    let mut out: Vec<u8> = Vec::new();
    let rows;
    {
        let mut runner =
            PerfRunner::new(vec![ep.as_mut()], opts.clone(), role, vec![dest], &mut out);
        let mut comm = PerftestComm::new(stream, role, "6.06", false, true);
        let outcome = perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)?;
        if role == Role::Server
            && opts.kind.is_bw()
            && opts.kind != TestKind::SendBw
            && !opts.duplex
        {
            runner.print_remote_bw(&outcome.remote_report.unwrap())?;
        }
        rows = runner.results.len();
    }
    Ok((String::from_utf8(out).unwrap(), rows))
}

/// One side of a `-b` run: its table and its `--json` results.
fn duplex_side(
    mut ep: Box<dyn ToolEndpoint>,
    stream: UnixStream,
    role: Role,
    opts: PerfOptions,
) -> (String, Vec<JsonResult>) {
    let info = ep.local();
    let dest = opts.dest(&info, if role == Role::Server { 0x111 } else { 0x222 });
    let local = opts.local_side(3, 16, vec![dest]);
    let steps = opts.script(role, &opts.sizes(1024));
    let mut out: Vec<u8> = Vec::new();
    let results = {
        let mut runner =
            PerfRunner::new(vec![ep.as_mut()], opts.clone(), role, vec![dest], &mut out);
        let mut comm = PerftestComm::new(stream, role, "6.06", false, true);
        perftest_oob::run_script(&mut comm, &steps, &local, &mut runner).unwrap();
        std::mem::take(&mut runner.results)
    };
    (String::from_utf8(out).unwrap(), results)
}

/// Both sides of a `-b` run over two mem devices (server, client).
fn duplex_over(opts: PerfOptions) -> [(String, Vec<JsonResult>); 2] {
    let (a, b, _link) = devices(0.0);
    let s = spec(true, 2 * opts.half_len(), opts.tx_depth.max(2), 2);
    let (ea, eb) = (endpoint(&a, &s), endpoint(&b, &s));
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || duplex_side(ea, sa, Role::Server, o2));
    let client = duplex_side(eb, sb, Role::Client, opts);
    [server.join().unwrap(), client]
}

#[test]
fn bidirectional_bw_tests_run_both_ways_and_print_the_sum() {
    for (kind, size, sizes) in [
        (TestKind::WriteBw, 4096, 1),
        (TestKind::ReadBw, 4096, 1),
        (TestKind::AtomicBw, 8, 1),
        (TestKind::WriteBw, 0, 23),
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.duplex = true;
        opts.iters = if sizes > 1 { 5 } else { 300 };
        opts.all_sizes = sizes > 1;
        if size > 0 {
            opts.size = size;
        }
        opts.stall_timeout = Duration::from_secs(20);
        opts.validate().unwrap();
        let [(server_out, server), (client_out, client)] = duplex_over(opts.clone());
        assert_eq!(server.len(), sizes, "{kind:?}\n{server_out}");
        assert_eq!(client.len(), sizes, "{kind:?}\n{client_out}");
        for (mine, theirs) in [(&server, &client), (&client, &server)] {
            for (m, t) in mine.iter().zip(theirs.iter()) {
                let JsonResult::BwDuplex {
                    stats,
                    local,
                    remote,
                    ..
                } = m
                else {
                    panic!("{kind:?}: not a bidirectional row: {m:?}");
                };
                let JsonResult::BwDuplex {
                    local: peer_local, ..
                } = t
                else {
                    panic!("{kind:?}: not a bidirectional row: {t:?}");
                };
                // Each side completed every one of its own operations: both directions ran.
                assert_eq!(local.iters, opts.iters, "{kind:?} {m:?}");
                assert!(local.average > 0.0, "{kind:?} {m:?}");
                // The report it got is the one the peer measured, and the row is the sum.
                assert_eq!(remote.iters, peer_local.iters, "{kind:?}");
                assert_eq!(
                    remote.average.to_bits(),
                    peer_local.average.to_bits(),
                    "{kind:?}"
                );
                assert_eq!(stats.average, local.average + remote.average, "{kind:?}");
                assert_eq!(
                    stats.msg_rate_mpps,
                    local.msg_rate_mpps + remote.msg_rate_mpps
                );
                assert_eq!((stats.size, stats.iters), (local.size, local.iters));
            }
        }
        // One table row per size on each side, no separate row of the peer's.
        let rows = |out: &str| {
            out.lines()
                .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
                .count()
        };
        assert_eq!(rows(&server_out), sizes, "{server_out}");
        assert_eq!(rows(&client_out), sizes, "{client_out}");
    }
}

#[test]
fn qp_timeout_reaches_the_qps_and_is_bounded() {
    let mut opts = PerfOptions::defaults(TestKind::WriteBw);
    assert_eq!(
        opts.connect_params(1, 1024).timeout,
        14,
        "perftest's default"
    );
    opts.qp_timeout = 18;
    opts.validate().unwrap();
    assert_eq!(opts.connect_params(1, 1024).timeout, 18);
    opts.iters = 50;
    let (server, (client, rows)) = perf_over(opts.clone());
    assert_eq!(rows, 1, "{client}\n{server}");
    opts.qp_timeout = 32;
    let err = opts.validate().unwrap_err().to_string();
    assert!(err.contains("-u/--qp-timeout"), "{err}");
}

#[test]
fn bidirectional_is_refused_where_perftest_or_xroce_has_none() {
    for (kind, want) in [
        (TestKind::WriteLat, "only available in the bandwidth tests"),
        (TestKind::ReadLat, "only available in the bandwidth tests"),
        (TestKind::SendBw, "send_bw is not implemented"),
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.duplex = true;
        let err = opts.validate().unwrap_err().to_string();
        assert!(err.contains(want), "{kind:?}: {err}");
    }
}

fn perf_over(opts: PerfOptions) -> (String, (String, usize)) {
    perf_over_counting(opts, Arc::default(), Arc::default())
}

/// [`perf_over`], counting each side's `wait_completion` calls (server, client).
fn perf_over_counting(
    opts: PerfOptions,
    server_waits: Arc<AtomicUsize>,
    client_waits: Arc<AtomicUsize>,
) -> (String, (String, usize)) {
    let (a, b, _link) = devices(0.0);
    let mut s = spec(
        !opts.ud,
        2 * opts.half_len(),
        opts.tx_depth.max(2),
        opts.rx_depth.max(2),
    );
    s.events = opts.events;
    if opts.uc {
        s.qp_type = QpType::Uc;
    }
    let mut ea: Box<dyn ToolEndpoint> = Box::new(CountingWaits {
        inner: endpoint(&a, &s),
        waits: server_waits,
    });
    let mut eb: Box<dyn ToolEndpoint> = Box::new(CountingWaits {
        inner: endpoint(&b, &s),
        waits: client_waits,
    });
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let server = std::thread::spawn(move || perf_side(&mut ea, sa, Role::Server, o2).map(|r| r.0));
    let client = perf_side(&mut eb, sb, Role::Client, opts).unwrap();
    (server.join().unwrap().unwrap(), client)
}

#[test]
fn perf_send_and_write_tests_over_uc() {
    // perftest's -c UC: the send and write tests, with no ACK on the wire.
    for kind in [
        TestKind::SendBw,
        TestKind::WriteBw,
        TestKind::SendLat,
        TestKind::WriteLat,
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.uc = true;
        opts.iters = if kind.is_bw() { 300 } else { 100 };
        opts.size = 3000;
        opts.settle_depths();
        opts.validate().unwrap();
        let (server, (client, rows)) = perf_over(opts);
        assert_eq!(rows, 1, "{kind:?}: {client}\n{server}");
    }
    for kind in [TestKind::ReadBw, TestKind::AtomicLat] {
        let mut opts = PerfOptions::defaults(kind);
        opts.uc = true;
        let err = opts.validate().unwrap_err().to_string();
        assert!(err.contains("-c UC works only"), "{err}");
    }
}

#[test]
fn every_perf_test_over_verbs() {
    for kind in TestKind::ALL {
        let mut opts = PerfOptions::defaults(kind);
        opts.iters = if kind.is_bw() { 300 } else { 100 };
        opts.size = if kind.verb() == perftest_oob::enums::VERB_ATOMIC {
            8
        } else {
            4096
        };
        opts.stall_timeout = Duration::from_secs(20);
        let (server, (client, rows)) = perf_over(opts);
        assert_eq!(rows, 1, "{kind:?}\n{client}\n{server}");
        assert!(
            client.contains(" 4096 ") || client.contains(" 8 "),
            "{kind:?}\n{client}"
        );
    }
}

/// Delegates to a real endpoint and counts how often the loop slept on the channel.
struct CountingWaits {
    inner: Box<dyn ToolEndpoint>,
    waits: Arc<AtomicUsize>,
}

impl ToolEndpoint for CountingWaits {
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
        self.inner.read_local(offset, out)
    }
    fn wait_completion(&mut self, timeout: Duration) -> anyhow::Result<()> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.inner.wait_completion(timeout)
    }
}

#[test]
fn perf_with_events_sleeps_on_the_completion_channel() {
    // A poll drives progress itself, so a run may find a completion every time it polls and
    // never need to sleep: the channel must be used in some of the runs, never without -e.
    let mut slept = Vec::new();
    for kind in [
        TestKind::SendBw,
        TestKind::ReadBw,
        TestKind::AtomicBw,
        TestKind::SendLat,
        TestKind::ReadLat,
        TestKind::AtomicLat,
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.iters = 100;
        opts.size = if kind.verb() == perftest_oob::enums::VERB_ATOMIC {
            8
        } else {
            4096
        };
        opts.stall_timeout = Duration::from_secs(20);
        opts.events = true;
        let (srv, cli) = (Arc::<AtomicUsize>::default(), Arc::<AtomicUsize>::default());
        let (_, (client, rows)) = perf_over_counting(opts.clone(), srv.clone(), cli.clone());
        assert_eq!(rows, 1, "{kind:?}\n{client}");
        slept.push((kind, cli.load(Ordering::Relaxed)));
        // Without -e the same run never touches the channel.
        opts.events = false;
        let (srv, cli) = (Arc::<AtomicUsize>::default(), Arc::<AtomicUsize>::default());
        perf_over_counting(opts, srv.clone(), cli.clone());
        assert_eq!(
            srv.load(Ordering::Relaxed) + cli.load(Ordering::Relaxed),
            0,
            "{kind:?}"
        );
    }
    assert!(
        slept.iter().filter(|(_, waits)| *waits > 0).count() >= 2,
        "with -e the clients slept on the channel in fewer than 2 of the runs: {slept:?}"
    );
    // perftest refuses -e on the WRITE tests; xroce with more than one QP.
    let mut opts = PerfOptions::defaults(TestKind::WriteLat);
    opts.events = true;
    let err = opts.validate().unwrap_err().to_string();
    assert!(err.contains("not available on WRITE verb"), "{err}");
    let mut opts = PerfOptions::defaults(TestKind::SendBw);
    opts.events = true;
    opts.num_qps = 2;
    let err = opts.validate().unwrap_err().to_string();
    assert!(err.contains("one QP"), "{err}");
}

#[test]
fn run_all_sizes_over_verbs() {
    for kind in [
        TestKind::WriteBw,
        TestKind::ReadBw,
        TestKind::SendBw,
        TestKind::ReadLat,
        TestKind::WriteLat,
        TestKind::SendLat,
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.all_sizes = true;
        opts.iters = 5;
        let (_, (client, rows)) = perf_over(opts);
        assert_eq!(rows, 23, "{kind:?}: 2 B .. 8 MiB\n{client}");
        assert!(client.contains(" 8388608 "), "{kind:?}\n{client}");
    }
}

#[test]
fn one_byte_messages_over_verbs() {
    for kind in [
        TestKind::WriteBw,
        TestKind::SendLat,
        TestKind::ReadLat,
        TestKind::WriteLat,
    ] {
        let mut opts = PerfOptions::defaults(kind);
        opts.size = 1;
        opts.iters = 50;
        let (_, (_client, rows)) = perf_over(opts);
        assert_eq!(rows, 1, "{kind:?}");
    }
}

#[test]
fn ud_send_perf_over_verbs() {
    for kind in [TestKind::SendBw, TestKind::SendLat] {
        let mut opts = PerfOptions::defaults(kind);
        opts.ud = true;
        opts.size = 1024;
        opts.iters = 100;
        let (_, (client, rows)) = perf_over(opts);
        assert_eq!(rows, 1, "{kind:?}\n{client}");
    }
}

#[test]
fn file_transfer_over_verbs_with_loss() {
    let (a, b, _link) = devices(0.01);
    let opts = FileOptions {
        chunk_size: 256 << 10,
        slots: 4,
        mtu: 1024,
        stall_timeout: Duration::from_secs(20),
    };
    let s = spec(
        true,
        opts.sender_buffer_len(),
        2 * opts.slots as u32 + 2,
        opts.slots as u32 + 1,
    );
    let (mut rx, mut tx) = (endpoint(&a, &s), endpoint(&b, &s));
    let data: Vec<u8> = (0..(2 << 20) + 4321u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    let (sa, sb) = UnixStream::pair().unwrap();
    let o2 = opts.clone();
    let receiver = std::thread::spawn(move || {
        let mut sa = sa;
        let mut written = Vec::new();
        let outcome =
            file::recv(rx.as_mut(), &mut sa, &mut written, &o2, 5, &mut |_, _| {}).unwrap();
        (outcome, written)
    });
    let mut sb = sb;
    let sent = file::send(
        tx.as_mut(),
        &mut sb,
        &mut std::io::Cursor::new(data.clone()),
        "x.bin",
        data.len() as u64,
        &opts,
        6,
        &mut |_| {},
    )
    .unwrap();
    let (received, written) = receiver.join().unwrap();
    assert!(sent.verified && received.verified);
    assert_eq!(written, data);
}

/// Both sides of a perf test over a link with `loss`, running `sizes` (default: what the
/// options say); each side's output or error.
fn perf_over_lossy(
    opts: PerfOptions,
    loss: f64,
    sizes: Option<Vec<u64>>,
) -> (anyhow::Result<String>, anyhow::Result<String>) {
    perf_over_mixed(opts.clone(), opts, loss, sizes)
}

/// [`perf_over_lossy`] with different options (maybe different tests) on each side.
fn perf_over_mixed(
    opts: PerfOptions,
    client_opts: PerfOptions,
    loss: f64,
    sizes: Option<Vec<u64>>,
) -> (anyhow::Result<String>, anyhow::Result<String>) {
    let (a, b, _link) = devices(loss);
    let s = spec(
        !opts.ud,
        2 * opts.half_len(),
        opts.tx_depth.max(2),
        opts.rx_depth.max(2),
    );
    let mut ea = endpoint(&a, &s);
    let mut eb = endpoint(&b, &s);
    let (sa, sb) = UnixStream::pair().unwrap();
    let side = move |ep: &mut Box<dyn ToolEndpoint>,
                     stream: UnixStream,
                     role: Role,
                     opts: PerfOptions,
                     sizes: Vec<u64>|
          -> anyhow::Result<String> {
        let info = ep.local();
        let dest = opts.dest(&info, if role == Role::Server { 0x111 } else { 0x222 });
        let local = opts.local_side(3, 16, vec![dest]);
        let steps = perftest_oob::script(opts.kind, role, &sizes, 1);
        let mut out: Vec<u8> = Vec::new();
        {
            let mut runner =
                PerfRunner::new(vec![ep.as_mut()], opts.clone(), role, vec![dest], &mut out);
            let mut comm = PerftestComm::new(stream, role, "6.06", false, true);
            perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)?;
        }
        Ok(String::from_utf8(out).unwrap())
    };
    let sizes = sizes.unwrap_or_else(|| opts.sizes(1024));
    let (o2, s2) = (opts.clone(), sizes.clone());
    let server = std::thread::spawn(move || side(&mut ea, sa, Role::Server, o2, s2));
    let client = side(&mut eb, sb, Role::Client, client_opts, sizes);
    (server.join().unwrap(), client)
}

#[test]
fn send_bw_all_sizes_with_more_iterations_than_one_size_uses_up() {
    // `-a -n 50` with the default 512 receives: receives re-posted during the small sizes
    // are still queued when the size grows (at 2048 B with these numbers); each must fit
    // the largest message of the run or the receive fails with a length error.
    let mut opts = PerfOptions::defaults(TestKind::SendBw);
    opts.all_sizes = true;
    opts.iters = 50;
    opts.stall_timeout = Duration::from_secs(10);
    let sizes: Vec<u64> = (1..=16).map(|i| 1u64 << i).collect();
    let (server, client) = perf_over_lossy(opts, 0.0, Some(sizes));
    let (server, client) = (server.unwrap(), client.unwrap());
    for out in [&server, &client] {
        assert!(out.contains(" 65536 "), "{out}");
    }
}

#[test]
fn ud_send_bw_over_a_lossy_link_reports_what_arrived() {
    // perf send_bw -c UD -s 1024 with defaults, 5 % of frames lost: UD does not resend, so
    // the receiver ends when the sender is done and says how many arrived.
    let mut opts = PerfOptions::defaults(TestKind::SendBw);
    opts.ud = true;
    opts.size = 1024;
    opts.iters = 2000;
    opts.stall_timeout = Duration::from_secs(10);
    opts.settle_depths();
    assert_eq!(
        opts.rx_depth, 2000,
        "perftest posts one receive per UD iteration"
    );
    let started = std::time::Instant::now();
    let (server, client) = perf_over_lossy(opts, 0.05, None);
    let (server, client) = (server.unwrap(), client.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the server waited for datagrams that cannot come"
    );
    let note = server
        .lines()
        .find(|l| l.starts_with(" UD: "))
        .unwrap_or_else(|| panic!("no loss line:\n{server}"));
    let arrived: u64 = note[5..].split(' ').next().unwrap().parse().unwrap();
    assert!(
        (1500..2000).contains(&arrived)
            && note.contains(&format!(
                "of 2000 messages of 1024 bytes arrived, {} lost",
                2000 - arrived
            )),
        "{note}"
    );
    let row = server
        .lines()
        .find(|l| l.trim_start().starts_with("1024 "))
        .unwrap();
    assert!(
        row.contains(&format!(" {arrived} ")),
        "the row counts what arrived: {row}"
    );
    assert!(client.contains(" 1024 "), "{client}");
}

#[test]
fn send_bw_server_refuses_a_client_that_does_not_send() {
    // write_bw and send_bw announce the same outstanding reads (1); the send_bw server
    // learns the truth when the client has finished without one SEND arriving.
    let mut server_opts = PerfOptions::defaults(TestKind::SendBw);
    server_opts.iters = 50;
    server_opts.size = 4096;
    server_opts.stall_timeout = Duration::from_secs(10);
    let mut client_opts = server_opts.clone();
    client_opts.kind = TestKind::WriteBw;
    let started = std::time::Instant::now();
    let (server, client) = perf_over_mixed(server_opts, client_opts, 0.0, None);
    let err = format!("{:#}", server.unwrap_err());
    assert!(
        err.contains("the client finished after 0 of 50 SENDs reached us")
            && err.contains("it runs another test, not ib_send_bw"),
        "{err}"
    );
    assert!(client.is_err(), "the client must not report success either");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "it waited for the stall timeout"
    );
}

/// One side of a perf run with `opts.num_qps` QPs on `dev`, split over `opts.threads`
/// threads: what it printed and its `--json` results.
fn threaded_side(
    dev: &Device,
    stream: UnixStream,
    role: Role,
    opts: PerfOptions,
) -> anyhow::Result<(String, Vec<JsonResult>)> {
    let s = spec(
        !opts.ud,
        2 * opts.half_len(),
        opts.tx_depth.max(2),
        opts.rx_depth.max(2),
    );
    let gid = dev.ipv4_gid_index().unwrap();
    let mut eps = open_on(dev, gid, &s, opts.num_qps)?;
    let base = if role == Role::Server { 0x100 } else { 0x200 };
    let dests: Vec<_> = eps
        .iter()
        .enumerate()
        .map(|(i, ep)| opts.dest(&ep.local(), base + i as u32))
        .collect();
    let local = opts.local_side(3, 16, dests.clone());
    let steps = perftest_oob::script(opts.kind, role, &opts.sizes(1024), opts.num_qps);
    let mut out: Vec<u8> = Vec::new();
    let results;
    {
        let refs = eps.iter_mut().map(|e| e.as_mut()).collect();
        let mut runner = PerfRunner::new(refs, opts.clone(), role, dests, &mut out);
        let mut comm = PerftestComm::new(stream, role, "6.06", false, true);
        let outcome = perftest_oob::run_script(&mut comm, &steps, &local, &mut runner)?;
        if role == Role::Server && opts.kind.is_bw() && opts.kind != TestKind::SendBw {
            runner.print_remote_bw(&outcome.remote_report.unwrap())?;
        }
        results = std::mem::take(&mut runner.results);
    }
    Ok((String::from_utf8(out).unwrap(), results))
}

/// A perf run over the in-memory pair, the server with `server_threads`, the client with
/// `client_threads` (the exchange does not carry them: each side splits its own QPs).
fn threaded_run(
    kind: TestKind,
    qps: usize,
    server_threads: usize,
    client_threads: usize,
) -> ((String, Vec<JsonResult>), (String, Vec<JsonResult>)) {
    threaded_run_for(kind, qps, server_threads, client_threads, None)
}

/// [`threaded_run`], with `-D duration` seconds instead of iterations.
fn threaded_run_for(
    kind: TestKind,
    qps: usize,
    server_threads: usize,
    client_threads: usize,
    duration: Option<u64>,
) -> ((String, Vec<JsonResult>), (String, Vec<JsonResult>)) {
    let (a, b, _link) = devices(0.0);
    let mut opts = PerfOptions::defaults(kind);
    opts.duration = duration;
    opts.iters = 200;
    opts.size = if kind == TestKind::AtomicBw { 8 } else { 64 };
    opts.num_qps = qps;
    opts.stall_timeout = Duration::from_secs(20);
    let (sa, sb) = UnixStream::pair().unwrap();
    let mut server_opts = opts.clone();
    server_opts.threads = server_threads;
    server_opts.validate().unwrap();
    opts.threads = client_threads;
    opts.validate().unwrap();
    let server = std::thread::spawn(move || threaded_side(&a, sa, Role::Server, server_opts));
    let client = threaded_side(&b, sb, Role::Client, opts).unwrap();
    (server.join().unwrap().unwrap(), client)
}

/// The aggregate row and its per-thread rows: every message counted once, each thread with
/// its share of the QPs, and no rate above what the threads' own intervals allow.
fn check_threads(
    what: &str,
    text: &str,
    result: &JsonResult,
    threads: usize,
    qps: usize,
    iters: u64,
) {
    let JsonResult::Bw { stats, per_thread } = result else {
        panic!("{what}: not a bandwidth result: {result:?}");
    };
    assert_eq!(stats.iters, iters * qps as u64, "{what}\n{text}");
    assert_eq!(per_thread.len(), threads, "{what}: {per_thread:?}");
    let sum: u64 = per_thread.iter().map(|t| t.stats.iters).sum();
    assert_eq!(
        sum, stats.iters,
        "{what}: per-thread messages {per_thread:?}"
    );
    let rates: f64 = per_thread.iter().map(|t| t.stats.msg_rate_mpps).sum();
    assert!(stats.msg_rate_mpps > 0.0, "{what}: {stats:?}");
    // The aggregate spans the common interval, which holds every thread's own.
    assert!(
        stats.msg_rate_mpps <= rates * (1.0 + 1e-9),
        "{what}: aggregate {} > the threads' {rates}",
        stats.msg_rate_mpps
    );
    for (i, t) in per_thread.iter().enumerate() {
        assert_eq!((t.thread, t.qps), (i, qps / threads), "{what}: {t:?}");
        assert_eq!(
            t.stats.iters,
            iters * (qps / threads) as u64,
            "{what}: {t:?}"
        );
        let owned = qps / threads;
        let plural = if owned == 1 { "" } else { "s" };
        let row = format!(" thread {i} ({owned} QP{plural}): {} ", stats.size);
        assert_eq!(
            text.contains(&row),
            threads > 1,
            "{what}: per-thread rows only with more than one thread:\n{text}"
        );
    }
    // The JSON carries them too.
    let json = serde_json::to_value(result).unwrap();
    assert_eq!(
        json["per_thread"].as_array().map(Vec::len),
        Some(threads),
        "{json}"
    );
    assert_eq!(json["iters"], stats.iters, "{json}");
}

#[test]
fn four_qps_over_two_threads_complete_every_iteration() {
    for kind in [
        TestKind::WriteBw,
        TestKind::ReadBw,
        TestKind::SendBw,
        TestKind::AtomicBw,
    ] {
        let ((server, s_results), (client, c_results)) = threaded_run(kind, 4, 1, 2);
        assert_eq!(c_results.len(), 1, "{kind:?}\n{client}");
        check_threads(
            &format!("{kind:?} client"),
            &client,
            &c_results[0],
            2,
            4,
            200,
        );
        if kind == TestKind::SendBw {
            // The receiver measured too, on one thread.
            check_threads("send_bw server", &server, &s_results[0], 1, 4, 200);
        }
    }
}

#[test]
fn each_side_splits_its_own_qps() {
    // The receiver on 4 threads (one QP each), the sender on one; and the reverse.
    let ((server, s_results), (client, c_results)) = threaded_run(TestKind::SendBw, 4, 4, 1);
    check_threads(
        "send_bw server, 4 threads",
        &server,
        &s_results[0],
        4,
        4,
        200,
    );
    check_threads(
        "send_bw client, 1 thread",
        &client,
        &c_results[0],
        1,
        4,
        200,
    );
    let ((server, s_results), (client, c_results)) = threaded_run(TestKind::SendBw, 4, 2, 4);
    check_threads(
        "send_bw server, 2 threads",
        &server,
        &s_results[0],
        2,
        4,
        200,
    );
    check_threads(
        "send_bw client, 4 threads",
        &client,
        &c_results[0],
        4,
        4,
        200,
    );
}

#[test]
fn threads_with_a_duration_count_what_each_completed() {
    let (_, (client, results)) = threaded_run_for(TestKind::WriteBw, 4, 1, 2, Some(1));
    let JsonResult::Bw { stats, per_thread } = &results[0] else {
        panic!("not a bandwidth result: {results:?}");
    };
    assert_eq!(per_thread.len(), 2, "{client}");
    assert!(
        per_thread.iter().all(|t| t.stats.iters > 0),
        "{per_thread:?}"
    );
    let sum: u64 = per_thread.iter().map(|t| t.stats.iters).sum();
    assert_eq!(sum, stats.iters, "{client}");
}

#[test]
fn bad_thread_counts_are_refused() {
    let mut opts = PerfOptions::defaults(TestKind::WriteBw);
    for (threads, qps, message) in [
        (0, 4, "--threads 0: must be between 1 and 64"),
        (65, 130, "--threads 65: must be between 1 and 64"),
        (3, 4, "-q/--qp 4 is not a multiple of --threads 3"),
        (2, 1, "-q/--qp 1 is not a multiple of --threads 2"),
    ] {
        opts.threads = threads;
        opts.num_qps = qps;
        let err = opts.validate().unwrap_err().to_string();
        assert!(err.starts_with(message), "{threads} {qps}: {err}");
    }
    opts.threads = 4;
    opts.num_qps = 8;
    opts.validate().unwrap();
    let mut lat = PerfOptions::defaults(TestKind::ReadLat);
    lat.threads = 2;
    let err = lat.validate().unwrap_err().to_string();
    assert!(
        err.contains("a latency test runs one QP on one thread"),
        "{err}"
    );
}

#[test]
fn endpoint_inline_size_is_bounded_by_the_qp() {
    let (a, _b, _link) = devices(0.0);
    let mut ep = endpoint(&a, &spec(true, 4096, 16, 16));
    let max = xroce::engine::limits::MAX_INLINE_DATA;
    assert_eq!(ep.local().max_inline, max);
    ep.set_inline(64).unwrap();
    ep.set_inline(max).unwrap();
    let err = ep.set_inline(max + 1).unwrap_err().to_string();
    assert!(err.contains("max_inline_data"), "{err}");
}

#[test]
fn a_bw_client_waits_out_a_long_moderated_completion_while_the_peer_answers() {
    // read_bw, 64 READs of 8 MiB: with CQ moderation only the last is signalled, so the
    // first completion comes after 512 MiB. The stall timeout (100 ms) is far shorter than
    // that, but the peer answers all along: the client must finish, not say "the peer
    // stopped answering" (the rxe lab's 8 MiB READs met exactly this).
    let mut opts = PerfOptions::defaults(TestKind::ReadBw);
    opts.size = 8 << 20;
    opts.iters = 64;
    opts.stall_timeout = Duration::from_millis(100);
    opts.settle_depths();
    let started = std::time::Instant::now();
    let (server, client) = perf_over_lossy(opts, 0.0, None);
    let took = started.elapsed();
    let (_, client) = (server.unwrap(), client.unwrap());
    assert!(client.contains(" 8388608 "), "{client}");
    assert!(
        took > Duration::from_millis(400),
        "the run ({took:?}) must outlast the stall timeout for this test to mean anything"
    );
}
