//! AF_XDP drivers for engine shards (`XdpDriver::open_shards`) on a 4-queue veth pair.
//!
//! Each end runs as a child process inside its namespace (this test binary re-run with
//! `XROCE_DRIVER_HELPER=<role>` on its `helper` test, as in tests/driver_xdp.rs). Every
//! shard of one end sends marked RoCE frames from its own thread; the other end says which
//! of its shards received which sender shard's frames. veth hands a frame to the peer's
//! receive queue numbered like the sender's transmit queue, and shard `i` transmits on
//! queue `i` and owns the receive queues `q % shards == i`, so the frames of sender shard
//! `j` must reach exactly receiver shard `j % shards`.
//!
//! Built only with the `xdp` feature (`required-features` in Cargo.toml).
mod common;
#[path = "common/roce.rs"]
mod roce;

use common::Helper;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use xroce::driver::xdp::{AttachMode, XdpConfig, XdpDriver};
use xroce::driver::{poll_readable, Driver, DriverError};
use xroce::netns::{LinkConfig, VethLink};
use xroce::wire::{EthRepr, IpRepr};

/// Receive and transmit queues of each veth end.
const QUEUES: u32 = 4;
/// Frames each sending shard sends.
const PER_SHARD: u32 = 200;
/// Marks the payload of the frames built here: `XSHARD`, sender side, sender shard, seq.
const MARK: &[u8; 6] = b"XSHARD";

// ---------------------------------------------------------------------------------------
// Frames

/// Frame `seq` of shard `shard` on side `side`, a RoCE RC SEND ONLY. Each frame has its own
/// UDP source port: a flow hash would spread them, the transmit queue must not.
fn shard_frame(env: &PeerEnv, shard: u32, seq: u32) -> Vec<u8> {
    let mut payload = MARK.to_vec();
    payload.push(env.side);
    payload.push(shard as u8);
    payload.extend_from_slice(&seq.to_be_bytes());
    payload.resize(64, 0x5a);
    let eth = EthRepr {
        dst: env.peer_mac,
        src: env.local_mac,
        vlan: None,
    };
    let ip = IpRepr::V4 {
        src: env.local_ip,
        dst: env.peer_ip,
        tos: 0,
        ttl: 64,
        ident: seq as u16,
        dont_fragment: true,
    };
    roce::rc_send_only(eth, ip, 0xc000 + (seq % 1024) as u16, &payload)
}

/// (sender side, sender shard, seq) of a frame built by [`shard_frame`].
fn mark_of(frame: &[u8]) -> Option<(u8, u32, u32)> {
    let at = frame.windows(MARK.len()).position(|w| w == MARK)? + MARK.len();
    let rest = frame.get(at..at + 6)?;
    let seq = u32::from_be_bytes(rest[2..6].try_into().ok()?);
    Some((rest[0], u32::from(rest[1]), seq))
}

// ---------------------------------------------------------------------------------------
// The parent side

fn hex_mac(mac: [u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect()
}

fn mac_of(hex: &str) -> [u8; 6] {
    let bytes = common::unhex(hex);
    bytes.try_into().expect("6 bytes")
}

fn go_file() -> PathBuf {
    std::env::temp_dir().join(xroce::netns::unique_name("xroce-shards-go-"))
}

/// What one end reported.
#[derive(Debug, Default)]
struct Report {
    /// Per receiving shard: its receive queues and transmit queue.
    shard_queues: BTreeMap<u32, (String, u32)>,
    /// (receiving shard, sender shard) -> (frames, distinct sequence numbers).
    received: BTreeMap<(u32, u32), (u32, u32)>,
    /// Frames without the mark, or from the wrong side.
    foreign: u32,
    /// Per shard: the program-wide counters it reported ("redirected=.. no_socket=..").
    program_stats: BTreeMap<u32, String>,
    /// Program still attached after all drivers but one were dropped / after all were.
    attached_after_partial_drop: Option<bool>,
    attached_after_drop: Option<bool>,
    /// Everything the child said, for messages.
    lines: Vec<String>,
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

fn spawn_end(
    link: &VethLink,
    side_a: bool,
    shards: u32,
    peer_shards: u32,
    go: &std::path::Path,
    attach: &str,
) -> Helper {
    let (ns, ifname, local_ip, peer_ip, local_mac, peer_mac) = if side_a {
        (
            &link.a, &link.a_if, link.a_ip, link.b_ip, link.a_mac, link.b_mac,
        )
    } else {
        (
            &link.b, &link.b_if, link.b_ip, link.a_ip, link.b_mac, link.a_mac,
        )
    };
    Helper::spawn(
        ns,
        "shards-peer",
        &[
            ("IFNAME", ifname.clone()),
            ("SIDE", if side_a { "a" } else { "b" }.into()),
            ("SHARDS", shards.to_string()),
            ("PEER_SHARDS", peer_shards.to_string()),
            ("COUNT", PER_SHARD.to_string()),
            ("LOCAL_IP", local_ip.to_string()),
            ("PEER_IP", peer_ip.to_string()),
            ("LOCAL_MAC", hex_mac(local_mac)),
            ("PEER_MAC", hex_mac(peer_mac)),
            ("GO", go.display().to_string()),
            ("ATTACH", attach.into()),
            ("TIMEOUT_MS", "15000".into()),
            ("LINGER_MS", "300".into()),
        ],
    )
}

fn collect(end: &mut Helper) -> Report {
    let mut report = Report::default();
    loop {
        let line = end.expect("", Duration::from_secs(60));
        report.lines.push(line.clone());
        if line.starts_with("SHARD ") {
            let shard = field(&line, "shard").parse().unwrap();
            let queues = line
                .split_once("queues=")
                .and_then(|(_, r)| r.split_once(']'))
                .map(|(q, _)| format!("{q}]"))
                .unwrap();
            let tx = field(&line, "tx").parse().unwrap();
            report.shard_queues.insert(shard, (queues, tx));
        } else if line.starts_with("RECEIVED ") {
            let key = (
                field(&line, "shard").parse().unwrap(),
                field(&line, "from").parse().unwrap(),
            );
            let value = (
                field(&line, "frames").parse().unwrap(),
                field(&line, "distinct").parse().unwrap(),
            );
            report.received.insert(key, value);
        } else if line.starts_with("FOREIGN ") {
            report.foreign += field(&line, "frames").parse::<u32>().unwrap();
        } else if line.starts_with("STATS ") {
            let shard = field(&line, "shard").parse().unwrap();
            let program = format!(
                "redirected={} no_socket={}",
                field(&line, "redirected"),
                field(&line, "no_socket")
            );
            report.program_stats.insert(shard, program);
        } else if line.starts_with("PARTIAL-DROP ") {
            report.attached_after_partial_drop = Some(field(&line, "xdp") == "true");
        } else if line.starts_with("DROPPED ") {
            report.attached_after_drop = Some(field(&line, "xdp") == "true");
        } else if line.starts_with("DONE") {
            return report;
        }
    }
}

/// Where the frames of a sender shard must arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mapping {
    /// Sender shard `j` transmits on queue `j`, received on the peer's queue `j`: they all
    /// reach shard `j % shards` (native XDP on veth).
    SameQueue,
    /// All of one sender shard's frames reach one receiver shard, which one is up to the
    /// kernel (generic XDP on veth: see docs/xdp.md).
    OneShard,
}

/// Opens `a_shards` drivers on side A and `b_shards` on side B, lets every shard of each
/// side send [`PER_SHARD`] frames, and checks where they arrived.
fn exchange(a_shards: u32, b_shards: u32, attach: &str, mapping: Mapping) {
    let link = VethLink::create(&LinkConfig {
        queues: QUEUES,
        ..LinkConfig::default()
    })
    .expect("veth link");
    assert!(!link.a.has_xdp(&link.a_if).unwrap());
    assert!(!link.b.has_xdp(&link.b_if).unwrap());
    let go = go_file();
    let mut a = spawn_end(&link, true, a_shards, b_shards, &go, attach);
    let mut b = spawn_end(&link, false, b_shards, a_shards, &go, attach);
    let ready_a = a.expect("READY", Duration::from_secs(60));
    let ready_b = b.expect("READY", Duration::from_secs(60));
    assert!(link.a.has_xdp(&link.a_if).unwrap(), "{ready_a}");
    assert!(link.b.has_xdp(&link.b_if).unwrap(), "{ready_b}");
    // Both ends have every socket bound: now they may send.
    std::fs::write(&go, b"go").unwrap();
    let report_a = collect(&mut a);
    let report_b = collect(&mut b);
    a.wait();
    b.wait();
    let _ = std::fs::remove_file(&go);

    for (report, shards, peer_shards) in [
        (&report_a, a_shards, b_shards),
        (&report_b, b_shards, a_shards),
    ] {
        let said = &report.lines;
        // Queue assignment: shard i owns the queues congruent to i and transmits on i.
        assert_eq!(report.shard_queues.len() as u32, shards, "{said:#?}");
        for (&shard, (queues, tx)) in &report.shard_queues {
            let want: Vec<u32> = (0..QUEUES).filter(|q| q % shards == shard).collect();
            assert_eq!(queues, &format!("{want:?}"), "shard {shard}: {said:#?}");
            assert_eq!(*tx, shard, "{said:#?}");
        }
        // Each sender shard's frames all reach one receiver shard, once each; no other
        // shard gets any. With SameQueue that shard is j % shards, and every shard that
        // some sender's queue maps to receives.
        let mut total = 0;
        for from in 0..peer_shards {
            let at: Vec<u32> = (0..shards)
                .filter(|&shard| report.received[&(shard, from)].0 > 0)
                .collect();
            let want = match mapping {
                Mapping::SameQueue => vec![from % shards],
                Mapping::OneShard => at.clone(),
            };
            assert!(
                at == want && at.len() == 1,
                "peer shard {from}'s frames reached shards {at:?}, not {want:?}: {said:#?}"
            );
            let (frames, distinct) = report.received[&(at[0], from)];
            assert_eq!(
                (frames, distinct),
                (PER_SHARD, PER_SHARD),
                "shard {} from peer shard {from}: {said:#?}",
                at[0]
            );
            total += frames;
        }
        assert_eq!(report.foreign, 0, "{said:#?}");
        // The program's counters are program-wide: every shard reports the same ones,
        // and they count exactly the frames the shards received.
        assert_eq!(report.program_stats.len() as u32, shards, "{said:#?}");
        let want = format!("redirected={total} no_socket=0");
        for stats in report.program_stats.values() {
            assert_eq!(stats, &want, "{said:#?}");
        }
        // One program, detached with the last driver, not before.
        if shards > 1 {
            assert_eq!(report.attached_after_partial_drop, Some(true), "{said:#?}");
        }
        assert_eq!(report.attached_after_drop, Some(false), "{said:#?}");
    }
}

// ---------------------------------------------------------------------------------------
// Tests

#[test]
fn two_shards_each_end_frames_of_shard_i_reach_only_peer_shard_i() {
    if !common::privileged_or_skip("two_shards_each_end_frames_of_shard_i_reach_only_peer_shard_i")
    {
        return;
    }
    exchange(2, 2, "auto", Mapping::SameQueue);
}

#[test]
fn four_shards_each_end_frames_of_shard_i_reach_only_peer_shard_i() {
    if !common::privileged_or_skip("four_shards_each_end_frames_of_shard_i_reach_only_peer_shard_i")
    {
        return;
    }
    exchange(4, 4, "auto", Mapping::SameQueue);
}

#[test]
fn a_shard_receives_only_from_its_own_queues() {
    if !common::privileged_or_skip("a_shard_receives_only_from_its_own_queues") {
        return;
    }
    // A's four shards transmit on queues 0..4; B's shard 0 owns queues 0 and 2, shard 1
    // owns 1 and 3. Back the other way, B's two shards reach only A's shards 0 and 1.
    exchange(4, 2, "auto", Mapping::SameQueue);
}

#[test]
fn shards_in_generic_attach_mode_each_get_whole_flows() {
    if !common::privileged_or_skip("shards_in_generic_attach_mode_each_get_whole_flows") {
        return;
    }
    // Generic XDP on veth sees a frame from the peer's transmit queue j on receive queue
    // j - 1 (docs/xdp.md): shards do not line up, but nothing is lost or doubled, and a
    // sender shard's frames stay together.
    exchange(4, 4, "generic", Mapping::OneShard);
}

#[test]
fn shard_counts_the_interface_cannot_carry_are_typed_errors() {
    if !common::privileged_or_skip("shard_counts_the_interface_cannot_carry_are_typed_errors") {
        return;
    }
    let link = VethLink::create(&LinkConfig {
        queues: QUEUES,
        ..LinkConfig::default()
    })
    .expect("veth link");
    let open = |shards: u32| {
        let mut h = Helper::spawn(
            &link.b,
            "shards-open",
            &[
                ("IFNAME", link.b_if.clone()),
                ("SHARDS", shards.to_string()),
            ],
        );
        let line = h.expect("OPEN", Duration::from_secs(60));
        h.wait();
        line
    };
    for shards in [0, QUEUES + 1, 64] {
        let line = open(shards);
        assert!(
            line.starts_with(&format!(
                "OPEN-ERR ShardsOutOfRange {{ ifname: \"{}\", shards: {shards}, queues: {QUEUES} }}",
                link.b_if
            )),
            "{line}"
        );
        assert!(
            line.contains(&format!("ethtool -L {} combined N", link.b_if))
                && line.contains("numtxqueues N numrxqueues N"),
            "the message says how to add queues: {line}"
        );
        // Refused before anything was attached.
        assert!(!link.b.has_xdp(&link.b_if).unwrap(), "{line}");
    }
    // One shard is today's single driver: every queue, transmitting on the first.
    let line = open(1);
    assert_eq!(line, "OPEN-OK 1 [[0, 1, 2, 3]] tx=[0]", "{line}");
    // As many shards as queues: one queue each.
    let line = open(QUEUES);
    assert_eq!(
        line, "OPEN-OK 4 [[0], [1], [2], [3]] tx=[0, 1, 2, 3]",
        "{line}"
    );

    // A single-queue link takes one shard only.
    drop(link);
    let link = VethLink::create(&LinkConfig::default()).expect("veth link");
    let mut h = Helper::spawn(
        &link.b,
        "shards-open",
        &[("IFNAME", link.b_if.clone()), ("SHARDS", "2".into())],
    );
    let line = h.expect("OPEN", Duration::from_secs(60));
    h.wait();
    assert!(
        line.starts_with("OPEN-ERR ShardsOutOfRange") && line.contains("queues: 1 "),
        "{line}"
    );
}

// ---------------------------------------------------------------------------------------
// The helper roles, run in child processes.

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("helper needs {name}"))
}

fn config_from_env() -> XdpConfig {
    let mut cfg = XdpConfig::new(env("IFNAME"));
    cfg.attach = match std::env::var("ATTACH").as_deref() {
        Ok("generic") => AttachMode::Generic,
        Ok("native") => AttachMode::Native,
        _ => AttachMode::Auto,
    };
    cfg
}

/// What a `shards-peer` child needs to build its frames.
struct PeerEnv {
    side: u8,
    local_ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    local_mac: [u8; 6],
    peer_mac: [u8; 6],
}

/// Send `count` frames from shard `d` (half copied in by `send`, half written straight
/// into the UMEM by `send_with`), then receive until all shards together (`received`)
/// have the `expect` frames the peer sends or `deadline` passed, and for `linger` longer
/// to catch any that should not arrive. Which shard gets which frames is for the parent
/// to check.
fn run_shard(
    d: &mut XdpDriver,
    peer: &PeerEnv,
    count: u32,
    received: &AtomicU32,
    expect: u32,
    deadline: Instant,
    linger: Duration,
) -> Vec<Vec<u8>> {
    let shard = d.shard();
    for seq in 0..count {
        let frame = shard_frame(peer, shard, seq);
        loop {
            let sent = if seq % 2 == 0 {
                d.send(&frame).map(|()| Some(frame.len()))
            } else {
                d.send_with(d.send_with_room().min(2048), &mut |buf| {
                    buf[..frame.len()].copy_from_slice(&frame);
                    Some(frame.len())
                })
            };
            match sent {
                Ok(len) => {
                    assert_eq!(len, Some(frame.len()));
                    break;
                }
                Err(DriverError::TxBusy) => d.flush().unwrap(),
                Err(e) => panic!("shard {shard} sending: {e}"),
            }
        }
    }
    d.flush().unwrap();
    let mut got = Vec::new();
    let mut quiet_until = None;
    loop {
        let now = Instant::now();
        if received.load(Ordering::Relaxed) >= expect || now >= deadline {
            let until = *quiet_until.get_or_insert(now + linger);
            if now >= until {
                return got;
            }
        }
        poll_readable(d.wait_fd().unwrap(), Some(Duration::from_millis(20))).unwrap();
        let n = d.recv(64, &mut |f, _| got.push(f.to_vec())).unwrap();
        received.fetch_add(n as u32, Ordering::Relaxed);
        // The peer may still be sending to us; keep our own frames moving too.
        d.flush().unwrap();
    }
}

fn xdp_attached(ifname: &str) -> bool {
    xroce::netdev::query(ifname)
        .expect("query the interface")
        .xdp
        .is_some()
}

/// Not a test by itself: the body of the child processes the tests above start.
#[test]
fn helper() {
    let Ok(role) = std::env::var("XROCE_DRIVER_HELPER") else {
        return;
    };
    let out = std::io::stdout();
    let say = |s: String| {
        let mut o = out.lock();
        writeln!(o, "{s}").unwrap();
        o.flush().unwrap();
    };
    let shards: u32 = env("SHARDS").parse().unwrap();
    match role.as_str() {
        "shards-open" => match XdpDriver::open_shards(&config_from_env(), shards) {
            Ok(drivers) => {
                let queues: Vec<Vec<u32>> = drivers.iter().map(|d| d.queues()).collect();
                let tx: Vec<u32> = drivers.iter().map(|d| d.tx_queue()).collect();
                say(format!("OPEN-OK {} {queues:?} tx={tx:?}", drivers.len()));
            }
            Err(e) => say(format!("OPEN-ERR {e:?}: {e}")),
        },
        "shards-peer" => {
            let ifname = env("IFNAME");
            let peer = PeerEnv {
                side: env("SIDE").as_bytes()[0],
                local_ip: env("LOCAL_IP").parse().unwrap(),
                peer_ip: env("PEER_IP").parse().unwrap(),
                local_mac: mac_of(&env("LOCAL_MAC")),
                peer_mac: mac_of(&env("PEER_MAC")),
            };
            let peer_side = if peer.side == b'a' { b'b' } else { b'a' };
            let peer_shards: u32 = env("PEER_SHARDS").parse().unwrap();
            let count: u32 = env("COUNT").parse().unwrap();
            let mut drivers = match XdpDriver::open_shards(&config_from_env(), shards) {
                Ok(d) => d,
                Err(e) => return say(format!("ERROR {e:?}: {e}")),
            };
            say(format!("READY shards={}", drivers.len()));
            for d in &drivers {
                assert_eq!(d.shards(), shards);
                say(format!(
                    "SHARD shard={} queues={:?} tx={} attach={:?} note={:?}",
                    d.shard(),
                    d.queues(),
                    d.tx_queue(),
                    d.info().xdp_attach,
                    d.info().note
                ));
            }
            let go = PathBuf::from(env("GO"));
            let wait_until = Instant::now() + Duration::from_secs(60);
            while !go.exists() {
                assert!(Instant::now() < wait_until, "no go within 60 s");
                std::thread::sleep(Duration::from_millis(10));
            }
            let deadline =
                Instant::now() + Duration::from_millis(env("TIMEOUT_MS").parse().unwrap());
            let linger = Duration::from_millis(env("LINGER_MS").parse().unwrap());
            // Each shard on a thread of its own, as engine shards run.
            let received = AtomicU32::new(0);
            let expect = peer_shards * count;
            let received: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
                let threads: Vec<_> = drivers
                    .iter_mut()
                    .map(|d| {
                        let (peer, received) = (&peer, &received);
                        s.spawn(move || {
                            run_shard(d, peer, count, received, expect, deadline, linger)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join().unwrap()).collect()
            });
            for (shard, frames) in received.iter().enumerate() {
                let mut seqs: BTreeMap<u32, std::collections::BTreeSet<u32>> = BTreeMap::new();
                let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
                let mut foreign = 0;
                for f in frames {
                    match mark_of(f) {
                        Some((side, from, seq)) if side == peer_side => {
                            *counts.entry(from).or_default() += 1;
                            seqs.entry(from).or_default().insert(seq);
                        }
                        _ => foreign += 1,
                    }
                }
                for from in 0..peer_shards {
                    say(format!(
                        "RECEIVED shard={shard} from={from} frames={} distinct={}",
                        counts.get(&from).copied().unwrap_or(0),
                        seqs.get(&from).map_or(0, |s| s.len())
                    ));
                }
                if foreign > 0 {
                    say(format!("FOREIGN shard={shard} frames={foreign}"));
                }
            }
            for d in &drivers {
                let s = d.xdp_stats().unwrap();
                say(format!(
                    "STATS shard={} redirected={} no_socket={} sock_rx_dropped={}",
                    d.shard(),
                    s.redirected,
                    s.no_socket,
                    s.sock_rx_dropped
                ));
            }
            let last = drivers.pop().expect("at least one shard");
            drop(drivers);
            if shards > 1 {
                say(format!("PARTIAL-DROP xdp={}", xdp_attached(&ifname)));
            }
            drop(last);
            say(format!("DROPPED xdp={}", xdp_attached(&ifname)));
            say("DONE".into());
        }
        other => panic!("unknown helper role {other}"),
    }
}
