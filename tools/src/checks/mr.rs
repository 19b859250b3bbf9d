//! `xroce mr-check`: RDMA READ and WRITE checked byte for byte against a peer's registered
//! buffer. It speaks the exchange of the lab's `lab-mr.py` (pyverbs, in the guest image), so
//! either side can be xroce or rxe:
//!
//! ```text
//! client                                              server (exposes an N-byte MR, random)
//!   | --- TCP: {qpn, psn, gid, addr, rkey, len} ------->  |
//!   | <-- TCP: {qpn, psn, gid, addr, rkey, len, sha256} - |  both move their RC QPs to RTS
//!   | == RDMA READ the whole MR (chunks) ==============>  |  client: SHA-256 must equal sha256
//!   | == RDMA WRITE N fresh random bytes ===============>  |
//!   | --- TCP: {"op": "written"} ----------------------->  |
//!   | <-- TCP: {"sha256": digest of the MR now} --------- |  must equal the digest written
//!   | == RDMA READ the MR back =========================>  |  byte-for-byte equal to the WRITE
//!   | --- TCP: {"op": "done"} -------------------------->  |
//! ```
//!
//! The server never posts a work request: its part of the check is that its memory, as its
//! own CPU reads it, holds what the client's WRITE carried (the digest it reports), and that
//! its responder READ out what the memory holds.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::endpoint::{ConnectParams, RemoteInfo, ToolEndpoint, ToolWr, WrOp};
use crate::json_line::{gid_from_hex, gid_hex, hex, recv_json, send_json};

/// Longest `--stall-timeout`: the server waits ten times that for the client's next line.
pub const MAX_STALL_TIMEOUT_SECS: u64 = 3600;

/// The check's parameters (both sides).
#[derive(Debug, Clone)]
pub struct MrCheckOptions {
    /// Bytes of the MR that is read and written.
    pub size: usize,
    /// Bytes per work request (lab-mr.py: 1 MiB).
    pub chunk: usize,
    /// Work requests in flight at once.
    pub depth: usize,
    /// Path MTU in bytes; both sides must agree (rxe drops packets above its own).
    pub mtu: u32,
    /// Give up when nothing completes (or the peer says nothing) for this long.
    pub stall_timeout: Duration,
}

impl Default for MrCheckOptions {
    fn default() -> Self {
        MrCheckOptions {
            size: 4 << 20,
            chunk: 1 << 20,
            depth: 4,
            mtu: 1024,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

impl MrCheckOptions {
    /// Rejects sizes that cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        use crate::options::in_range;
        let max = xroce::verbs::attr::limits::MAX_MR_SIZE as usize;
        in_range(
            "--size",
            self.size,
            1,
            max,
            "bytes: one memory region, at most 1 GiB",
        )?;
        in_range(
            "--chunk",
            self.chunk,
            1,
            max,
            "bytes per work request, at most 1 GiB",
        )?;
        in_range("--depth", self.depth, 1, 64, "work requests in flight")?;
        if self.stall_timeout.is_zero() || self.stall_timeout.as_secs() > MAX_STALL_TIMEOUT_SECS {
            anyhow::bail!(
                "--stall-timeout {}: must be between 1 and {MAX_STALL_TIMEOUT_SECS} seconds",
                self.stall_timeout.as_secs()
            );
        }
        Ok(())
    }
}

/// Either side's hello line (the server adds the digest of its MR).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Hello {
    qpn: u32,
    psn: u32,
    gid: String,
    addr: u64,
    rkey: u32,
    len: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct OpLine {
    op: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct DigestLine {
    sha256: String,
}

/// What the client measured; every check passed when this is returned.
#[derive(Debug, Clone)]
pub struct ClientOutcome {
    /// Bytes in each phase.
    pub size: usize,
    /// Time of the first READ, the WRITE and the READ back.
    pub read: Duration,
    /// See `read`.
    pub write: Duration,
    /// See `read`.
    pub read_back: Duration,
}

/// What the server saw.
#[derive(Debug, Clone)]
pub struct ServerOutcome {
    /// Bytes exposed.
    pub size: usize,
    /// Digest of the MR before the client touched it.
    pub initial_sha256: String,
    /// Digest reported after each "written" (normally one).
    pub written_sha256: Vec<String>,
}

fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn rc_params(psn: u32, mtu: u32) -> ConnectParams {
    // lab-mr.py's attributes: timeout 14, retry 7, RNR retry 7, one READ in flight each way.
    let mut p = ConnectParams::rc_pingpong(psn, mtu, 0);
    p.max_rd_atomic = 1;
    p.hop_limit = 64;
    p
}

fn hello_of(ep: &dyn ToolEndpoint, psn: u32, size: usize, sha256: Option<String>) -> Hello {
    let local = ep.local();
    Hello {
        qpn: local.qpn,
        psn,
        gid: gid_hex(&local.gid),
        addr: local.buf_addr,
        rkey: local.rkey,
        len: size as u64,
        sha256,
    }
}

fn remote_of(hello: &Hello) -> anyhow::Result<RemoteInfo> {
    if hello.qpn == 0 || hello.qpn > 0xFF_FFFF {
        anyhow::bail!("peer QPN {:#x} is not a valid RC QP number", hello.qpn);
    }
    Ok(RemoteInfo {
        qpn: hello.qpn,
        psn: hello.psn & 0xFF_FFFF,
        gid: gid_from_hex(&hello.gid)?,
    })
}

fn check_buffer(ep: &dyn ToolEndpoint, size: usize) -> anyhow::Result<()> {
    let have = ep.local().buf_len;
    if have < size {
        anyhow::bail!("registered buffer of {have} bytes is smaller than --size {size}");
    }
    Ok(())
}

/// The message for a peer whose MR size differs from our --size.
fn size_mismatch(peer: &str, theirs: u64, ours: usize) -> String {
    let (theirs_did, ours_did) = if peer == "server" {
        ("registered", "we asked for")
    } else {
        ("asked for", "we registered")
    };
    format!(
        "the {peer} {theirs_did} {theirs} bytes, {ours_did} {ours}: use the same --size on both sides"
    )
}

fn read_all(ep: &dyn ToolEndpoint, size: usize) -> anyhow::Result<Vec<u8>> {
    let mut out = vec![0u8; size];
    ep.read_local(0, &mut out)?;
    Ok(out)
}

/// READs or WRITEs the first `opts.size` bytes of the peer's MR from/to the local buffer,
/// `opts.chunk` bytes per work request, `opts.depth` in flight, every one signalled.
fn transfer(
    ep: &mut dyn ToolEndpoint,
    peer: &Hello,
    opts: &MrCheckOptions,
    write: bool,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let chunks = opts.size.div_ceil(opts.chunk);
    let (mut posted, mut done) = (0usize, 0usize);
    let mut wcs = Vec::with_capacity(opts.depth);
    let mut last_progress = Instant::now();
    let what = if write { "WRITE" } else { "READ" };
    while done < chunks {
        while posted < chunks && posted - done < opts.depth {
            let offset = posted * opts.chunk;
            let len = opts.chunk.min(opts.size - offset);
            // The peer's VA is opaque (any u64 is valid); its responder's R_Key and
            // bounds check decides (IBTA 9.7.4.1.5), so wrap rather than overflow.
            let remote_addr = peer.addr.wrapping_add(offset as u64);
            let op = if write {
                WrOp::Write {
                    remote_addr,
                    rkey: peer.rkey,
                }
            } else {
                WrOp::Read {
                    remote_addr,
                    rkey: peer.rkey,
                }
            };
            ep.post_send(&ToolWr {
                wr_id: posted as u64,
                op,
                offset,
                len,
                signaled: true,
            })?;
            posted += 1;
        }
        wcs.clear();
        if ep.poll(&mut wcs, opts.depth)? == 0 {
            if last_progress.elapsed() > opts.stall_timeout {
                anyhow::bail!(
                    "RDMA {what}: no completion for {:?} after {done} of {chunks} chunks: the peer stopped answering",
                    opts.stall_timeout
                );
            }
            ep.wait_completion(Duration::from_millis(10))?;
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs {
            if let Some(status) = wc.failed() {
                anyhow::bail!(
                    "RDMA {what} of the chunk at offset {} failed with {status:?}",
                    wc.wr_id as usize * opts.chunk
                );
            }
            done += 1;
        }
    }
    Ok(start.elapsed())
}

/// The client: READ, WRITE `fresh` (exactly `opts.size` bytes), READ back, checking each.
pub fn client<S: Read + Write>(
    ep: &mut dyn ToolEndpoint,
    stream: &mut S,
    opts: &MrCheckOptions,
    psn: u32,
    fresh: &[u8],
) -> anyhow::Result<ClientOutcome> {
    opts.validate()?;
    check_buffer(ep, opts.size)?;
    if fresh.len() != opts.size {
        anyhow::bail!(
            "the data to WRITE has {} bytes, not {}",
            fresh.len(),
            opts.size
        );
    }
    send_json(stream, &hello_of(ep, psn, opts.size, None))?;
    let peer: Hello = recv_json(stream, "server hello")?;
    // A larger MR would fail the digest check and read like corruption: say what it is.
    if peer.len != opts.size as u64 {
        anyhow::bail!("{}", size_mismatch("server", peer.len, opts.size));
    }
    let Some(server_sha) = peer.sha256.clone() else {
        anyhow::bail!("server hello has no sha256: the peer is not an mr-check/lab-mr server");
    };
    ep.connect(&remote_of(&peer)?, &rc_params(psn, opts.mtu))?;

    // 1. READ the server's MR; its digest must be the one the server announced.
    let read = transfer(ep, &peer, opts, false)?;
    if sha256_hex(&read_all(ep, opts.size)?) != server_sha {
        anyhow::bail!("READ returned different bytes than the server's MR holds (SHA-256 differs)");
    }
    // 2. WRITE fresh bytes; the server's own digest of its memory must match them.
    ep.write_local(0, fresh)?;
    let write = transfer(ep, &peer, opts, true)?;
    send_json(
        stream,
        &OpLine {
            op: "written".into(),
        },
    )?;
    let after: DigestLine = recv_json(stream, "digest after the WRITE")?;
    if after.sha256 != sha256_hex(fresh) {
        anyhow::bail!("after the WRITE the server's MR differs from what was written (SHA-256)");
    }
    // 3. Clear the local buffer and READ the MR back: byte for byte what was written.
    ep.write_local(0, &vec![0u8; opts.size])?;
    let read_back = transfer(ep, &peer, opts, false)?;
    let back = read_all(ep, opts.size)?;
    if let Some(first) = back.iter().zip(fresh).position(|(a, b)| a != b) {
        anyhow::bail!(
            "READ back differs from the WRITE, first at byte {first} (read {:#04x}, wrote {:#04x})",
            back[first],
            fresh[first]
        );
    }
    send_json(stream, &OpLine { op: "done".into() })?;
    Ok(ClientOutcome {
        size: opts.size,
        read,
        write,
        read_back,
    })
}

/// The server: expose `initial` (exactly `opts.size` bytes) and answer the client's lines
/// until it says "done".
pub fn server<S: Read + Write>(
    ep: &mut dyn ToolEndpoint,
    stream: &mut S,
    opts: &MrCheckOptions,
    psn: u32,
    initial: &[u8],
) -> anyhow::Result<ServerOutcome> {
    opts.validate()?;
    check_buffer(ep, opts.size)?;
    if initial.len() != opts.size {
        anyhow::bail!(
            "the initial content has {} bytes, not {}",
            initial.len(),
            opts.size
        );
    }
    ep.write_local(0, initial)?;
    let initial_sha256 = sha256_hex(initial);
    let peer: Hello = recv_json(stream, "client hello")?;
    let same_size = peer.len == opts.size as u64;
    if same_size {
        ep.connect(&remote_of(&peer)?, &rc_params(psn, opts.mtu))?;
    }
    // Sent either way, so the client can tell its user about a different --size too.
    send_json(
        stream,
        &hello_of(ep, psn, opts.size, Some(initial_sha256.clone())),
    )?;
    if !same_size {
        anyhow::bail!("{}", size_mismatch("client", peer.len, opts.size));
    }
    let mut written_sha256 = Vec::new();
    loop {
        let line: OpLine = recv_json(stream, "client request")?;
        match line.op.as_str() {
            "written" => {
                let digest = sha256_hex(&read_all(ep, opts.size)?);
                send_json(
                    stream,
                    &DigestLine {
                        sha256: digest.clone(),
                    },
                )?;
                written_sha256.push(digest);
            }
            "done" => {
                return Ok(ServerOutcome {
                    size: opts.size,
                    initial_sha256,
                    written_sha256,
                })
            }
            other => anyhow::bail!("client sent an unknown request {other:?}"),
        }
    }
}
