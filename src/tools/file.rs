//! File transfer over RDMA WRITE: the logic behind `xroce file send|recv` and the
//! `file_transfer` example.
//!
//! ```text
//! sender                                          receiver
//!   | <-- TCP: {qpn, psn, gid, addr, rkey, chunk, slots} --|  (receiver registers slots x chunk bytes)
//!   | --- TCP: {qpn, psn, gid, name, len} --------------->  |  both connect their RC QPs
//!   | == RDMA WRITE chunk k into slot k % slots ========>   |
//!   | == RDMA WRITE_WITH_IMM (0 bytes, imm = k) ========>   |  completion: chunk k is in place
//!   | <== SEND credit (4 bytes) =========================   |  after writing the slot to disk
//!   |    ... at most `slots` chunks without credit ...      |
//!   | --- TCP: {sha256} --------------------------------->  |  receiver compares its own SHA-256
//!   | <-- TCP: {ok, sha256} ------------------------------  |
//! ```
//!
//! RC delivers in order, so when the WRITE_WITH_IMM completes at the receiver, the WRITE
//! before it has been placed (IBTA 9.5 ordering rules). The credit SEND flows back on the
//! same QP, so the sender never overwrites a slot the receiver has not saved.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::tools::endpoint::{ConnectParams, RemoteInfo, ToolEndpoint, ToolOp, ToolWr, WcKind};
use crate::tools::json_line::{gid_from_hex, gid_hex, hex, recv_json, send_json};

/// Transfer parameters.
#[derive(Debug, Clone)]
pub struct FileOptions {
    /// Bytes per chunk (one WRITE).
    pub chunk_size: usize,
    /// Receiver slots (chunks in flight).
    pub slots: usize,
    /// Path MTU in bytes.
    pub mtu: u32,
    /// Give up when nothing completes for this long.
    pub stall_timeout: Duration,
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions {
            chunk_size: 1 << 20,
            slots: 8,
            mtu: 1024,
            stall_timeout: Duration::from_secs(30),
        }
    }
}

impl FileOptions {
    /// Buffer the receiver registers.
    pub fn receiver_buffer_len(&self) -> usize {
        self.chunk_size * self.slots
    }
    /// Buffer the sender registers (staging slots + a credit landing area).
    pub fn sender_buffer_len(&self) -> usize {
        self.chunk_size * self.slots + CREDIT_LEN
    }
    /// Rejects sizes that cannot work.
    pub fn validate(&self) -> anyhow::Result<()> {
        use crate::tools::options::in_range;
        in_range(
            "--chunk",
            self.chunk_size,
            1,
            64 << 20,
            "bytes, at most 64 MiB",
        )?;
        in_range("--slots", self.slots, 1, 1024, "")?;
        // Both buffers are one memory region each (the sender's has the credit word too).
        let max = crate::verbs::attr::limits::MAX_MR_SIZE as usize - CREDIT_LEN;
        let total = self.chunk_size.saturating_mul(self.slots);
        if total > max {
            anyhow::bail!(
                "--chunk {} x --slots {} = {total} bytes: the transfer buffer is one memory region of at most {max} bytes (1 GiB); lower --chunk or --slots",
                self.chunk_size,
                self.slots
            );
        }
        Ok(())
    }
}

const CREDIT_LEN: usize = 4;
const WR_DATA: u64 = 1;
const WR_SIGNAL: u64 = 2;
const WR_CREDIT: u64 = 3;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct ReceiverHello {
    qpn: u32,
    psn: u32,
    gid: String,
    addr: u64,
    rkey: u32,
    chunk_size: usize,
    slots: usize,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SenderHello {
    qpn: u32,
    psn: u32,
    gid: String,
    name: String,
    len: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Finish {
    sha256: String,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Verdict {
    ok: bool,
    sha256: String,
}

/// What a transfer did.
#[derive(Debug, Clone)]
pub struct TransferOutcome {
    /// File name as the sender gave it.
    pub name: String,
    /// Bytes moved.
    pub bytes: u64,
    /// SHA-256 (hex) this side computed.
    pub sha256: String,
    /// True when both SHA-256 agree.
    pub verified: bool,
    /// Wall time of the RDMA phase.
    pub elapsed: Duration,
}

impl TransferOutcome {
    /// Throughput in MB/s (10^6 bytes).
    pub fn megabytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e6
    }
}

fn rc_params(psn: u32, mtu: u32) -> ConnectParams {
    let mut p = ConnectParams::rc_pingpong(psn, mtu, 0);
    p.max_rd_atomic = 1;
    p.hop_limit = 64;
    p
}

/// Sends `reader` (of `len` bytes, called `name`) to a receiver on `stream`.
/// `progress(bytes_done)` is called as chunks are acknowledged.
#[allow(clippy::too_many_arguments)]
pub fn send<S: Read + Write, R: Read>(
    ep: &mut dyn ToolEndpoint,
    stream: &mut S,
    reader: &mut R,
    name: &str,
    len: u64,
    opts: &FileOptions,
    psn: u32,
    progress: &mut dyn FnMut(u64),
) -> anyhow::Result<TransferOutcome> {
    let local = ep.local();
    let hello: ReceiverHello = recv_json(stream, "receiver address")?;
    send_json(
        stream,
        &SenderHello {
            qpn: local.qpn,
            psn,
            gid: gid_hex(&local.gid),
            name: name.to_string(),
            len,
        },
    )?;
    let remote = RemoteInfo {
        qpn: hello.qpn,
        psn: hello.psn,
        gid: gid_from_hex(&hello.gid)?,
    };
    ep.connect(&remote, &rc_params(psn, opts.mtu))?;
    let (chunk, slots) = (hello.chunk_size, hello.slots);
    if chunk == 0 || slots == 0 || chunk * slots + CREDIT_LEN > local.buf_len {
        anyhow::bail!("receiver asks for {slots} slots of {chunk} bytes, more than our buffer of {} bytes: use the same --chunk/--slots on both sides", local.buf_len);
    }
    let credit_at = chunk * slots;
    for _ in 0..slots {
        ep.post_recv(WR_CREDIT, credit_at, CREDIT_LEN)?;
    }
    let start = Instant::now();
    let mut sha = Sha256::new();
    let mut sent = 0u64;
    let mut acked = 0u64;
    let mut in_flight = 0usize;
    let total_chunks = len.div_ceil(chunk as u64);
    let mut buf = vec![0u8; chunk];
    let mut wcs = Vec::with_capacity(8);
    let mut last_progress = Instant::now();
    let mut k = 0u64;
    while acked < total_chunks {
        while k < total_chunks && in_flight < slots {
            let this = (len - sent).min(chunk as u64) as usize;
            reader.read_exact(&mut buf[..this])?;
            sha.update(&buf[..this]);
            let slot = (k % slots as u64) as usize;
            ep.write_local(slot * chunk, &buf[..this])?;
            let remote_addr = hello.addr + (slot * chunk) as u64;
            ep.post_send(&ToolWr {
                wr_id: WR_DATA,
                op: ToolOp::Write {
                    remote_addr,
                    rkey: hello.rkey,
                    imm: None,
                },
                offset: slot * chunk,
                len: this,
                signaled: false,
            })?;
            ep.post_send(&ToolWr {
                wr_id: WR_SIGNAL,
                op: ToolOp::Write {
                    remote_addr,
                    rkey: hello.rkey,
                    imm: Some(k as u32),
                },
                offset: slot * chunk,
                len: 0,
                signaled: true,
            })?;
            sent += this as u64;
            in_flight += 1;
            k += 1;
        }
        wcs.clear();
        if ep.poll(&mut wcs, 8)? == 0 {
            if last_progress.elapsed() > opts.stall_timeout {
                anyhow::bail!(
                    "receiver stopped acknowledging after {acked} of {total_chunks} chunks"
                );
            }
            std::hint::spin_loop();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs {
            if let Err(status) = &wc.status {
                anyhow::bail!(
                    "RDMA {:?} failed with {status}: the receiver went away or rejected the write",
                    wc.kind
                );
            }
            if wc.kind == WcKind::Recv {
                acked += 1;
                in_flight -= 1;
                ep.post_recv(WR_CREDIT, credit_at, CREDIT_LEN)?;
                progress((acked * chunk as u64).min(len));
            }
        }
    }
    let elapsed = start.elapsed();
    let digest = hex(&sha.finalize());
    send_json(
        stream,
        &Finish {
            sha256: digest.clone(),
        },
    )?;
    let verdict: Verdict = recv_json(stream, "verdict")?;
    let verified = verdict.ok && verdict.sha256 == digest;
    Ok(TransferOutcome {
        name: name.to_string(),
        bytes: len,
        sha256: digest,
        verified,
        elapsed,
    })
}

/// Receives one file from a sender on `stream` into `writer`. `progress(bytes_done)` is
/// called per chunk. The outcome says whether the SHA-256 matched; the caller decides what
/// to do with a mismatching file.
pub fn recv<S: Read + Write, W: Write>(
    ep: &mut dyn ToolEndpoint,
    stream: &mut S,
    writer: &mut W,
    opts: &FileOptions,
    psn: u32,
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<TransferOutcome> {
    opts.validate()?;
    let local = ep.local();
    if local.buf_len < opts.receiver_buffer_len() {
        anyhow::bail!(
            "receive buffer of {} bytes is smaller than {} slots x {} bytes",
            local.buf_len,
            opts.slots,
            opts.chunk_size
        );
    }
    for _ in 0..opts.slots {
        ep.post_recv(WR_SIGNAL, 0, 0)?;
    }
    send_json(
        stream,
        &ReceiverHello {
            qpn: local.qpn,
            psn,
            gid: gid_hex(&local.gid),
            addr: local.buf_addr,
            rkey: local.rkey,
            chunk_size: opts.chunk_size,
            slots: opts.slots,
        },
    )?;
    let hello: SenderHello = recv_json(stream, "sender address")?;
    let remote = RemoteInfo {
        qpn: hello.qpn,
        psn: hello.psn,
        gid: gid_from_hex(&hello.gid)?,
    };
    ep.connect(&remote, &rc_params(psn, opts.mtu))?;
    let chunk = opts.chunk_size;
    let total_chunks = hello.len.div_ceil(chunk as u64);
    let start = Instant::now();
    let mut sha = Sha256::new();
    let mut next = 0u64;
    let mut done = 0u64;
    let mut buf = vec![0u8; chunk];
    let mut wcs = Vec::with_capacity(8);
    let mut last_progress = Instant::now();
    // The credit SEND carries 4 bytes from the slot just saved; its content is not used.
    while next < total_chunks {
        wcs.clear();
        if ep.poll(&mut wcs, 8)? == 0 {
            if last_progress.elapsed() > opts.stall_timeout {
                anyhow::bail!("sender stopped after {next} of {total_chunks} chunks");
            }
            std::hint::spin_loop();
            continue;
        }
        last_progress = Instant::now();
        for wc in &wcs {
            if let Err(status) = &wc.status {
                anyhow::bail!("RDMA {:?} failed with {status}", wc.kind);
            }
            if wc.kind != WcKind::RecvRdmaWithImm {
                continue;
            }
            let k = u64::from(wc.imm.unwrap_or(u32::MAX));
            if k != next & 0xFFFF_FFFF {
                anyhow::bail!("chunk {k} signalled while expecting {next}: the sender is not an xroce file sender");
            }
            let slot = (next % opts.slots as u64) as usize;
            let this = (hello.len - done).min(chunk as u64) as usize;
            ep.read_local(slot * chunk, &mut buf[..this])?;
            writer.write_all(&buf[..this])?;
            sha.update(&buf[..this]);
            done += this as u64;
            next += 1;
            progress(done, hello.len);
            ep.post_recv(WR_SIGNAL, 0, 0)?;
            ep.post_send(&ToolWr {
                wr_id: WR_CREDIT,
                op: ToolOp::Send { imm: None },
                offset: slot * chunk,
                len: CREDIT_LEN.min(chunk),
                signaled: true,
            })?;
        }
    }
    writer.flush()?;
    let elapsed = start.elapsed();
    let digest = hex(&sha.finalize());
    let finish: Finish = recv_json(stream, "final SHA-256")?;
    let ok = finish.sha256 == digest;
    send_json(
        stream,
        &Verdict {
            ok,
            sha256: digest.clone(),
        },
    )?;
    // Reap the last credit completions so the QP is idle before it is destroyed.
    let until = Instant::now() + Duration::from_millis(200);
    while Instant::now() < until {
        wcs.clear();
        if ep.poll(&mut wcs, 8)? == 0 {
            break;
        }
    }
    Ok(TransferOutcome {
        name: hello.name,
        bytes: done,
        sha256: digest,
        verified: ok,
        elapsed,
    })
}
