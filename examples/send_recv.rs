//! SEND / RECEIVE between a client and a server: the first program of every RDMA course.
//!
//! ```text
//! cargo run --example send_recv -- server --dev veth0            # waits on TCP 18520
//! cargo run --example send_recv -- client --dev veth1 198.18.0.1
//! cargo run --example send_recv -- demo                          # both, in memory, no root
//! ```
//!
//! What happens:
//! 1. Each side opens the device, allocates a PD, a CQ, an RC QP and a memory region.
//! 2. The server posts a RECEIVE first (a SEND that finds no receive would be RNR-NAKed).
//! 3. Both exchange QPN, first PSN and GID over TCP (RDMA needs this out-of-band step),
//!    then move their QPs RESET → INIT → RTR → RTS (`connect_rc`).
//! 4. The client SENDs a message; the server's receive completes with its length; the
//!    server answers with a SEND of its own into the client's posted receive.
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

const PORT: u16 = 18520;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Everything one side owns. Dropping it tears down in the right order.
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
    let mr = pd.reg_mr(4096, Access::LOCAL_WRITE)?;
    qp.to_init(Access::LOCAL_WRITE, 0)?;
    Ok(Side {
        device,
        cq,
        qp,
        mr,
        gid_index,
    })
}

/// Sends our QP's address as one text line and reads the peer's: "qpn psn gid".
fn exchange(conn: &mut Conn, side: &Side, psn: u32) -> Result<RcPeer, Box<dyn std::error::Error>> {
    let gid = side.device.query_gid(side.gid_index)?;
    conn.send(&format!("{} {} {}", side.qp.qp_num(), psn, gid.to_hex()))?;
    let f = conn.recv()?;
    if f.len() != 3 {
        return Err(format!("bad peer line {f:?}").into());
    }
    Ok(RcPeer {
        qpn: f[0].parse()?,
        psn: f[1].parse()?,
        gid: Gid::from_hex(&f[2]).ok_or("bad GID")?,
    })
}

fn connect(side: &Side, peer: &RcPeer, psn: u32) -> Result<(), VerbsError> {
    let opts = RcOptions {
        sgid_index: side.gid_index as u8,
        sq_psn: psn,
        ..RcOptions::default()
    };
    side.qp.connect_rc(peer, &opts)
}

fn recv_one(side: &Side) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let wc = side
        .cq
        .wait(1, TIMEOUT)?
        .pop()
        .ok_or("no completion in time")?;
    if wc.status != WcStatus::Success {
        return Err(format!("completion failed: {:?}", wc.status).into());
    }
    Ok(side.mr.to_vec(0, wc.byte_len as usize)?)
}

fn send_one(side: &Side, text: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    side.mr.write(2048, text)?;
    side.qp.post_send(&SendWr {
        wr_id: 2,
        op: WrOp::Send,
        sg_list: vec![side.mr.sge(2048, text.len() as u32)?],
        flags: SendFlags::SIGNALED,
        ud: None,
    })?;
    let wc = side
        .cq
        .wait(1, TIMEOUT)?
        .pop()
        .ok_or("send did not complete")?;
    if wc.status != WcStatus::Success {
        return Err(format!("send failed: {:?}", wc.status).into());
    }
    Ok(())
}

fn post_receive(side: &Side) -> Result<(), VerbsError> {
    side.qp.post_recv(&RecvWr {
        wr_id: 1,
        sg_list: vec![side.mr.sge(0, 2048)?],
    })
}

fn server(side: Side, listener: TcpListener) -> Result<(), Box<dyn std::error::Error>> {
    post_receive(&side)?; // before the peer can possibly send
    let mut conn = Conn::new(listener.accept()?.0)?;
    let psn = 0x1000;
    let peer = exchange(&mut conn, &side, psn)?;
    connect(&side, &peer, psn)?;
    conn.send("ready")?; // the client may send now
    let msg = recv_one(&side)?;
    println!("server: received {:?}", String::from_utf8_lossy(&msg));
    send_one(&side, b"pong from the server")?;
    // Keep the QP up until the client has its answer (it still ACKs our SEND).
    conn.recv()?;
    Ok(())
}

fn client(side: Side, host: &str, port: u16) -> Result<(), Box<dyn std::error::Error>> {
    post_receive(&side)?; // for the server's answer
    let mut conn = Conn::new(TcpStream::connect((host, port))?)?;
    let psn = 0x2000;
    let peer = exchange(&mut conn, &side, psn)?;
    connect(&side, &peer, psn)?;
    conn.recv()?; // "ready": the server has connected its QP
    send_one(&side, b"ping from the client")?;
    let answer = recv_one(&side)?;
    println!("client: received {:?}", String::from_utf8_lossy(&answer));
    conn.send("bye")?;
    if answer != b"pong from the server" {
        return Err("unexpected answer".into());
    }
    Ok(())
}

fn open(dev: &str) -> Result<Side, Box<dyn std::error::Error>> {
    open_side(Device::open(dev, DeviceConfig::default())?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = args
        .iter()
        .position(|a| a == "--dev")
        .and_then(|i| args.get(i + 1))
        .cloned();
    match args.first().map(String::as_str) {
        Some("server") => server(
            open(dev.as_deref().unwrap_or("eth0"))?,
            TcpListener::bind(("0.0.0.0", PORT))?,
        ),
        Some("client") => {
            let host = args
                .last()
                .filter(|h| !h.starts_with("--") && *h != "client")
                .ok_or("usage: client [--dev IF] HOST")?;
            client(open(dev.as_deref().unwrap_or("eth0"))?, host, PORT)
        }
        Some("demo") => {
            // Two devices joined in memory; TCP for the exchange on the loopback interface.
            let (a, b, _link) =
                Device::mem_pair(&mem_link_config(1500, 0.0, 1), DeviceConfig::default())?;
            let listener = TcpListener::bind(("127.0.0.1", 0))?;
            let port = listener.local_addr()?.port();
            let (sa, sb) = (open_side(a)?, open_side(b)?);
            let srv = std::thread::spawn(move || server(sa, listener).map_err(|e| e.to_string()));
            client(sb, "127.0.0.1", port)?;
            srv.join().map_err(|_| "server panicked")??;
            println!("demo: SEND/RECV both ways OK");
            Ok(())
        }
        _ => Err("usage: send_recv server [--dev IF] | client [--dev IF] HOST | demo".into()),
    }
}
