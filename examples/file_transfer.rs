//! File transfer with one-sided writes: the sender RDMA-WRITEs the file in chunks straight
//! into the receiver's registered buffer, then signals the end with a zero-length
//! RDMA WRITE_WITH_IMM, which is the only thing that wakes the receiver. The receiver checks
//! the SHA-256 the sender announced. (`xroce file send|recv` is the polished version, with
//! flow control for files larger than memory and a progress bar.)
//!
//! ```text
//! cargo run --example file_transfer -- recv --dev veth0 /tmp/out.bin
//! cargo run --example file_transfer -- send --dev veth1 198.18.0.1 ./in.bin
//! cargo run --example file_transfer -- demo        # both, in memory, no root
//! ```
//!
//! Why it is correct: on an RC QP the WRITE_WITH_IMM is executed after every WRITE before
//! it (IBTA 9.5: requests are processed in PSN order), so when its completion appears at the
//! receiver, all chunks are in place.
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use xroce::verbs::*;

/// A TCP connection used line by line. One `BufReader` for its whole life: a fresh reader
/// per line could swallow the next line into a buffer that is then dropped.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn new(stream: TcpStream) -> std::io::Result<Conn> {
        Ok(Conn {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        })
    }
    fn send(&mut self, line: &str) -> std::io::Result<()> {
        writeln!(self.writer, "{line}")
    }
    fn recv(&mut self) -> std::io::Result<Vec<String>> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        Ok(line.split_whitespace().map(str::to_string).collect())
    }
}

const PORT: u16 = 18522;
const CHUNK: usize = 1 << 20;
const MAX_FILE: usize = 256 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Side {
    device: Device,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    gid_index: u32,
}

fn open_side(device: Device) -> Res<Side> {
    let gid_index = device
        .ipv4_gid_index()
        .ok_or("the interface needs an IPv4 address")?;
    let pd = device.alloc_pd()?;
    let cq = device.create_cq(64, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    qp.to_init(Access::LOCAL_WRITE | Access::REMOTE_WRITE, 0)?;
    Ok(Side {
        device,
        pd,
        cq,
        qp,
        gid_index,
    })
}

fn connect(side: &Side, peer: &RcPeer, psn: u32) -> Result<(), VerbsError> {
    let opts = RcOptions {
        sgid_index: side.gid_index as u8,
        sq_psn: psn,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..RcOptions::default()
    };
    side.qp.connect_rc(peer, &opts)
}

/// Receives one file into `out`; returns its SHA-256.
fn receive(side: Side, listener: TcpListener, out: &std::path::Path) -> Res<String> {
    let mut conn = Conn::new(listener.accept()?.0)?;
    // Sender first: "len sha256 qpn psn gid".
    let f = conn.recv()?;
    if f.len() != 5 {
        return Err("bad sender line".into());
    }
    let len: usize = f[0].parse()?;
    if len > MAX_FILE {
        return Err(format!("file of {len} bytes is larger than this example's {MAX_FILE}").into());
    }
    let peer = RcPeer {
        qpn: f[2].parse()?,
        psn: f[3].parse()?,
        gid: Gid::from_hex(&f[4]).ok_or("bad GID")?,
    };
    // One region for the whole file; the peer may write into it, nothing else.
    let mr = side
        .pd
        .reg_mr(len.max(1), Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    // The WRITE_WITH_IMM consumes a receive WQE (with no buffer: the data went by WRITE).
    side.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![],
    })?;
    connect(&side, &peer, 0x300)?;
    let gid = side.device.query_gid(side.gid_index)?;
    conn.send(&format!(
        "{} {} {} {} {}",
        side.qp.qp_num(),
        0x300,
        gid.to_hex(),
        mr.addr(),
        mr.rkey()
    ))?;
    let wc = side
        .cq
        .wait(1, Duration::from_secs(60))?
        .pop()
        .ok_or("sender never signalled")?;
    if wc.status != WcStatus::Success || wc.opcode != WcOpcode::RecvRdmaWithImm {
        return Err(format!("unexpected completion {:?} {:?}", wc.opcode, wc.status).into());
    }
    let data = mr.to_vec(0, len)?;
    let digest = hex(&Sha256::digest(&data));
    let ok = digest == f[1];
    println!(
        "receiver: {} chunks signalled (imm), {len} bytes, sha256 {digest} {}",
        wc.imm_data.unwrap_or(0),
        if ok { "verified" } else { "MISMATCH" }
    );
    if !ok {
        conn.send(&format!("mismatch {digest}"))?;
        return Err("SHA-256 mismatch".into());
    }
    // "ok" only once the file is on disk: the sender takes it as a promise.
    let saved =
        std::fs::File::create(out).and_then(|mut f| f.write_all(&data).and_then(|_| f.sync_all()));
    if let Err(e) = saved {
        conn.send(&format!("failed {digest} writing {}: {e}", out.display()))?;
        return Err(format!("writing {}: {e}", out.display()).into());
    }
    conn.send(&format!("ok {digest}"))?;
    Ok(digest)
}

fn send(side: Side, host: &str, port: u16, data: &[u8]) -> Res<()> {
    let mut conn = Conn::new(TcpStream::connect((host, port))?)?;
    let digest = hex(&Sha256::digest(data));
    let gid = side.device.query_gid(side.gid_index)?;
    conn.send(&format!(
        "{} {} {} {} {}",
        data.len(),
        digest,
        side.qp.qp_num(),
        0x400,
        gid.to_hex()
    ))?;
    let f = conn.recv()?;
    if f.len() != 5 {
        return Err("bad receiver line".into());
    }
    let peer = RcPeer {
        qpn: f[0].parse()?,
        psn: f[1].parse()?,
        gid: Gid::from_hex(&f[2]).ok_or("bad GID")?,
    };
    let (remote_addr, rkey): (u64, u32) = (f[3].parse()?, f[4].parse()?);
    connect(&side, &peer, 0x400)?;
    let mr = side.pd.reg_mr_with(data, Access::LOCAL_WRITE)?;
    let start = Instant::now();
    let chunks = data.len().div_ceil(CHUNK);
    for (i, offset) in (0..data.len()).step_by(CHUNK).enumerate() {
        let len = CHUNK.min(data.len() - offset);
        side.qp.post_send(&SendWr {
            wr_id: i as u64,
            op: WrOp::Write {
                // The receiver's VA is opaque: wrap; its R_Key check refuses what is outside.
                remote_addr: remote_addr.wrapping_add(offset as u64),
                rkey,
            },
            sg_list: vec![mr.sge(offset, len as u32)?],
            flags: SendFlags::default(), // unsignaled: the final WR's completion covers it
            ud: None,
        })?;
    }
    side.qp.post_send(&SendWr {
        wr_id: u64::MAX,
        op: WrOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: chunks as u32,
        },
        sg_list: vec![],
        flags: SendFlags::SIGNALED,
        ud: None,
    })?;
    let wc = side
        .cq
        .wait(1, Duration::from_secs(60))?
        .pop()
        .ok_or("no completion")?;
    if wc.status != WcStatus::Success {
        return Err(format!("transfer failed: {:?}", wc.status).into());
    }
    let secs = start.elapsed().as_secs_f64();
    let verdict = conn.recv()?;
    println!(
        "sender: {} bytes in {chunks} WRITEs + 1 WRITE_WITH_IMM, {:.1} MB/s, receiver says {}",
        data.len(),
        data.len() as f64 / secs / 1e6,
        verdict.join(" ")
    );
    if verdict.first().map(String::as_str) != Some("ok") {
        return Err("receiver rejected the data".into());
    }
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = args
        .iter()
        .position(|a| a == "--dev")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let positional: Vec<&String> = {
        let mut skip = false;
        args.iter()
            .skip(1)
            .filter(|a| {
                let keep = !skip && !a.starts_with("--");
                skip = a.as_str() == "--dev";
                keep
            })
            .collect()
    };
    let open = || -> Res<Side> {
        open_side(Device::open(
            dev.as_deref().unwrap_or("eth0"),
            DeviceConfig::default(),
        )?)
    };
    match args.first().map(String::as_str) {
        Some("recv") => {
            let out = positional.first().ok_or("usage: recv [--dev IF] OUTPUT")?;
            receive(
                open()?,
                TcpListener::bind(("0.0.0.0", PORT))?,
                std::path::Path::new(out.as_str()),
            )?;
            Ok(())
        }
        Some("send") => {
            let (host, path) = match positional.as_slice() {
                [h, p] => (h.as_str(), p.as_str()),
                _ => return Err("usage: send [--dev IF] HOST FILE".into()),
            };
            send(open()?, host, PORT, &std::fs::read(path)?)
        }
        Some("demo") => {
            let (a, b, _link) =
                Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default())?;
            let listener = TcpListener::bind(("127.0.0.1", 0))?;
            let port = listener.local_addr()?.port();
            let data: Vec<u8> = (0..3 * CHUNK + 777).map(|i| (i * 31 % 256) as u8).collect();
            let out = std::env::temp_dir()
                .join(format!("xroce-file-transfer-demo-{}", std::process::id()));
            let (ra, sb) = (open_side(a)?, open_side(b)?);
            let out2 = out.clone();
            let rx =
                std::thread::spawn(move || receive(ra, listener, &out2).map_err(|e| e.to_string()));
            send(sb, "127.0.0.1", port, &data)?;
            rx.join().map_err(|_| "receiver panicked")??;
            let copied = std::fs::read(&out)?;
            std::fs::remove_file(&out)?;
            if copied != data {
                return Err("file on disk differs".into());
            }
            println!("demo: file transfer verified");
            Ok(())
        }
        _ => Err(
            "usage: file_transfer recv [--dev IF] OUTPUT | send [--dev IF] HOST FILE | demo".into(),
        ),
    }
}
