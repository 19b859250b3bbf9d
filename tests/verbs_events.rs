//! Asynchronous events through the device's event fd, and loopback: QPs connected to QPs of
//! their own device.
//!
//! Over the in-memory pair (no root): QP fatal and CQ error make the async fd readable and
//! come out of `get_async_event`; a seeded random workload (WRITE, READ, SEND, FETCH_ADD,
//! every byte and value checked) runs between two devices and, with the same seed, between
//! QPs of one device (one shard, and two shards: each frame handed to its QP's shard), where
//! not one frame reaches the link; a QP connected to itself.
//!
//! Over AF_XDP (root): one process opens two devices on the two ends of a veth pair in one
//! namespace, runs the workload between them and over loopback on one of them, then takes
//! the link down and up (`ip link set`) and must see port error and port active on both
//! devices, and traffic flowing again after it.
mod common;
#[path = "common/sides.rs"]
mod sides;

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sides::{connect, side, Side, WAIT};
use xroce::driver::poll_readable;
use xroce::verbs::*;

/// Bytes of the slot each operation moves (4 packets at path MTU 1024).
const SLOT: usize = 4096;
/// Where a READ takes its bytes from, on the responder's side.
const READ_SRC: usize = SLOT;
/// The responder's 64-bit counter for FETCH_ADD.
const COUNTER: usize = 2 * SLOT - 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Read,
    Send,
    FetchAdd,
}

/// What one random workload did: operations of each kind, and each pair's final counter.
#[derive(Debug, PartialEq, Eq)]
struct WorkloadOutcome {
    ops: [u64; 4],
    counters: Vec<u64>,
}

fn post(s: &Side, wr_id: u64, op: WrOp, len: usize) {
    s.qp.post_send(&SendWr {
        wr_id,
        op,
        sg_list: vec![s.mr.sge(0, len as u32).unwrap()],
        flags: SendFlags::SIGNALED,
        ud: None,
    })
    .unwrap();
}

fn one_wc(cq: &Cq, what: &str) -> Wc {
    let wc = cq
        .wait(1, WAIT)
        .unwrap()
        .pop()
        .unwrap_or_else(|| panic!("no completion for {what} within {WAIT:?}"));
    assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
    wc
}

/// `rounds` rounds; in each, every pair's `a` posts one random operation towards its `b`
/// (all pairs in flight at once), then each is checked: WRITE and SEND bytes at `b`, READ
/// bytes at `a`, FETCH_ADD's original value against the model (and the counter at the end).
fn random_workload(pairs: &[(Side, Side)], seed: u64, rounds: usize) -> WorkloadOutcome {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut counters = vec![0u64; pairs.len()];
    for (_, b) in pairs {
        b.mr.write(COUNTER, &0u64.to_le_bytes()).unwrap();
    }
    let mut ops = [0u64; 4];
    for round in 0..rounds {
        let mut expected = Vec::with_capacity(pairs.len());
        for (i, (a, b)) in pairs.iter().enumerate() {
            let op = [Op::Write, Op::Read, Op::Send, Op::FetchAdd][rng.gen_range(0..4)];
            ops[op as usize] += 1;
            let len = rng.gen_range(1..=SLOT);
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let wr_id = (round * pairs.len() + i) as u64;
            let (remote, rkey) = (b.mr.addr(), b.mr.rkey());
            let mut original = 0;
            match op {
                Op::Write => {
                    a.mr.write(0, &data).unwrap();
                    let op = WrOp::Write {
                        remote_addr: remote,
                        rkey,
                    };
                    post(a, wr_id, op, len);
                }
                Op::Read => {
                    b.mr.write(READ_SRC, &data).unwrap();
                    let op = WrOp::Read {
                        remote_addr: remote + READ_SRC as u64,
                        rkey,
                    };
                    post(a, wr_id, op, len);
                }
                Op::Send => {
                    b.qp.post_recv(&RecvWr {
                        wr_id,
                        sg_list: vec![b.mr.sge(0, SLOT as u32).unwrap()],
                    })
                    .unwrap();
                    a.mr.write(0, &data).unwrap();
                    post(a, wr_id, WrOp::Send, len);
                }
                Op::FetchAdd => {
                    let add = u64::from(rng.gen::<u32>());
                    original = counters[i];
                    counters[i] = counters[i].wrapping_add(add);
                    let op = WrOp::FetchAdd {
                        remote_addr: remote + COUNTER as u64,
                        rkey,
                        add,
                    };
                    post(a, wr_id, op, 8);
                }
            }
            expected.push((op, data, original, wr_id));
        }
        for ((a, b), (op, data, original, wr_id)) in pairs.iter().zip(expected) {
            let what = format!("{op:?} #{wr_id} of {} bytes", data.len());
            let wc = one_wc(&a.cq, &what);
            assert_eq!(wc.wr_id, wr_id, "{what}");
            match op {
                Op::Write => assert!(b.mr.to_vec(0, data.len()).unwrap() == data, "{what}"),
                Op::Read => assert!(a.mr.to_vec(0, data.len()).unwrap() == data, "{what}"),
                Op::Send => {
                    let rwc = one_wc(&b.cq, &what);
                    assert_eq!(
                        (rwc.wr_id, rwc.opcode, rwc.byte_len as usize),
                        (wr_id, WcOpcode::Recv, data.len()),
                        "{what}"
                    );
                    assert!(b.mr.to_vec(0, data.len()).unwrap() == data, "{what}");
                }
                Op::FetchAdd => {
                    let got = u64::from_le_bytes(a.mr.to_vec(0, 8).unwrap().try_into().unwrap());
                    assert_eq!(got, original, "{what}");
                }
            }
        }
    }
    for ((_, b), want) in pairs.iter().zip(&counters) {
        let got = u64::from_le_bytes(b.mr.to_vec(COUNTER, 8).unwrap().try_into().unwrap());
        assert_eq!(got, *want, "final counter");
    }
    WorkloadOutcome { ops, counters }
}

/// `count` connected pairs with `a` on `da` and `b` on `db` (the same device: loopback).
fn pairs_between(da: &Device, db: &Device, count: usize) -> Vec<(Side, Side)> {
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    (0..count)
        .map(|_| {
            let (a, b) = (side(da, &pa), side(db, &pb));
            connect(&a, &b);
            (a, b)
        })
        .collect()
}

fn mem_devices(shards: u32) -> (Device, Device, Vec<MemLink>) {
    Device::mem_pair_sharded(
        &mem_link_config(1500, 0.0, 7),
        DeviceConfig {
            shards,
            ..DeviceConfig::default()
        },
    )
    .unwrap()
}

const SEED: u64 = 0x5eed_0013;
const ROUNDS: usize = 120;
const PAIRS: usize = 3;

#[test]
fn loopback_runs_the_random_workload_of_two_devices_without_touching_the_link() {
    let (da, db, _links) = mem_devices(1);
    let between = random_workload(&pairs_between(&da, &db, PAIRS), SEED, ROUNDS);
    assert!(
        da.progress_stats()
            .tx_frames
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );

    let (la, lb, _links) = mem_devices(1);
    let looped = random_workload(&pairs_between(&la, &la, PAIRS), SEED, ROUNDS);
    assert_eq!(looped, between, "same seed, same operations, same results");
    assert!(looped.ops.iter().all(|&n| n > 0), "{looped:?}");
    let stats = |d: &Device| {
        let s = d.progress_stats();
        let get = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        (
            get(&s.tx_frames),
            get(&s.rx_frames),
            get(&s.looped_back_frames),
        )
    };
    let (tx, _, looped_frames) = stats(&la);
    // Every request and every answer went round inside the device, none to the driver.
    assert_eq!(tx, 0, "frames handed to the link");
    assert!(looped_frames > (ROUNDS * PAIRS) as u64, "{looped_frames}");
    assert_eq!(stats(&lb).1, 0, "the link's other end received frames");
    assert_eq!(la.counters().drops.unknown_qp, 0);
}

#[test]
fn loopback_across_shards_hands_each_frame_to_its_qps_shard() {
    let (da, _db, _links) = mem_devices(2);
    let pairs = pairs_between(&da, &da, PAIRS);
    // CQs go to the shards in turn: every pair has one side on each shard.
    let outcome = random_workload(&pairs, SEED, ROUNDS);
    assert!(outcome.ops.iter().all(|&n| n > 0), "{outcome:?}");
    let s = da.progress_stats();
    assert_eq!(s.tx_frames.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(
        s.looped_back_frames
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
    assert_eq!(da.counters().drops.unknown_qp, 0);
}

#[test]
fn a_qp_connected_to_itself_writes_and_sends_to_itself() {
    let (da, _db, _links) = mem_devices(1);
    let pd = da.alloc_pd().unwrap();
    let s = side(&da, &pd);
    let gid = da.ipv4_gid_index().unwrap();
    let me = RcPeer {
        qpn: s.qp.qp_num(),
        psn: 100,
        gid: da.query_gid(gid).unwrap(),
    };
    let options = RcOptions {
        sgid_index: gid as u8,
        sq_psn: 100,
        ..RcOptions::default()
    };
    s.qp.connect_rc(&me, &options).unwrap();
    s.mr.write(0, b"to myself").unwrap();
    let op = WrOp::Write {
        remote_addr: s.mr.addr() + 100,
        rkey: s.mr.rkey(),
    };
    post(&s, 1, op, 9);
    one_wc(&s.cq, "WRITE to itself");
    assert_eq!(s.mr.to_vec(100, 9).unwrap(), b"to myself");
    s.qp.post_recv(&RecvWr {
        wr_id: 2,
        sg_list: vec![s.mr.sge(200, 64).unwrap()],
    })
    .unwrap();
    post(&s, 3, WrOp::Send, 9);
    let mut wcs = s.cq.wait(2, WAIT).unwrap();
    wcs.sort_by_key(|w| w.wr_id);
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    assert_eq!((wcs[0].opcode, wcs[0].byte_len), (WcOpcode::Recv, 9));
    assert_eq!(wcs[1].status, WcStatus::Success);
    assert_eq!(s.mr.to_vec(200, 9).unwrap(), b"to myself");
}

/// A capture of a device records each looped-back frame once (its own address both ways).
/// `XROCE_LOOPBACK_PCAP=FILE` keeps the capture (docs/transport.md quotes one).
#[test]
fn a_capture_holds_each_looped_back_frame_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = std::env::var_os("XROCE_LOOPBACK_PCAP")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| dir.path().join("loopback.pcap"));
    let config = DeviceConfig {
        pcap: Some(path.clone()),
        ..DeviceConfig::default()
    };
    let (da, db, _link) = Device::mem_pair(&mem_link_config(1500, 0.0, 7), config).unwrap();
    let looped = {
        let pairs = pairs_between(&da, &da, 1);
        let (a, b) = &pairs[0];
        a.mr.write(0, &[7; 2500]).unwrap();
        let write = WrOp::Write {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        };
        post(a, 1, write, 2500);
        one_wc(&a.cq, "WRITE");
        let read = WrOp::Read {
            remote_addr: b.mr.addr() + READ_SRC as u64,
            rkey: b.mr.rkey(),
        };
        post(a, 2, read, 1500);
        one_wc(&a.cq, "READ");
        da.progress_stats()
            .looped_back_frames
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    // WRITE FIRST, MIDDLE, LAST, its ACK; READ request, two responses.
    assert_eq!(looped, 7);
    drop((da, db));
    let mut reader = pcap_file::pcap::PcapReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let own: std::net::IpAddr = [198, 18, 0, 1].into();
    let mut frames = 0;
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.unwrap();
        assert_eq!(xroce::wire::frame::frame_dest_ip(&pkt.data), Some(own));
        frames += 1;
    }
    assert_eq!(frames, looped, "each looped frame once in the capture");
}

#[test]
fn qp_fatal_and_cq_error_make_the_async_fd_readable() {
    let (da, db, _links) = mem_devices(1);
    assert!(!poll_readable(da.async_fd(), Some(Duration::ZERO)).unwrap());
    assert!(matches!(
        da.get_async_event(Some(Duration::from_millis(20))),
        Err(VerbsError::Timeout(_))
    ));
    // A one-entry send CQ and two signalled WRITEs: the second completion overruns it.
    let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
    let tiny = da.create_cq(1, None).unwrap();
    let qp = pa.create_qp(&QpInitAttr::rc(&tiny, &tiny)).unwrap();
    let mr = pa.reg_mr(4096, Access::ALL).unwrap();
    let a = Side {
        dev: da.clone(),
        _pd: pa.clone(),
        cq: tiny,
        qp,
        mr,
    };
    let b = side(&db, &pb);
    connect(&a, &b);
    for wr_id in 1..=2 {
        let op = WrOp::Write {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey(),
        };
        post(&a, wr_id, op, 64);
    }
    // Sleep on the fd as an event loop would, then take what it announced.
    assert!(
        poll_readable(da.async_fd(), Some(WAIT)).unwrap(),
        "fd never readable"
    );
    let mut seen = Vec::new();
    while !(seen.iter().any(|e| matches!(e, Event::CqError(_)))
        && seen.contains(&Event::QpFatal(a.qp.qp_num())))
    {
        match da.get_async_event(Some(WAIT)) {
            Ok(e) => seen.push(e),
            Err(e) => panic!("after {seen:?}: {e}"),
        }
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen.contains(&Event::CqError(a.cq.id())), "{seen:?}");
    // Drained: the fd is quiet again and nothing else waits.
    assert!(!poll_readable(da.async_fd(), Some(Duration::ZERO)).unwrap());
    assert_eq!(da.poll_async_event(), None);
    use std::os::fd::AsRawFd;
    assert_eq!(da.as_raw_fd(), da.async_fd().as_raw_fd());
}

// ---------------------------------------------------------------------------------------
// Over AF_XDP: two devices in one process, loopback, port events.

#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    let verdict = match role.as_str() {
        "two_devices" => two_devices_main(),
        other => Err(format!("unknown helper role {other}")),
    };
    let line = match verdict {
        Ok(summary) => format!("PASS {summary}"),
        Err(e) => format!("ERROR {e}"),
    };
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

fn ip_link(args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("ip")
        .arg("link")
        .args(args)
        .output()
        .map_err(|e| format!("ip link: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip link {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// The next event of `dev`, skipping none: `want` must be what comes.
fn expect_event(dev: &Device, want: Event) -> Result<(), String> {
    match dev.get_async_event(Some(Duration::from_secs(10))) {
        Ok(e) if e == want => Ok(()),
        Ok(e) => Err(format!("{}: expected {want:?}, got {e:?}", dev.name())),
        Err(e) => Err(format!("{}: expected {want:?}: {e}", dev.name())),
    }
}

/// Inside the namespace: devices on both veth ends (XDP), the workload between them and
/// over loopback, then a link flap.
fn two_devices_main() -> Result<String, String> {
    let (if_a, if_b) = (env("XV_IF_A"), env("XV_IF_B"));
    // XV_PCAP: a capture of the first device (docs/transport.md quotes one).
    let pcap = std::env::var_os("XV_PCAP").map(std::path::PathBuf::from);
    let open = |ifname: &str, pcap: Option<std::path::PathBuf>| {
        let config = DeviceConfig {
            pcap,
            ..DeviceConfig::default()
        };
        Device::open(ifname, config).map_err(|e| format!("opening {ifname}: {e}"))
    };
    let (da, db) = (open(&if_a, pcap)?, open(&if_b, None)?);
    // Both ends live in one namespace, so the kernel would answer ARP for both addresses
    // from either interface: name each peer's MAC instead.
    let ip_of = |d: &Device| d.query_gid(d.ipv4_gid_index().unwrap()).unwrap().to_ip();
    da.add_static_neighbour(ip_of(&db), db.netdev().mac);
    db.add_static_neighbour(ip_of(&da), da.netdev().mac);
    let rx_of = |d: &Device| {
        d.progress_stats()
            .rx_frames
            .load(std::sync::atomic::Ordering::Relaxed)
    };

    let between = pairs_between(&da, &db, 2);
    let first = random_workload(&between, SEED, 40);
    if rx_of(&db) == 0 {
        return Err("the second device received nothing".into());
    }

    let b_rx = rx_of(&db);
    let looped = random_workload(&pairs_between(&da, &da, 2), SEED, 40);
    if looped != first {
        return Err(format!("loopback {looped:?} != two devices {first:?}"));
    }
    if rx_of(&db) != b_rx {
        return Err("loopback frames reached the other end of the link".into());
    }
    let looped_frames = da
        .progress_stats()
        .looped_back_frames
        .load(std::sync::atomic::Ordering::Relaxed);

    // A pair with a local ACK timeout of 1 s (4.096 us x 2^18) and 7 retries: its WRITE
    // posted during the outage has 8 s to get through.
    let (wa, wb) = (
        side(&da, &da.alloc_pd().unwrap()),
        side(&db, &db.alloc_pd().unwrap()),
    );
    for (me, peer, psn, peer_psn) in [(&wa, &wb, 300, 400), (&wb, &wa, 400, 300)] {
        let gid = peer
            .dev
            .query_gid(peer.dev.ipv4_gid_index().unwrap())
            .unwrap();
        let options = RcOptions {
            sgid_index: me.dev.ipv4_gid_index().unwrap() as u8,
            sq_psn: psn,
            timeout: 18,
            ..RcOptions::default()
        };
        let peer_qp = RcPeer {
            qpn: peer.qp.qp_num(),
            psn: peer_psn,
            gid,
        };
        me.qp
            .connect_rc(&peer_qp, &options)
            .map_err(|e| e.to_string())?;
    }

    for d in [&da, &db] {
        if let Some(e) = d.poll_async_event() {
            return Err(format!(
                "{}: unexpected event {e:?} before the flap",
                d.name()
            ));
        }
    }
    ip_link(&["set", "dev", &if_a, "down"])?;
    // The end set down and its peer, which loses its carrier, both report it.
    expect_event(&da, Event::PortError(1))?;
    expect_event(&db, Event::PortError(1))?;
    if da.query_port(1).map_err(|e| e.to_string())?.state != PortState::Down {
        return Err("query_port says active while the link is down".into());
    }
    wa.mr.write(0, &[0x5a; 2500]).unwrap();
    let write = WrOp::Write {
        remote_addr: wb.mr.addr(),
        rkey: wb.mr.rkey(),
    };
    post(&wa, 77, write, 2500);
    std::thread::sleep(Duration::from_millis(200));
    if let Some(wc) = wa.cq.poll_one().map_err(|e| e.to_string())? {
        return Err(format!("a WRITE completed while the link was down: {wc:?}"));
    }
    ip_link(&["set", "dev", &if_a, "up"])?;
    expect_event(&da, Event::PortActive(1))?;
    expect_event(&db, Event::PortActive(1))?;
    let wc = one_wc(&wa.cq, "the WRITE posted while the link was down");
    if wc.wr_id != 77 || wb.mr.to_vec(0, 2500).unwrap() != [0x5a; 2500] {
        return Err(format!("the WRITE across the outage: {wc:?}"));
    }
    // The other QPs survived the flap too; frames flow again.
    random_workload(&between, SEED + 1, 20);
    Ok(format!(
        "{looped_frames} frames looped back, port down and up seen by both"
    ))
}

#[test]
fn xdp_two_devices_in_one_process_loopback_and_port_events() {
    if !common::privileged_or_skip("xdp_two_devices_in_one_process_loopback_and_port_events") {
        return;
    }
    let ns = xroce::netns::Netns::create("ev").expect("creating a namespace");
    let (if_a, if_b) = (
        xroce::netns::unique_ifname('a'),
        xroce::netns::unique_ifname('b'),
    );
    let ip = |args: &[&str]| ns.ip(args).expect("configuring the namespace");
    ip(&["link", "add", &if_a, "type", "veth", "peer", "name", &if_b]);
    ip(&["addr", "add", "198.18.9.1/24", "dev", &if_a]);
    ip(&["addr", "add", "198.18.10.1/24", "dev", &if_b]);
    ip(&["link", "set", "dev", &if_a, "up"]);
    ip(&["link", "set", "dev", &if_b, "up"]);
    let mut helper = common::Helper::spawn(
        &ns,
        "two_devices",
        &[("XV_IF_A", if_a.clone()), ("XV_IF_B", if_b.clone())],
    );
    let verdict = helper.expect("PASS", Duration::from_secs(120));
    helper.wait();
    eprintln!("{verdict}");
}
