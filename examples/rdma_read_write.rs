//! One-sided RDMA: the client WRITEs into the server's memory and READs it back, using the
//! address and R_Key the server sent over TCP. The server's CPU does nothing meanwhile.
//!
//! ```text
//! cargo run --example rdma_read_write -- server --dev veth0
//! cargo run --example rdma_read_write -- client --dev veth1 198.18.0.1
//! cargo run --example rdma_read_write -- demo        # both, in memory, no root
//! ```
//!
//! Keys: the server registers its buffer with `REMOTE_WRITE | REMOTE_READ` and tells the
//! client `addr` and `rkey`. Those two numbers are the whole permission: a READ or WRITE
//! outside the region or with another key gets a NAK (Remote Access Error) and the client's
//! completion says `RemAccessErr`. This example shows that too.
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

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

const PORT: u16 = 18521;
const LEN: usize = 64 * 1024;

struct Side {
    device: Device,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    gid_index: u32,
}

fn open_side(device: Device) -> Result<Side, Box<dyn std::error::Error>> {
    let gid_index = device
        .ipv4_gid_index()
        .ok_or("the interface needs an IPv4 address")?;
    let pd = device.alloc_pd()?;
    let cq = device.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq))?;
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mr = pd.reg_mr(LEN, access)?;
    Ok(Side {
        device,
        cq,
        qp,
        mr,
        gid_index,
    })
}

/// One line each way: "qpn psn gid addr rkey".
fn exchange(
    conn: &mut Conn,
    side: &Side,
    psn: u32,
) -> Result<(RcPeer, u64, u32), Box<dyn std::error::Error>> {
    let gid = side.device.query_gid(side.gid_index)?;
    conn.send(&format!(
        "{} {} {} {} {}",
        side.qp.qp_num(),
        psn,
        gid.to_hex(),
        side.mr.addr(),
        side.mr.rkey()
    ))?;
    let f = conn.recv()?;
    if f.len() != 5 {
        return Err(format!("bad peer line {f:?}").into());
    }
    let peer = RcPeer {
        qpn: f[0].parse()?,
        psn: f[1].parse()?,
        gid: Gid::from_hex(&f[2]).ok_or("bad GID")?,
    };
    Ok((peer, f[3].parse()?, f[4].parse()?))
}

fn connect(side: &Side, peer: &RcPeer, psn: u32) -> Result<(), VerbsError> {
    let opts = RcOptions {
        sgid_index: side.gid_index as u8,
        sq_psn: psn,
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        ..RcOptions::default()
    };
    side.qp.connect_rc(peer, &opts)
}

fn run_wr(
    side: &Side,
    op: WrOp,
    offset: usize,
    len: usize,
) -> Result<WcStatus, Box<dyn std::error::Error>> {
    side.qp.post_send(&SendWr {
        wr_id: 7,
        op,
        sg_list: vec![side.mr.sge(offset, len as u32)?],
        flags: SendFlags::SIGNALED,
        ud: None,
    })?;
    let wc = side
        .cq
        .wait(1, Duration::from_secs(10))?
        .pop()
        .ok_or("no completion in time")?;
    Ok(wc.status)
}

fn server(side: Side, listener: TcpListener) -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = Conn::new(listener.accept()?.0)?;
    let (peer, _, _) = exchange(&mut conn, &side, 0x100)?;
    connect(&side, &peer, 0x100)?;
    conn.send("ready")?;
    // Wait until the client says it is done, then look at what it wrote.
    conn.recv()?;
    let data = side.mr.to_vec(0, LEN)?;
    let expected: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    println!(
        "server: client wrote {} bytes, pattern {}",
        LEN,
        if data == expected { "intact" } else { "WRONG" }
    );
    conn.send(if data == expected { "ok" } else { "bad" })?;
    if data != expected {
        return Err("the WRITE did not land".into());
    }
    Ok(())
}

fn client(side: Side, host: &str, port: u16) -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = Conn::new(TcpStream::connect((host, port))?)?;
    let (peer, remote_addr, rkey) = exchange(&mut conn, &side, 0x200)?;
    connect(&side, &peer, 0x200)?;
    conn.recv()?; // "ready"
                  // WRITE a pattern into the server's buffer...
    let pattern: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
    side.mr.write(0, &pattern)?;
    let status = run_wr(&side, WrOp::Write { remote_addr, rkey }, 0, LEN)?;
    println!("client: RDMA WRITE {LEN} bytes: {status:?}");
    // ...READ it back into a zeroed buffer and compare.
    side.mr.write(0, &vec![0; LEN])?;
    let status = run_wr(&side, WrOp::Read { remote_addr, rkey }, 0, LEN)?;
    let back = side.mr.to_vec(0, LEN)?;
    println!(
        "client: RDMA READ {LEN} bytes: {status:?}, data {}",
        if back == pattern {
            "matches"
        } else {
            "DIFFERS"
        }
    );
    if back != pattern {
        return Err("READ returned other data".into());
    }
    // A wrong key is refused by the server's HCA, not by its CPU.
    let status = run_wr(
        &side,
        WrOp::Read {
            remote_addr,
            rkey: rkey ^ 0x5a5a,
        },
        0,
        8,
    )?;
    println!("client: READ with a wrong R_Key: {status:?}");
    if status != WcStatus::RemAccessErr {
        return Err("a wrong R_Key was not refused".into());
    }
    conn.send("done")?;
    if conn.recv()?.first().map(String::as_str) != Some("ok") {
        return Err("server saw wrong data".into());
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = args
        .iter()
        .position(|a| a == "--dev")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let open = |d: Option<&str>| -> Result<Side, Box<dyn std::error::Error>> {
        open_side(Device::open(d.unwrap_or("eth0"), DeviceConfig::default())?)
    };
    match args.first().map(String::as_str) {
        Some("server") => server(open(dev.as_deref())?, TcpListener::bind(("0.0.0.0", PORT))?),
        Some("client") => {
            let host = args
                .last()
                .filter(|h| !h.starts_with("--") && *h != "client")
                .ok_or("usage: client [--dev IF] HOST")?;
            client(open(dev.as_deref())?, host, PORT)
        }
        Some("demo") => {
            let (a, b, _link) =
                Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default())?;
            let listener = TcpListener::bind(("127.0.0.1", 0))?;
            let port = listener.local_addr()?.port();
            let (sa, sb) = (open_side(a)?, open_side(b)?);
            let srv = std::thread::spawn(move || server(sa, listener).map_err(|e| e.to_string()));
            client(sb, "127.0.0.1", port)?;
            srv.join().map_err(|_| "server panicked")??;
            println!("demo: RDMA WRITE, READ and key check OK");
            Ok(())
        }
        _ => Err("usage: rdma_read_write server [--dev IF] | client [--dev IF] HOST | demo".into()),
    }
}
