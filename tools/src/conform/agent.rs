//! The client of the target agent (`tools/src/conform/agent.py`): one JSON object per line each
//! way, over TCP (a remote target) or a Unix socket (a target in another network namespace
//! of this machine). Every call waits for its answer; a refusal by the target (pyverbs'
//! error, a bad argument) is [`AgentError::Refused`] with the agent's words.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Map, Value};

use xroce::engine::WrOp;

/// What can go wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("agent connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("agent protocol: {0}")]
    Protocol(String),
    /// The agent (or the stack under test) refused the request.
    #[error("the target refused {cmd}: {why}")]
    Refused { cmd: String, why: String },
}

type Result<T> = std::result::Result<T, AgentError>;

/// A snapshot of the target's counters, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetCounters {
    pub source: Option<String>,
    pub values: std::collections::BTreeMap<String, u64>,
}

impl TargetCounters {
    /// Counters that grew since `before`, with how much, leaving out the traffic totals
    /// (packets, bytes, messages) that count good frames too.
    pub fn grown_since(&self, before: &TargetCounters) -> Vec<(String, u64)> {
        self.values
            .iter()
            .filter(|(name, _)| !is_traffic_total(name))
            .filter_map(|(name, &now)| {
                let was = before.values.get(name).copied().unwrap_or(0);
                (now > was).then(|| (name.clone(), now - was))
            })
            .collect()
    }
}

/// Counters that move for good traffic as well (rxe's, NICs' and xroce's names), and
/// sysfs files that are settings, not counts.
fn is_traffic_total(name: &str) -> bool {
    const TOTALS: &[&str] = &[
        "sent_pkts",
        "rcvd_pkts",
        "rdma_sends",
        "rdma_recvs",
        "lifespan",
        "gsi_sent",
        "gsi_rcvd",
        "acks_coalesced",
        "port_xmit_data",
        "port_rcv_data",
        "port_xmit_packets",
        "port_rcv_packets",
        "unicast_xmit_packets",
        "unicast_rcv_packets",
        "multicast_xmit_packets",
        "multicast_rcv_packets",
    ];
    TOTALS.contains(&name) || name.ends_with("_bytes")
}

/// The target's facts (`hello`).
#[derive(Debug, Clone)]
pub struct Hello {
    pub device: String,
    pub gid: String,
    pub gid_index: u32,
    pub vendor_id: u32,
    pub active_mtu: u32,
    pub max_qp_rd_atom: u32,
}

/// A QP the agent made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub handle: u64,
    pub qpn: u32,
}

/// An MR the agent registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    pub handle: u64,
    pub addr: u64,
    pub rkey: u32,
    pub lkey: u32,
}

/// The attributes `connect` moves a QP through RESET, INIT, RTR and RTS with.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    pub remote_qpn: u32,
    /// The peer's GID as text (`::ffff:198.18.0.1`).
    pub remote_gid: String,
    /// The first PSN the target expects from the peer.
    pub rq_psn: u32,
    /// The first PSN the target sends.
    pub sq_psn: u32,
    pub mtu: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
}

impl ConnectParams {
    /// perftest's usual values: MTU 1024, timeout 14, 7 retries, RNR forever, 16 READs.
    pub fn new(remote_qpn: u32, remote_gid: impl Into<String>, rq_psn: u32, sq_psn: u32) -> Self {
        ConnectParams {
            remote_qpn,
            remote_gid: remote_gid.into(),
            rq_psn,
            sq_psn,
            mtu: 1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

/// A work completion the target reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    pub status: u32,
    /// libibverbs' name of the status (`IBV_WC_SUCCESS`, `IBV_WC_REM_ACCESS_ERR`, ...).
    pub status_name: String,
    /// `send`, `write`, `read`, `cmp_swap`, `fetch_add`, `recv`, `recv_rdma_imm`.
    pub opcode: String,
    pub byte_len: u32,
    pub imm: u32,
}

trait Stream: std::io::Read + Write + Send {}
impl<T: std::io::Read + Write + Send> Stream for T {}

/// A connection to one agent.
pub struct AgentClient {
    reader: BufReader<Box<dyn Stream>>,
    next_id: u64,
}

impl AgentClient {
    /// Connects over TCP; `timeout` bounds the connect and every answer.
    pub fn tcp(addr: &str, timeout: Duration) -> Result<AgentClient> {
        let sock = addr
            .parse()
            .map_err(|e| AgentError::Protocol(format!("agent address {addr:?}: {e}")))?;
        let stream = TcpStream::connect_timeout(&sock, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(AgentClient::over(Box::new(stream)))
    }

    /// Connects over a Unix socket; `timeout` bounds every answer.
    pub fn unix(path: &Path, timeout: Duration) -> Result<AgentClient> {
        let stream = UnixStream::connect(path)?;
        stream.set_read_timeout(Some(timeout))?;
        Ok(AgentClient::over(Box::new(stream)))
    }

    fn over(stream: Box<dyn Stream>) -> AgentClient {
        AgentClient {
            reader: BufReader::new(stream),
            next_id: 1,
        }
    }

    /// Sends one request and returns the answer's fields.
    pub fn call(&mut self, cmd: &str, args: Value) -> Result<Map<String, Value>> {
        let id = self.next_id;
        self.next_id += 1;
        let mut req = match args {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                return Err(AgentError::Protocol(format!(
                    "arguments {other} are not an object"
                )))
            }
        };
        req.insert("id".into(), json!(id));
        req.insert("cmd".into(), json!(cmd));
        let mut line = serde_json::to_string(&req).expect("a JSON map serializes");
        line.push('\n');
        self.reader.get_mut().write_all(line.as_bytes())?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(AgentError::Protocol(format!(
                "the agent closed the connection during {cmd}"
            )));
        }
        let answer: Map<String, Value> = serde_json::from_str(&answer).map_err(|e| {
            AgentError::Protocol(format!("answer to {cmd} is not JSON ({e}): {answer:?}"))
        })?;
        if answer.get("id") != Some(&json!(id)) {
            return Err(AgentError::Protocol(format!(
                "answer to request {id} carries id {:?}",
                answer.get("id")
            )));
        }
        match answer.get("ok") {
            Some(Value::Bool(true)) => Ok(answer),
            Some(Value::Bool(false)) => Err(AgentError::Refused {
                cmd: cmd.to_string(),
                why: answer
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string(),
            }),
            _ => Err(AgentError::Protocol(format!(
                "answer to {cmd} has no ok field"
            ))),
        }
    }

    pub fn hello(&mut self) -> Result<Hello> {
        let a = self.call("hello", Value::Null)?;
        Ok(Hello {
            device: text(&a, "device")?,
            gid: text(&a, "gid")?,
            gid_index: num(&a, "gid_index")? as u32,
            vendor_id: num(&a, "vendor_id")? as u32,
            active_mtu: num(&a, "active_mtu")? as u32,
            max_qp_rd_atom: num(&a, "max_qp_rd_atom")? as u32,
        })
    }

    /// An RC QP (or UD with `ud`) with its own CQ.
    pub fn create_qp(&mut self, ud: bool) -> Result<QpInfo> {
        let a = self.call("create_qp", json!({ "type": if ud { "ud" } else { "rc" } }))?;
        Ok(QpInfo {
            handle: num(&a, "qp")?,
            qpn: num(&a, "qpn")? as u32,
        })
    }

    /// `access`: any of `local_write`, `remote_write`, `remote_read`, `remote_atomic`.
    pub fn reg_mr(&mut self, size: usize, access: &[&str]) -> Result<MrInfo> {
        let a = self.call("reg_mr", json!({ "size": size, "access": access }))?;
        Ok(MrInfo {
            handle: num(&a, "mr")?,
            addr: num(&a, "addr")?,
            rkey: num(&a, "rkey")? as u32,
            lkey: num(&a, "lkey")? as u32,
        })
    }

    pub fn write_mem(&mut self, mr: &MrInfo, offset: usize, bytes: &[u8]) -> Result<()> {
        self.call(
            "write_mem",
            json!({ "mr": mr.handle, "offset": offset, "hex": hex(bytes) }),
        )?;
        Ok(())
    }

    pub fn read_mem(&mut self, mr: &MrInfo, offset: usize, len: usize) -> Result<Vec<u8>> {
        let a = self.call(
            "read_mem",
            json!({ "mr": mr.handle, "offset": offset, "len": len }),
        )?;
        unhex(&text(&a, "hex")?)
    }

    /// Moves the QP to RTS towards the peer.
    pub fn connect(&mut self, qp: &QpInfo, p: &ConnectParams) -> Result<()> {
        self.call(
            "connect",
            json!({
                "qp": qp.handle, "remote_qpn": p.remote_qpn, "remote_gid": p.remote_gid,
                "rq_psn": p.rq_psn, "sq_psn": p.sq_psn, "mtu": p.mtu, "timeout": p.timeout,
                "retry_cnt": p.retry_cnt, "rnr_retry": p.rnr_retry,
                "min_rnr_timer": p.min_rnr_timer, "max_rd_atomic": p.max_rd_atomic,
                "max_dest_rd_atomic": p.max_dest_rd_atomic,
            }),
        )?;
        Ok(())
    }

    /// The QP's state (`reset`, `init`, `rtr`, `rts`, `sqd`, `sqe`, `err`).
    pub fn qp_state(&mut self, qp: &QpInfo) -> Result<String> {
        text(&self.call("query_qp", json!({ "qp": qp.handle }))?, "state")
    }

    /// Makes a UD QP ready to send and receive with `qkey` (RESET, INIT, RTR, RTS).
    pub fn ud_ready(&mut self, qp: &QpInfo, qkey: u32) -> Result<()> {
        self.call("ud_ready", json!({ "qp": qp.handle, "qkey": qkey }))?;
        Ok(())
    }

    /// The target device's counters (`source` says where from: sysfs `hw_counters`, xroce's
    /// `xroce_read_counters`, or `None` where the stack exposes none).
    pub fn counters(&mut self) -> Result<TargetCounters> {
        let a = self.call("counters", Value::Null)?;
        let source = a.get("source").and_then(Value::as_str).map(str::to_string);
        let mut values = std::collections::BTreeMap::new();
        if let Some(map) = a.get("counters").and_then(Value::as_object) {
            for (name, value) in map {
                if let Some(v) = value.as_u64() {
                    values.insert(name.clone(), v);
                }
            }
        }
        Ok(TargetCounters { source, values })
    }

    /// Moves the QP to `state` (`err` or `reset`): a case ends a QP it left retrying.
    pub fn modify(&mut self, qp: &QpInfo, state: &str) -> Result<()> {
        self.call("modify", json!({ "qp": qp.handle, "state": state }))?;
        Ok(())
    }

    pub fn post_recv(
        &mut self,
        qp: &QpInfo,
        wr_id: u64,
        mr: &MrInfo,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        self.call(
            "post_recv",
            json!({ "qp": qp.handle, "wr_id": wr_id, "mr": mr.handle, "offset": offset, "len": len }),
        )?;
        Ok(())
    }

    /// Posts a signalled work request whose local buffer is `len` bytes at `offset` of `mr`.
    pub fn post_send(
        &mut self,
        qp: &QpInfo,
        wr_id: u64,
        op: WrOp,
        mr: &MrInfo,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let mut args = json!({
            "qp": qp.handle, "wr_id": wr_id, "mr": mr.handle, "offset": offset, "len": len,
        });
        let extra = match op {
            WrOp::Send => json!({ "op": "send" }),
            WrOp::SendWithImm { imm } => json!({ "op": "send_imm", "imm": imm }),
            WrOp::Write { remote_addr, rkey } => {
                json!({ "op": "write", "remote_addr": remote_addr, "rkey": rkey })
            }
            WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                json!({ "op": "write_imm", "remote_addr": remote_addr, "rkey": rkey, "imm": imm })
            }
            WrOp::Read { remote_addr, rkey } => {
                json!({ "op": "read", "remote_addr": remote_addr, "rkey": rkey })
            }
            WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => json!({
                "op": "cmp_swap", "remote_addr": remote_addr, "rkey": rkey,
                "compare": compare, "swap": swap,
            }),
            WrOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => json!({
                "op": "fetch_add", "remote_addr": remote_addr, "rkey": rkey, "add": add,
            }),
            other => {
                return Err(AgentError::Protocol(format!(
                    "the agent posts SEND, WRITE, READ and atomics, not {other:?}"
                )))
            }
        };
        if let (Value::Object(a), Value::Object(e)) = (&mut args, extra) {
            a.extend(e);
        }
        self.call("post_send", args)?;
        Ok(())
    }

    /// Completions of the QP's CQ: up to `max`, waiting up to `timeout` for them.
    pub fn poll(&mut self, qp: &QpInfo, max: usize, timeout: Duration) -> Result<Vec<Completion>> {
        let a = self.call(
            "poll",
            json!({ "qp": qp.handle, "max": max, "timeout_ms": timeout.as_millis() as u64 }),
        )?;
        let list = a
            .get("wcs")
            .and_then(Value::as_array)
            .ok_or_else(|| AgentError::Protocol("poll answered without wcs".into()))?;
        list.iter()
            .map(|w| {
                let w = w
                    .as_object()
                    .ok_or_else(|| AgentError::Protocol("a wc is not an object".into()))?;
                Ok(Completion {
                    wr_id: num(w, "wr_id")?,
                    status: num(w, "status")? as u32,
                    status_name: text(w, "status_name")?,
                    opcode: text(w, "opcode")?,
                    byte_len: num(w, "byte_len")? as u32,
                    imm: num(w, "imm")? as u32,
                })
            })
            .collect()
    }

    /// Ends the session (the agent destroys its objects).
    pub fn bye(mut self) -> Result<()> {
        self.call("bye", Value::Null)?;
        Ok(())
    }
}

fn num(a: &Map<String, Value>, key: &str) -> Result<u64> {
    a.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| AgentError::Protocol(format!("answer has no number {key:?}: {a:?}")))
}

fn text(a: &Map<String, Value>, key: &str) -> Result<String> {
    a.get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| AgentError::Protocol(format!("answer has no text {key:?}: {a:?}")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Result<Vec<u8>> {
    if text.len() % 2 != 0 {
        return Err(AgentError::Protocol(format!("odd-length hex {text:?}")));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&text[i..i + 2], 16)
                .map_err(|_| AgentError::Protocol(format!("bad hex {text:?}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_garbage() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&bytes)).unwrap(), bytes);
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
    }
}
