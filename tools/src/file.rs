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
//!   | --- TCP: {sha256} --------------------------------->  |  receiver compares its own SHA-256,
//!   |                                                       |  then puts the file in place (fsync)
//!   | <-- TCP: {ok, sha256, reason} ----------------------  |  ok: the file is at its final path
//! ```
//!
//! RC delivers in order, so when the WRITE_WITH_IMM completes at the receiver, the WRITE
//! before it has been placed (the IBTA ch. 9 ordering rules). The credit SEND flows back on the
//! same QP, so the sender never overwrites a slot the receiver has not saved.
//!
//! A receiver that fails after the QPs are connected (the destination exists, the disk is
//! full, ...) sends its verdict line with the reason, then a SEND with immediate
//! [`ABORT_IMM`] instead of a credit: the sender, which reads TCP only at the end, learns
//! from that completion to read the verdict now. OK is sent only after [`Sink::commit`]
//! succeeded, so it means the bytes are where the user asked, on disk.

use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::endpoint::{ConnectParams, RemoteInfo, ToolEndpoint, ToolWr, WcKind, WrOp};
use crate::json_line::{gid_from_hex, gid_hex, hex, recv_json, send_json};
use crate::setup::OobStream;

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
        use crate::options::in_range;
        in_range(
            "--chunk",
            self.chunk_size,
            1,
            64 << 20,
            "bytes, at most 64 MiB",
        )?;
        in_range("--slots", self.slots, 1, 1024, "")?;
        // Both buffers are one memory region each (the sender's has the credit word too).
        let max = xroce::verbs::attr::limits::MAX_MR_SIZE as usize - CREDIT_LEN;
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
const WR_ABORT: u64 = 4;
/// Immediate of the receiver's SEND that replaces a credit when it gives up: its verdict
/// line (with the reason) is waiting on the TCP connection.
pub const ABORT_IMM: u32 = 0xAB0F_AB0F;
/// Prefix of the receiver's temporary files (`.xroce-XXXXXX.partial` in the destination
/// directory); one is left behind only when the receiver is killed with SIGKILL.
pub const TEMP_PREFIX: &str = ".xroce-";
const TEMP_SUFFIX: &str = ".partial";

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

/// The receiver's last line. `ok` only when the file is in place; otherwise `reason` says
/// why in the receiver's words (`sha256` is empty when it gave up before the end).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Verdict {
    ok: bool,
    sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
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
/// `progress(bytes_done)` is called as chunks are acknowledged. An error carries the
/// receiver's reason when it refused or could not keep the file.
#[allow(clippy::too_many_arguments)]
pub fn send<S: OobStream, R: Read>(
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
    // Until the QPs connect, a peer that says nothing (another tool, a dead process) ends
    // the run after `stall_timeout` instead of holding it.
    stream.bound_reads(Some(opts.stall_timeout))?;
    let hello: ReceiverHello = recv_json(stream, "receiver address")?;
    let (chunk, slots) = (hello.chunk_size, hello.slots);
    // Peer-supplied sizes: checked, so an absurd hello is refused instead of overflowing.
    let fits = chunk
        .checked_mul(slots)
        .and_then(|n| n.checked_add(CREDIT_LEN))
        .is_some_and(|n| n <= local.buf_len);
    if chunk == 0 || slots == 0 || !fits {
        anyhow::bail!("receiver asks for {slots} slots of {chunk} bytes, more than our buffer of {} bytes: use the same --chunk/--slots on both sides", local.buf_len);
    }
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
    stream.bound_reads(None)?;
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
            // The receiver's VA is opaque to us (any u64 is a valid VA); its responder's
            // R_Key and bounds check decides (IBTA 9.7.4.1.5), so wrap rather than panic.
            let remote_addr = hello.addr.wrapping_add((slot * chunk) as u64);
            ep.post_send(&ToolWr {
                wr_id: WR_DATA,
                op: WrOp::Write {
                    remote_addr,
                    rkey: hello.rkey,
                },
                offset: slot * chunk,
                len: this,
                signaled: false,
            })?;
            ep.post_send(&ToolWr {
                wr_id: WR_SIGNAL,
                op: WrOp::WriteWithImm {
                    remote_addr,
                    rkey: hello.rkey,
                    // The chunk number modulo 2^32; the receiver compares the same way.
                    imm: (k & 0xFFFF_FFFF) as u32,
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
            if let Some(status) = wc.failed() {
                anyhow::bail!(
                    "RDMA {:?} failed with {status:?}: the receiver went away or rejected the write",
                    wc.kind
                );
            }
            if wc.kind == WcKind::Recv {
                if wc.imm == Some(ABORT_IMM) {
                    let verdict: Verdict = recv_json(stream, "receiver's reason")?;
                    return Err(refusal(&verdict));
                }
                acked += 1;
                in_flight = in_flight.saturating_sub(1);
                ep.post_recv(WR_CREDIT, credit_at, CREDIT_LEN)?;
                progress(acked.saturating_mul(chunk as u64).min(len));
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
    let verified = match (verdict.ok, verdict.sha256 == digest) {
        (true, true) => true,
        // The receiver hashed different bytes: a corrupt copy (the caller reports it).
        (_, false) if !verdict.sha256.is_empty() => false,
        // Same bytes, but the receiver could not keep them (or gave up): its reason.
        _ => return Err(refusal(&verdict)),
    };
    Ok(TransferOutcome {
        name: name.to_string(),
        bytes: len,
        sha256: digest,
        verified,
        elapsed,
    })
}

fn refusal(verdict: &Verdict) -> anyhow::Error {
    match &verdict.reason {
        Some(reason) => anyhow::anyhow!("the receiver did not keep the file: {reason}"),
        None => anyhow::anyhow!("the receiver did not keep the file (it gave no reason)"),
    }
}

/// Where the receiver puts the file: the bytes in order, then, only once the SHA-256
/// matched, [`commit`](Sink::commit) to their final place. An error's text is what the
/// sender is told.
pub trait Sink {
    /// The sender proposes `name` (its file's base name) for `len` bytes: choose the
    /// destination, or refuse before any byte moves.
    fn begin(&mut self, name: &str, len: u64) -> anyhow::Result<()>;
    /// The next bytes of the file.
    fn write_all(&mut self, bytes: &[u8]) -> anyhow::Result<()>;
    /// The SHA-256 matched: make the bytes durable at their final path. The receiver says
    /// OK only when this succeeded.
    fn commit(&mut self) -> anyhow::Result<()>;
}

/// In memory (tests, and callers that want the bytes).
impl Sink for Vec<u8> {
    fn begin(&mut self, _name: &str, _len: u64) -> anyhow::Result<()> {
        self.clear();
        Ok(())
    }
    fn write_all(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.extend_from_slice(bytes);
        Ok(())
    }
    fn commit(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A file on disk, as `xroce file recv` writes it: into a temporary file of its own
/// (`.xroce-XXXXXX.partial`, made by `tempfile`) in the destination directory, fsynced,
/// then renamed to the destination (without replacing an existing file unless `force`),
/// and the directory fsynced. Dropped before [`commit`](Sink::commit), it removes the
/// temporary file.
#[derive(Debug)]
pub struct FileSink {
    dir: PathBuf,
    /// `-o` named a file (else the sender's name in `dir`).
    fixed: Option<PathBuf>,
    force: bool,
    temp: Option<BufWriter<tempfile::NamedTempFile>>,
    temp_path: PathBuf,
    dest: Option<PathBuf>,
}

impl FileSink {
    /// Checks where the file will go and creates the temporary file there now, so a bad
    /// path is found before a sender connects. `output`: a file path, a directory (the
    /// sender's name inside it), or `None` (the sender's name in the current directory).
    pub fn create(output: Option<&Path>, force: bool) -> anyhow::Result<FileSink> {
        let (dir, fixed) = match output {
            None => (
                std::env::current_dir()
                    .map_err(|e| anyhow::anyhow!("cannot find the current directory: {e}"))?,
                None,
            ),
            Some(p) if p.is_dir() => (p.to_path_buf(), None),
            Some(p) => {
                let parent = match p.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                (parent, Some(p.to_path_buf()))
            }
        };
        if let Some(p) = &fixed {
            check_free(p, force)?;
        }
        let shown = output.unwrap_or(&dir).display().to_string();
        match std::fs::metadata(&dir) {
            Err(e) => anyhow::bail!("-o {shown}: directory {}: {e}", dir.display()),
            Ok(m) if !m.is_dir() => {
                anyhow::bail!("-o {shown}: {} is not a directory", dir.display())
            }
            Ok(_) => {}
        }
        let temp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(TEMP_SUFFIX)
            .tempfile_in(&dir)
            .map_err(|e| anyhow::anyhow!("-o {shown}: cannot write in {}: {e}", dir.display()))?;
        let temp_path = temp.path().to_path_buf();
        Ok(FileSink {
            dir,
            fixed,
            force,
            temp: Some(BufWriter::with_capacity(1 << 20, temp)),
            temp_path,
            dest: None,
        })
    }

    /// The temporary file (gone after a commit).
    pub fn temp_path(&self) -> &Path {
        &self.temp_path
    }

    /// The final path, once the sender proposed its name.
    pub fn destination(&self) -> Option<&Path> {
        self.dest.as_deref()
    }
}

/// Refuses a destination that is a directory, or that exists without `--force`.
fn check_free(dest: &Path, force: bool) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => anyhow::bail!(
            "{} is a directory: name a file with -o, or remove the directory",
            dest.display()
        ),
        Ok(_) if !force => anyhow::bail!(
            "{} exists: pass --force to overwrite or -o to choose another path",
            dest.display()
        ),
        _ => Ok(()),
    }
}

impl Sink for FileSink {
    fn begin(&mut self, name: &str, _len: u64) -> anyhow::Result<()> {
        let dest = match &self.fixed {
            Some(p) => p.clone(),
            None => {
                // Only the base name of what the sender proposed, never a path.
                let base = Path::new(name)
                    .file_name()
                    .map(|n| n.to_owned())
                    .unwrap_or_else(|| "received.bin".into());
                self.dir.join(base)
            }
        };
        check_free(&dest, self.force)?;
        self.dest = Some(dest);
        Ok(())
    }

    fn write_all(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let Some(temp) = self.temp.as_mut() else {
            anyhow::bail!("the file was already committed");
        };
        temp.write_all(bytes)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", self.temp_path.display()))
    }

    fn commit(&mut self) -> anyhow::Result<()> {
        let (Some(temp), Some(dest)) = (self.temp.take(), self.dest.clone()) else {
            anyhow::bail!("nothing to commit: no file was begun");
        };
        let temp_path = self.temp_path.display();
        let temp = temp
            .into_inner()
            .map_err(|e| anyhow::anyhow!("writing {temp_path}: {}", e.error()))?;
        temp.as_file()
            .sync_all()
            .map_err(|e| anyhow::anyhow!("syncing {temp_path} to disk: {e}"))?;
        // Without --force, persist_noclobber refuses atomically when the destination
        // appeared meanwhile (another receiver, another program); the temp file is removed.
        let persisted = if self.force {
            temp.persist(&dest)
        } else {
            temp.persist_noclobber(&dest)
        };
        if let Err(e) = persisted {
            if e.error.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::bail!(
                    "{} exists: pass --force to overwrite or -o to choose another path",
                    dest.display()
                );
            }
            anyhow::bail!("cannot put the file at {}: {}", dest.display(), e.error);
        }
        // The rename is durable only once the directory is synced.
        std::fs::File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| anyhow::anyhow!("syncing directory {}: {e}", self.dir.display()))?;
        Ok(())
    }
}

/// Receives one file from a sender on `stream` into `sink`. `progress(bytes_done, total)`
/// is called per chunk. On a SHA-256 mismatch nothing is committed and the outcome says
/// `verified: false`; any other failure (the sink refused the name, a write or the commit
/// failed) is sent to the sender with its reason and returned as an error.
pub fn recv<S: OobStream>(
    ep: &mut dyn ToolEndpoint,
    stream: &mut S,
    sink: &mut dyn Sink,
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
    // Bounded until the QPs connect, as in `send`: a silent client cannot hold the receiver.
    stream.bound_reads(Some(opts.stall_timeout))?;
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
    stream.bound_reads(None)?;
    match receive_chunks(ep, sink, &hello, opts, progress) {
        Ok((sha, elapsed)) => finish(ep, stream, sink, hello, sha, elapsed),
        Err(e) => {
            abort(ep, stream, &e);
            Err(e)
        }
    }
}

/// The RDMA phase: every chunk into the sink; returns the hash of what was written.
fn receive_chunks(
    ep: &mut dyn ToolEndpoint,
    sink: &mut dyn Sink,
    hello: &SenderHello,
    opts: &FileOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<(Sha256, Duration)> {
    sink.begin(&hello.name, hello.len)?;
    let chunk = opts.chunk_size;
    // `hello.len` is the peer's: only divided and compared, `done` never exceeds it.
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
            if let Some(status) = wc.failed() {
                anyhow::bail!("RDMA {:?} failed with {status:?}", wc.kind);
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
            // Hash exactly the bytes handed to the sink.
            sink.write_all(&buf[..this])?;
            sha.update(&buf[..this]);
            done += this as u64;
            next += 1;
            progress(done, hello.len);
            ep.post_recv(WR_SIGNAL, 0, 0)?;
            ep.post_send(&ToolWr {
                wr_id: WR_CREDIT,
                op: WrOp::Send,
                offset: slot * chunk,
                len: CREDIT_LEN.min(chunk),
                signaled: true,
            })?;
        }
    }
    Ok((sha, start.elapsed()))
}

/// After the last chunk: compare digests, commit, and only then say OK.
fn finish<S: Read + Write>(
    ep: &mut dyn ToolEndpoint,
    stream: &mut S,
    sink: &mut dyn Sink,
    hello: SenderHello,
    sha: Sha256,
    elapsed: Duration,
) -> anyhow::Result<TransferOutcome> {
    let digest = hex(&sha.finalize());
    let finish: Finish = recv_json(stream, "final SHA-256")?;
    let matched = finish.sha256 == digest;
    let committed = if matched {
        sink.commit()
    } else {
        Err(anyhow::anyhow!(
            "SHA-256 mismatch: the received data is corrupt; nothing was written"
        ))
    };
    send_json(
        stream,
        &Verdict {
            ok: committed.is_ok(),
            sha256: digest.clone(),
            reason: committed.as_ref().err().map(|e| format!("{e:#}")),
        },
    )?;
    reap(ep, Duration::from_millis(200));
    if matched {
        committed?;
    }
    Ok(TransferOutcome {
        name: hello.name,
        bytes: hello.len,
        sha256: digest,
        verified: matched,
        elapsed,
    })
}

/// Tells the sender why we give up: the verdict line, then the abort SEND that makes it
/// read the line now. Best effort: the connection may be what failed.
fn abort<S: Write>(ep: &mut dyn ToolEndpoint, stream: &mut S, why: &anyhow::Error) {
    let _ = send_json(
        stream,
        &Verdict {
            ok: false,
            sha256: String::new(),
            reason: Some(format!("{why:#}")),
        },
    );
    let posted = ep.post_send(&ToolWr {
        wr_id: WR_ABORT,
        op: WrOp::SendWithImm { imm: ABORT_IMM },
        offset: 0,
        len: 0,
        signaled: true,
    });
    if posted.is_err() {
        return;
    }
    // Keep the QP until the SEND is acknowledged (or plainly lost).
    let until = Instant::now() + Duration::from_secs(2);
    let mut wcs = Vec::with_capacity(8);
    while Instant::now() < until {
        wcs.clear();
        match ep.poll(&mut wcs, 8) {
            Err(_) => return,
            Ok(_) if wcs.iter().any(|wc| wc.wr_id == WR_ABORT) => return,
            Ok(_) => std::thread::sleep(Duration::from_micros(100)),
        }
    }
}

/// Reaps the last credit completions so the QP is idle before it is destroyed.
fn reap(ep: &mut dyn ToolEndpoint, patience: Duration) {
    let until = Instant::now() + patience;
    let mut wcs = Vec::with_capacity(8);
    while Instant::now() < until {
        wcs.clear();
        if !matches!(ep.poll(&mut wcs, 8), Ok(n) if n > 0) {
            break;
        }
    }
}
