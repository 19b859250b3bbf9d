//! CM MADs in a capture: one line (or a JSON object) per message, and each connection's
//! handshake for the summary (REQ -> REP -> RTU ... DREQ -> DREP, or a REJ and its reason).

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use xroce::wire::cm::{CmMad, CmMessage};
use xroce::wire::cma::{split_service_id, CmaHeader};

/// The message and its fields that matter, on one line:
/// `CM REQ comm=0x35d0c3d4 service=0x...(RDMA_PS_TCP port 7174) qpn=0x11 psn=8029245`.
pub fn cm_text(mad: &CmMad) -> String {
    let m = &mad.message;
    let mut t = format!("CM {}", m.name());
    match m {
        CmMessage::SidrReq(_) | CmMessage::SidrRep(_) => {
            let _ = write!(t, " request=0x{:08x}", m.local_comm_id());
        }
        _ => {
            let _ = write!(t, " comm=0x{:08x}", m.local_comm_id());
        }
    }
    if let Some(r) = m.remote_comm_id() {
        let _ = write!(t, " remote_comm=0x{r:08x}");
    }
    match m {
        CmMessage::Req(r) => {
            let _ = write!(
                t,
                " service={} qpn=0x{:x} psn={} mtu={} timeouts={}/{} retries={}",
                service(r.service_id),
                r.local_qpn,
                r.starting_psn,
                r.path_mtu.bytes().unwrap_or(0),
                r.remote_cm_response_timeout,
                r.local_cm_response_timeout,
                r.max_cm_retries
            );
            if let Ok(h) = CmaHeader::parse(r.private_data.as_bytes()) {
                let src = std::net::SocketAddr::new(h.src_addr, h.src_port);
                let _ = write!(t, " rdma_cm {src} > {}", h.dst_addr);
            }
        }
        CmMessage::Rep(r) => {
            let _ = write!(t, " qpn=0x{:x} psn={}", r.local_qpn, r.starting_psn);
        }
        CmMessage::Rej(r) => {
            let _ = write!(
                t,
                " rejects={:?} reason={} \"{}\"",
                r.message_rejected,
                r.reason.code(),
                r.reason.description()
            );
        }
        CmMessage::Mra(r) => {
            let _ = write!(
                t,
                " mraed={:?} service_timeout={}",
                r.message_mraed, r.service_timeout
            );
        }
        CmMessage::Dreq(r) => {
            let _ = write!(t, " remote_qpn=0x{:x}", r.remote_qpn);
        }
        CmMessage::SidrReq(r) => {
            let _ = write!(t, " service={}", service(r.service_id));
            if let Ok(h) = CmaHeader::parse(r.private_data.as_bytes()) {
                let src = std::net::SocketAddr::new(h.src_addr, h.src_port);
                let _ = write!(t, " rdma_cm {src} > {}", h.dst_addr);
            }
        }
        CmMessage::SidrRep(r) => {
            let _ = write!(
                t,
                " status={} \"{}\" qpn=0x{:x} qkey=0x{:08x}",
                r.status.code(),
                r.status.description(),
                r.qpn,
                r.qkey
            );
        }
        CmMessage::Rtu(_) | CmMessage::Drep(_) | CmMessage::Lap(_) | CmMessage::Apr(_) => {}
    }
    let _ = write!(t, " tid=0x{:x}", mad.header.transaction_id);
    t
}

fn service(sid: u64) -> String {
    match split_service_id(sid) {
        Some((ps, port)) => format!("0x{sid:x}({} port {port})", ps.name()),
        None => format!("0x{sid:x}"),
    }
}

/// The message as JSON (the `cm` member of a frame's object).
pub fn cm_json(mad: &CmMad) -> Value {
    let m = &mad.message;
    let mut v = json!({
        "message": m.name(),
        "attribute_id": m.attribute_id(),
        "transaction_id": mad.header.transaction_id,
        "local_comm_id": m.local_comm_id(),
    });
    if let Some(r) = m.remote_comm_id() {
        v["remote_comm_id"] = json!(r);
    }
    match m {
        CmMessage::Req(r) => {
            v["service_id"] = json!(r.service_id);
            v["local_qpn"] = json!(r.local_qpn);
            v["starting_psn"] = json!(r.starting_psn);
            v["path_mtu"] = json!(r.path_mtu.bytes());
            v["remote_cm_response_timeout"] = json!(r.remote_cm_response_timeout);
            v["local_cm_response_timeout"] = json!(r.local_cm_response_timeout);
            v["max_cm_retries"] = json!(r.max_cm_retries);
            v["retry_count"] = json!(r.retry_count);
            v["rnr_retry_count"] = json!(r.rnr_retry_count);
            if let Ok(h) = CmaHeader::parse(r.private_data.as_bytes()) {
                v["rdma_cm"] = cma_json(&h);
            }
        }
        CmMessage::Rep(r) => {
            v["local_qpn"] = json!(r.local_qpn);
            v["starting_psn"] = json!(r.starting_psn);
        }
        CmMessage::Rej(r) => {
            v["reason"] = json!(r.reason.code());
            v["reason_text"] = json!(r.reason.description());
            v["message_rejected"] = json!(format!("{:?}", r.message_rejected));
        }
        CmMessage::Mra(r) => {
            v["service_timeout"] = json!(r.service_timeout);
        }
        CmMessage::Dreq(r) => v["remote_qpn"] = json!(r.remote_qpn),
        CmMessage::SidrReq(r) => {
            v["service_id"] = json!(r.service_id);
            if let Ok(h) = CmaHeader::parse(r.private_data.as_bytes()) {
                v["rdma_cm"] = cma_json(&h);
            }
        }
        CmMessage::SidrRep(r) => {
            v["status"] = json!(r.status.code());
            v["service_id"] = json!(r.service_id);
            v["qpn"] = json!(r.qpn);
            v["qkey"] = json!(r.qkey);
        }
        _ => {}
    }
    v
}

fn cma_json(h: &CmaHeader) -> Value {
    json!({
        "src_addr": h.src_addr.to_string(),
        "src_port": h.src_port,
        "dst_addr": h.dst_addr.to_string(),
    })
}

/// One connection (or SIDR exchange) as the capture shows it.
#[derive(Debug, Clone)]
struct CmConnection {
    active: String,
    passive: String,
    active_comm_id: u32,
    passive_comm_id: Option<u32>,
    service_id: Option<u64>,
    qpns: (Option<u32>, Option<u32>),
    sidr: bool,
    /// Messages in order, with the frame that carried each.
    steps: Vec<(String, usize)>,
    outcome: Option<String>,
}

/// Each connection's handshake, built from the CM MADs of a capture in order.
#[derive(Default)]
pub struct CmConnections {
    connections: Vec<CmConnection>,
    /// (address, comm id or SIDR request id) -> connection.
    by_end: HashMap<(String, u32, bool), usize>,
    /// CM MADs that did not parse, by frame.
    pub(super) bad: Vec<(usize, String)>,
    mads: usize,
}

impl CmConnections {
    /// Records a CM MAD sent by `src` to `dst` in frame `frame`.
    pub fn record(&mut self, frame: usize, src: &str, dst: &str, mad: &CmMad) {
        self.mads += 1;
        let m = &mad.message;
        let sidr = matches!(m, CmMessage::SidrReq(_) | CmMessage::SidrRep(_));
        // A REJ of a REQ nobody took has local comm id 0: no end to know it by.
        let own = (m.local_comm_id() != 0).then(|| (src.to_string(), m.local_comm_id(), sidr));
        let found = own
            .as_ref()
            .and_then(|k| self.by_end.get(k).copied())
            .or_else(|| {
                let peer = match m {
                    CmMessage::SidrRep(r) => Some(r.request_id),
                    _ => m.remote_comm_id(),
                }?;
                self.by_end.get(&(dst.to_string(), peer, sidr)).copied()
            });
        let index = match found {
            Some(i) => i,
            None => {
                // A REQ or SIDR_REQ opens one. Anything else seen first opens one too (the
                // capture started late): a REP or SIDR_REP comes from the passive side,
                // other messages are taken to come from the active side.
                let from_passive = matches!(m, CmMessage::Rep(_) | CmMessage::SidrRep(_));
                let (active, passive) = if from_passive { (dst, src) } else { (src, dst) };
                let peer_id = match m {
                    CmMessage::SidrRep(r) => Some(r.request_id),
                    _ => m.remote_comm_id().filter(|&r| r != 0),
                };
                let (active_comm_id, passive_comm_id) = if from_passive {
                    (peer_id.unwrap_or(0), Some(m.local_comm_id()))
                } else {
                    (m.local_comm_id(), peer_id)
                };
                self.connections.push(CmConnection {
                    active: active.to_string(),
                    passive: passive.to_string(),
                    active_comm_id,
                    passive_comm_id: passive_comm_id.filter(|_| !sidr),
                    service_id: None,
                    qpns: (None, None),
                    sidr,
                    steps: vec![],
                    outcome: None,
                });
                if let Some(peer) = peer_id {
                    self.by_end
                        .insert((dst.to_string(), peer, sidr), self.connections.len() - 1);
                }
                self.connections.len() - 1
            }
        };
        if let Some(k) = own {
            self.by_end.insert(k, index);
        }
        let c = &mut self.connections[index];
        let from_active = src == c.active;
        match m {
            CmMessage::Req(r) => {
                c.service_id = Some(r.service_id);
                c.qpns.0 = Some(r.local_qpn);
            }
            CmMessage::Rep(r) => {
                c.passive_comm_id = Some(r.local_comm_id);
                c.qpns.1 = Some(r.local_qpn);
            }
            CmMessage::Rej(r) => {
                let who = if from_active { "active" } else { "passive" };
                c.outcome = Some(format!(
                    "rejected by the {who} side: reason {} \"{}\"",
                    r.reason.code(),
                    r.reason.description()
                ));
            }
            CmMessage::SidrReq(r) => c.service_id = Some(r.service_id),
            CmMessage::SidrRep(r) => {
                c.qpns.1 = Some(r.qpn);
                c.outcome = Some(format!(
                    "status {} \"{}\", QPN 0x{:x}, Q_Key 0x{:08x}",
                    r.status.code(),
                    r.status.description(),
                    r.qpn,
                    r.qkey
                ));
            }
            CmMessage::Rtu(_) => c.outcome = Some("established".into()),
            CmMessage::Drep(_) => c.outcome = Some("established, then disconnected".into()),
            _ => {}
        }
        let name = match m {
            CmMessage::Dreq(_) | CmMessage::Rej(_) | CmMessage::Mra(_) if !from_active => {
                format!("{}(passive)", m.name())
            }
            _ => m.name().to_string(),
        };
        c.steps.push((name, frame));
    }

    /// Whether any CM MAD was seen.
    pub fn is_empty(&self) -> bool {
        self.mads == 0 && self.bad.is_empty()
    }

    /// The summary's section: one entry per connection.
    pub fn report(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "CM connections:     {} ({} CM MADs)",
            self.connections.len(),
            self.mads
        );
        for c in &self.connections {
            let passive_id = c
                .passive_comm_id
                .map_or("(no comm id)".to_string(), |id| format!("comm 0x{id:08x}"));
            let kind = if c.sidr { "SIDR request" } else { "comm" };
            let _ = write!(
                t,
                "  {} {kind} 0x{:08x} -> {}",
                c.active, c.active_comm_id, c.passive
            );
            if !c.sidr {
                let _ = write!(t, " {passive_id}");
            }
            if let Some(sid) = c.service_id {
                let _ = write!(t, ", service {}", service(sid));
            }
            match c.qpns {
                (Some(a), Some(p)) => {
                    let _ = write!(t, ", QPN 0x{a:x} <-> 0x{p:x}");
                }
                (None, Some(q)) | (Some(q), None) => {
                    let _ = write!(t, ", QPN 0x{q:x}");
                }
                _ => {}
            }
            t.push('\n');
            let _ = writeln!(t, "    {}", handshake(&c.steps));
            let outcome = c
                .outcome
                .as_deref()
                .unwrap_or("not completed in the capture");
            let _ = writeln!(t, "    {outcome}");
        }
        for (frame, e) in &self.bad {
            let _ = writeln!(t, "  frame #{frame}: CM MAD does not parse: {e}");
        }
        t
    }
}

/// "REQ -> REP -> RTU -> DREQ -> DREP  (frames #1 #2 #3 #40 #41)", repeats as "REQ x3".
fn handshake(steps: &[(String, usize)]) -> String {
    let mut names: Vec<(String, usize)> = vec![];
    for (n, _) in steps {
        match names.last_mut() {
            Some((last, count)) if last == n => *count += 1,
            _ => names.push((n.clone(), 1)),
        }
    }
    let seq: Vec<String> = names
        .iter()
        .map(|(n, c)| {
            if *c > 1 {
                format!("{n} x{c}")
            } else {
                n.clone()
            }
        })
        .collect();
    let frames: Vec<String> = steps.iter().map(|(_, f)| format!("#{f}")).collect();
    format!("{}  (frames {})", seq.join(" -> "), frames.join(" "))
}
