//! Does independent work scale when the engine is sharded? Device A runs one RC connection
//! per thread (each thread owns its QP, CQ and memory, as the verbs guides advise), its peer
//! on the other side is a private engine per thread. Three layouts of A, measured side by side
//! in one run for 64-byte SENDs:
//! - `1 thread`: one connection, A one engine behind a mutex (the baseline);
//! - `2 threads, 1 engine`: two connections on one engine behind one mutex (xroce before
//!   engine shards: every thread takes the same lock);
//! - `2 threads, 2 shards`: `Engine::new_shards(.., 2)`, each connection's QP on its own
//!   shard behind its own mutex (shared PDs, MRs and CQ tables);
//! - the same with 4 threads (on a 2-core machine: more threads than cores).
//!
//! No driver and no network: this measures the engine and its locks only, so two threads
//! can use both cores of this machine (a run over AF_XDP needs a peer on the same cores).
//! Run: `cargo bench --bench engine_shards` (add `-- --secs N` for longer windows).
use std::net::IpAddr;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant as WallClock};

use xroce::engine::*;
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};

const BATCH: u64 = 64;

/// One connection: A's QP on `engine` (shared or a shard), the peer engine private.
struct Connection {
    engine: Arc<Mutex<Engine>>,
    qa: u32,
    cq_a: CqId,
    mr_a: MrInfo,
    peer: Engine,
    qb: u32,
    cq_b: CqId,
    mr_b: MrInfo,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 1024,
        max_recv_wr: 1024,
        ..QpCaps::default()
    }
}

fn connection(engine: Arc<Mutex<Engine>>, pd_a: PdId) -> Connection {
    let cfg = WorkloadConfig::default();
    let mut peer = Engine::new(EngineConfig::new(MAC_B, IpAddr::V4(IP_B)));
    let pd_b = peer.alloc_pd();
    let cq_b = peer.create_cq(4096).unwrap();
    let mr_b = peer.reg_mr(pd_b, 4096, Access::ALL).unwrap();
    let init = |pd, cq| QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        caps: caps(),
        sq_sig_all: false,
        srq: None,
    };
    let qb = peer.create_qp(init(pd_b, cq_b)).unwrap();
    let (qa, cq_a, mr_a) = {
        let mut a = engine.lock().unwrap();
        let cq_a = a.create_cq(4096).unwrap();
        let mr_a = a.reg_mr(pd_a, 4096, Access::ALL).unwrap();
        let qa = a.create_qp(init(pd_a, cq_a)).unwrap();
        connect(&mut a, qa, qb, MAC_B, IP_B, 1, 9, &cfg).unwrap();
        (qa, cq_a, mr_a)
    };
    connect(&mut peer, qb, qa, MAC_A, IP_A, 9, 1, &cfg).unwrap();
    Connection {
        engine,
        qa,
        cq_a,
        mr_a,
        peer,
        qb,
        cq_b,
        mr_b,
    }
}

/// Runs batches of SENDs A → peer until `until`; returns the messages completed.
fn drive(c: &mut Connection, until: WallClock) -> u64 {
    let now = Instant::ZERO;
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut wcs = vec![Wc::EMPTY; 256];
    let sge_a = [Sge {
        addr: c.mr_a.addr,
        length: 64,
        lkey: c.mr_a.lkey,
    }];
    let sge_b = [Sge {
        addr: c.mr_b.addr,
        length: 4096,
        lkey: c.mr_b.lkey,
    }];
    let mut done = 0;
    while WallClock::now() < until {
        for i in 0..BATCH {
            c.peer.post_recv_sges(c.qb, i, &sge_b).unwrap();
        }
        // A posts and transmits under its lock.
        let mut spare: Vec<Vec<u8>> = Vec::new();
        {
            let mut a = c.engine.lock().unwrap();
            for i in 0..BATCH {
                let flags = if i % 16 == 15 {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::default()
                };
                let wr = SendWrRef {
                    wr_id: i,
                    op: WrOp::Send,
                    sg_list: &sge_a,
                    flags,
                    ud: None,
                };
                a.post_send_ref(c.qa, &wr).unwrap();
            }
            while let Some(n) = a.poll_transmit(now, &mut buf) {
                let mut f = spare.pop().unwrap_or_default();
                f.clear();
                f.extend_from_slice(&buf[..n]);
                frames.push(f);
            }
        }
        loop {
            // The peer, outside A's lock.
            for f in frames.drain(..) {
                c.peer.handle_frame(now, &f);
                spare.push(f);
            }
            while let Some(n) = c.peer.poll_transmit(now, &mut buf) {
                let mut f = spare.pop().unwrap_or_default();
                f.clear();
                f.extend_from_slice(&buf[..n]);
                frames.push(f);
            }
            while c.peer.poll_cq(c.cq_b, &mut wcs).unwrap() > 0 {}
            if frames.is_empty() {
                break;
            }
            // A takes the ACKs and its completions under its lock.
            let mut a = c.engine.lock().unwrap();
            for f in frames.drain(..) {
                a.handle_frame(now, &f);
                spare.push(f);
            }
            while let Some(n) = a.poll_transmit(now, &mut buf) {
                let mut f = spare.pop().unwrap_or_default();
                f.clear();
                f.extend_from_slice(&buf[..n]);
                frames.push(f);
            }
            while a.poll_cq(c.cq_a, &mut wcs).unwrap() > 0 {}
        }
        done += BATCH;
    }
    done
}

/// Messages per second over `threads` connections whose A side is `engines[i % len]`.
fn measure(engines: &[Arc<Mutex<Engine>>], threads: usize, window: Duration) -> f64 {
    let pd = engines[0].lock().unwrap().alloc_pd();
    let conns: Vec<Connection> = (0..threads)
        .map(|i| connection(engines[i % engines.len()].clone(), pd))
        .collect();
    let start = Arc::new(Barrier::new(threads));
    let began = WallClock::now();
    let handles: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                let until = WallClock::now() + window;
                drive(&mut c, until)
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    total as f64 / began.elapsed().as_secs_f64()
}

fn engines(shards: u32) -> Vec<Arc<Mutex<Engine>>> {
    Engine::new_shards(EngineConfig::new(MAC_A, IpAddr::V4(IP_A)), shards)
        .into_iter()
        .map(|e| Arc::new(Mutex::new(e)))
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; `--secs N` sets the window.
    let args: Vec<String> = std::env::args().collect();
    let secs = args
        .iter()
        .position(|a| a == "--secs")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let window = Duration::from_secs_f64(secs);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("engine shards, 64-byte SENDs, {secs} s per layout, {cores} cores");
    let layouts = [
        ("1 thread", 1, 1),
        ("2 threads, 1 engine", 2, 1),
        ("2 threads, 2 shards", 2, 2),
        ("4 threads, 1 engine", 4, 1),
        ("4 threads, 4 shards", 4, 4),
    ];
    let rates: Vec<f64> = layouts
        .iter()
        .map(|&(_, threads, shards)| measure(&engines(shards), threads, window))
        .collect();
    println!("{:<24} {:>12} {:>10}", "layout", "msg/s", "vs 1");
    for ((name, _, _), rate) in layouts.iter().zip(&rates) {
        println!("{name:<24} {:>12.0} {:>9.2}x", rate, rate / rates[0]);
    }
}
