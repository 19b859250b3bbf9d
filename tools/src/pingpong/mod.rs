//! `ibv_rc_pingpong` / `ibv_ud_pingpong` over a [`ToolEndpoint`]: the same exchange, the
//! same ping-pong discipline and the same output lines as rdma-core's examples.
//!
//! The discipline (rdma-core `parse_single_wc`): both sides pre-post `rx_depth` receives;
//! the client sends first. Each side keeps a `pending` set {RECV, SEND}; when both its last
//! send and the awaited receive completed, it sends again, until `iters` sends and
//! receives are done. Receives are re-posted when at most one is left.

pub mod oob;
pub mod srq;

use std::io::Write;
use std::time::{Duration, Instant};

use crate::endpoint::{ConnectParams, RemoteInfo, ToolEndpoint, ToolWr, WcKind, WrOp};
use crate::pingpong::oob::{PingpongDest, UD_GRH_LEN, UD_QKEY};
use crate::setup::OobStream;
use crate::setup::Role;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// How long an RC side keeps its QPs after its last completion, so that the peer's last
/// message still gets its ACK when the one that completed it here was lost: the peer resends
/// it after its ACK timeout (the tools' QPs use timeout 14, 4.096 us x 2^14 = 67 ms, IBTA
/// 9.7.6.1.3) and this covers three such resends. rdma-core's `ibv_*_pingpong` destroy their
/// QPs at once; over a lossy link the peer of one that did can end with RETRY_EXC_ERR. The
/// device's background thread answers the resends meanwhile: nothing polls.
pub const PEER_LINGER: std::time::Duration = std::time::Duration::from_millis(270);

/// Options of both tools (`-s -m -r -n -l -c`, `--ud`).
#[derive(Debug, Clone)]
pub struct PingpongOptions {
    /// Message size (`-s`; rc default 4096, ud 1024).
    pub size: usize,
    /// Exchanges (`-n`, default 1000).
    pub iters: u64,
    /// Receives posted at a time (`-r`, default 500).
    pub rx_depth: u32,
    /// Path MTU in bytes (`-m`, RC only, default 1024).
    pub mtu: u32,
    /// Service level (`-l`).
    pub sl: u8,
    /// Validate the received buffer (`-c`).
    pub validate: bool,
    /// UD instead of RC.
    pub ud: bool,
    /// Sleep on the completion channel instead of busy polling (`-e`).
    pub events: bool,
    /// How long to wait for any single completion before giving up.
    pub stall_timeout: Duration,
}

impl Default for PingpongOptions {
    fn default() -> Self {
        PingpongOptions {
            size: 4096,
            iters: 1000,
            rx_depth: 500,
            mtu: 1024,
            sl: 0,
            validate: false,
            ud: false,
            events: false,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct PingpongOutcome {
    /// Our address.
    pub local: PingpongDest,
    /// The peer's.
    pub remote: PingpongDest,
    /// Elapsed microseconds of the ping-pong loop.
    pub usec: f64,
    /// Pages whose first byte was wrong (`-c`, server side).
    pub invalid_pages: Vec<usize>,
}

/// Buffer bytes an endpoint for these options must register.
pub fn buffer_len(opts: &PingpongOptions) -> usize {
    if opts.ud {
        opts.size + UD_GRH_LEN
    } else {
        opts.size.max(1)
    }
}

/// Runs one side. `open_stream` connects (client) or accepts (server) the TCP stream; it
/// is called after the local address line is printed, as in the C tools. `out` receives
/// the lines they print on stdout.
pub fn run<S: OobStream, F: FnOnce() -> anyhow::Result<S>>(
    ep: &mut dyn ToolEndpoint,
    open_stream: F,
    role: Role,
    opts: &PingpongOptions,
    psn: u32,
    out: &mut dyn Write,
) -> anyhow::Result<PingpongOutcome> {
    let local_info = ep.local();
    if opts.ud && opts.size as u32 > local_info.active_mtu {
        anyhow::bail!(
            "Requested size larger than port MTU ({}): UD messages must fit one packet; use -s {} or less",
            local_info.active_mtu,
            local_info.active_mtu
        );
    }
    let page_size = 4096usize;
    let (send_offset, recv_len) = if opts.ud {
        (UD_GRH_LEN, opts.size + UD_GRH_LEN)
    } else {
        (0, opts.size)
    };
    ep.write_local(0, &vec![0x7b; buffer_len(opts)])?;
    let mut routs = 0u32;
    for _ in 0..opts.rx_depth {
        ep.post_recv(RECV_WRID, 0, recv_len)?;
        routs += 1;
    }
    let mine = PingpongDest {
        lid: 0,
        qpn: local_info.qpn,
        psn: psn & 0xFF_FFFF,
        gid: local_info.gid,
    };
    writeln!(out, "{}", mine.address_line("local address: ", opts.ud))?;
    out.flush()?;
    let mut stream = open_stream()?;
    let stream = &mut stream;
    let params = |remote: &PingpongDest| {
        let mut p = ConnectParams::rc_pingpong(mine.psn, opts.mtu, opts.sl);
        if opts.ud {
            p.hop_limit = 64;
            p.qkey = UD_QKEY;
        }
        (
            RemoteInfo {
                qpn: remote.qpn,
                psn: remote.psn,
                gid: remote.gid,
            },
            p,
        )
    };
    let remote = match role {
        Role::Server => oob::server_exchange(stream, &mine, |remote| {
            let (r, p) = params(remote);
            ep.connect(&r, &p)
        })?,
        Role::Client => oob::client_exchange(stream, &mine)?,
    };
    writeln!(out, "{}", remote.address_line("remote address:", false))?;
    if role == Role::Client {
        let (r, p) = params(&remote);
        ep.connect(&r, &p)?;
    }

    let send_wr = ToolWr {
        wr_id: SEND_WRID,
        op: WrOp::Send,
        offset: send_offset,
        len: opts.size,
        signaled: true,
    };
    let mut pending = RECV_WRID;
    if role == Role::Client {
        if opts.validate {
            // rdma-core writes `i / page_size % sizeof(char)` = 0 at each page start.
            for page in (0..opts.size).step_by(page_size) {
                ep.write_local(send_offset + page, &[0])?;
            }
        }
        ep.post_send(&send_wr)?;
        pending |= SEND_WRID;
    }
    let start = Instant::now();
    let (mut rcnt, mut scnt) = (0u64, 0u64);
    let mut wcs = Vec::with_capacity(2);
    let mut last_progress = Instant::now();
    while rcnt < opts.iters || scnt < opts.iters {
        wcs.clear();
        if ep.poll(&mut wcs, 2)? == 0 {
            if last_progress.elapsed() > opts.stall_timeout {
                anyhow::bail!(
                    "no completion for {:?} after {scnt} sends and {rcnt} receives: the peer stopped or packets are lost (check the peer's output and the link)",
                    opts.stall_timeout
                );
            }
            if opts.events {
                ep.wait_completion(Duration::from_millis(100))?;
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs {
            if let Some(status) = wc.failed() {
                // As ibv_rc_pingpong says it (the lab reads a retry-exceeded end from it).
                anyhow::bail!(
                    "Failed status {} ({}) for wr_id {}",
                    status.as_str(),
                    status.code(),
                    wc.wr_id
                );
            }
            match (wc.wr_id, wc.kind) {
                (SEND_WRID, WcKind::Send) => scnt += 1,
                (RECV_WRID, WcKind::Recv) => {
                    routs -= 1;
                    if routs <= 1 {
                        while routs < opts.rx_depth {
                            ep.post_recv(RECV_WRID, 0, recv_len)?;
                            routs += 1;
                        }
                    }
                    rcnt += 1;
                }
                (id, kind) => anyhow::bail!("Completion for unknown wr_id {id} ({kind:?})"),
            }
            pending &= !wc.wr_id;
            if scnt < opts.iters && pending == 0 {
                ep.post_send(&send_wr)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
    // RC (and UC, harmlessly): the peer may not have our ACK of its last message yet (a lost ACK is answered by a
    // resend, IBTA 9.7.5.1.1 re-ACKs duplicates); keep the QP a moment longer so a peer that
    // retries forever (rxe with retry_cnt 7) is answered instead of left resending.
    if !opts.ud {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    for line in oob::result_lines(opts.size as u64, opts.iters, usec) {
        writeln!(out, "{line}")?;
    }
    let mut invalid_pages = Vec::new();
    if role == Role::Server && opts.validate {
        let recv_data_at = if opts.ud { UD_GRH_LEN } else { 0 };
        for page in (0..opts.size).step_by(page_size) {
            let mut b = [0u8; 1];
            ep.read_local(recv_data_at + page, &mut b)?;
            if b[0] != 0 {
                writeln!(out, "invalid data in page {}", page / page_size)?;
                invalid_pages.push(page / page_size);
            }
        }
    }
    if !opts.ud {
        std::thread::sleep(PEER_LINGER);
    }
    Ok(PingpongOutcome {
        local: mine,
        remote,
        usec,
        invalid_pages,
    })
}
