//! CM MADs explaining themselves field by field (`xroce dump --explain`), each field with
//! the IBTA section that defines it. Offsets are the frame's: `at` is where the MAD starts.

use std::fmt;
use std::time::Duration;

use super::{Explainer, IcrcRole, PrettyPrint};
use crate::wire::cm::{
    attribute_name, timeout_duration, CmMad, CmMessage, CmPath, CmRej, CmRep, CmReq, SidrRep,
    ARI_LEN,
};
use crate::wire::cma::{split_service_id, CmaHeader, CMA_HEADER_LEN};
use crate::wire::mad::{method_name, MadHeader, MAD_HEADER_LEN, MAD_LEN, MGMT_CLASS_CM};

const C: IcrcRole = IcrcRole::Covered;

/// "4.29 s", "537 ms", "16.8 µs".
pub(crate) fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// "20 (4.096 µs × 2^20 = 4.295 s)".
fn timeout_text(exp: u8) -> String {
    format!(
        "{exp} (4.096 µs × 2^{exp} = {})",
        human_duration(timeout_duration(exp))
    )
}

/// The service id with its rdma_cm reading, if it has one.
pub(crate) fn service_id_text(sid: u64) -> String {
    match split_service_id(sid) {
        Some((ps, port)) => format!("0x{sid:016x} ({} port {port})", ps.name()),
        None => format!("0x{sid:016x}"),
    }
}

fn gid_text(gid: &[u8; 16]) -> String {
    let a = std::net::Ipv6Addr::from(*gid);
    match a.to_ipv4_mapped() {
        Some(v4) => format!("{a} (IPv4 {v4})"),
        None => a.to_string(),
    }
}

fn explain_header(h: &MadHeader, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    out.heading(format_args!(
        "MAD header [{at}..{}]  common MAD header (IBTA 13.4.3)",
        at + MAD_HEADER_LEN
    ))?;
    out.field(
        at,
        1,
        format_args!("base version {} (IBTA 13.4.3: always 1)", h.base_version),
        C,
    )?;
    let class = if h.mgmt_class == MGMT_CLASS_CM {
        "communication management (IBTA 13.4.4)"
    } else {
        "not the CM"
    };
    out.field(
        at + 1,
        1,
        format_args!("management class 0x{:02x}: {class}", h.mgmt_class),
        C,
    )?;
    out.field(
        at + 2,
        1,
        format_args!(
            "class version {} (IBTA 12.6.1: the CM is version 2)",
            h.class_version
        ),
        C,
    )?;
    out.field(
        at + 3,
        1,
        format_args!(
            "method 0x{:02x} {} (IBTA 13.4.5; every CM message is a Send, IBTA 12.6.1)",
            h.method,
            method_name(h.method)
        ),
        C,
    )?;
    out.field(
        at + 4,
        2,
        format_args!("status 0x{:04x} (IBTA 13.4.7)", h.status),
        C,
    )?;
    out.field(
        at + 6,
        2,
        format_args!("class specific 0x{:04x}", h.class_specific),
        C,
    )?;
    out.field(
        at + 8,
        8,
        format_args!(
            "transaction id 0x{:016x}: a resend keeps it (IBTA 13.4.6.4); in Linux a reply \
             reuses the id of what it answers (REP, RTU: the REQ's; DREP: the DREQ's)",
            h.transaction_id
        ),
        C,
    )?;
    out.field(
        at + 16,
        2,
        format_args!(
            "attribute id 0x{:04x}: {} (IBTA 12.6.1, which CM message)",
            h.attribute_id,
            attribute_name(h.attribute_id).unwrap_or("unknown")
        ),
        C,
    )?;
    out.field(at + 18, 2, "reserved", C)?;
    out.field(
        at + 20,
        4,
        format_args!("attribute modifier 0x{:08x}", h.attribute_modifier),
        C,
    )
}

fn comm_ids(local: u32, remote: u32, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    out.field(
        at,
        4,
        format_args!("local comm id 0x{local:08x}: the sender's id for this connection"),
        C,
    )?;
    out.field(
        at + 4,
        4,
        format_args!("remote comm id 0x{remote:08x}: the receiver's id (0: it has none yet)"),
        C,
    )
}

fn private_data(data: &[u8], at: usize, cma: bool, out: &mut Explainer<'_>) -> fmt::Result {
    let used = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    out.heading(format_args!(
        "private data [{at}..{}]  {} bytes, {used} up to the last nonzero byte (IBTA 12.6: \
         fixed size, zero padded)",
        at + data.len(),
        data.len()
    ))?;
    let hdr = if cma {
        CmaHeader::parse(data).ok()
    } else {
        None
    };
    match hdr {
        Some(h) => {
            out.field(
                at,
                1,
                format_args!("rdma_cm header version {} (cma.c)", h.version),
                C,
            )?;
            out.field(
                at + 1,
                1,
                format_args!("IP version {} (high nibble)", h.ip_version()),
                C,
            )?;
            out.field(
                at + 2,
                2,
                format_args!(
                    "source port {}: the active side's rdma_cm port (the destination port is \
                     in the service id)",
                    h.src_port
                ),
                C,
            )?;
            out.field(at + 4, 16, format_args!("source address {}", h.src_addr), C)?;
            out.field(
                at + 20,
                16,
                format_args!("destination address {}", h.dst_addr),
                C,
            )?;
            let rest = &data[CMA_HEADER_LEN..];
            let rest_used = rest.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            if rest_used > 0 {
                out.field(
                    at + CMA_HEADER_LEN,
                    rest_used.min(16),
                    format_args!("the user's private data ({rest_used} bytes)"),
                    C,
                )?;
            }
        }
        None if used > 0 => {
            out.field(
                at,
                used.min(16),
                if used > 16 {
                    "first 16 bytes ..."
                } else {
                    "data"
                },
                C,
            )?;
        }
        None => {}
    }
    Ok(())
}

fn explain_path(p: &CmPath, at: usize, which: &str, out: &mut Explainer<'_>) -> fmt::Result {
    out.field(
        at,
        2,
        format_args!(
            "{which} local port LID 0x{:04x} (RoCE: 0xffff, permissive)",
            p.local_lid
        ),
        C,
    )?;
    out.field(
        at + 2,
        2,
        format_args!("{which} remote port LID 0x{:04x}", p.remote_lid),
        C,
    )?;
    out.field(
        at + 4,
        16,
        format_args!(
            "{which} local port GID {} (RoCE: the IP address)",
            gid_text(&p.local_gid)
        ),
        C,
    )?;
    out.field(
        at + 20,
        16,
        format_args!("{which} remote port GID {}", gid_text(&p.remote_gid)),
        C,
    )?;
    let sport = (((p.flow_label & 0x3FFF) ^ ((p.flow_label & 0xFC000) >> 14)) | 0xC000) as u16;
    out.field(
        at + 36,
        3,
        format_args!(
            "{which} flow label 0x{:05x} (20 bits; RoCEv2 folds it into UDP source port {sport})",
            p.flow_label
        ),
        C,
    )?;
    out.field(
        at + 39,
        1,
        format_args!(
            "{which} packet rate {} (6 bits, the SA path record encoding)",
            p.packet_rate
        ),
        C,
    )?;
    out.field(
        at + 40,
        1,
        format_args!(
            "{which} traffic class 0x{:02x} (the IP DSCP/ECN byte)",
            p.traffic_class
        ),
        C,
    )?;
    out.field(
        at + 41,
        1,
        format_args!("{which} hop limit {} (the IP TTL)", p.hop_limit),
        C,
    )?;
    out.field(
        at + 42,
        1,
        format_args!(
            "{which} SL {}, subnet local {}",
            p.sl,
            u8::from(p.subnet_local)
        ),
        C,
    )?;
    out.field(
        at + 43,
        1,
        format_args!(
            "{which} local ACK timeout {}: the transport timer for the QP",
            timeout_text(p.local_ack_timeout)
        ),
        C,
    )
}

fn explain_req(m: &CmReq, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    out.field(
        at,
        4,
        format_args!(
            "local comm id 0x{:08x}: the active side's id for this connection",
            m.local_comm_id
        ),
        C,
    )?;
    out.field(
        at + 4,
        4,
        format_args!("reserved, vendor id 0x{:06x} (ECE)", m.vendor_id),
        C,
    )?;
    out.field(
        at + 8,
        8,
        format_args!(
            "service id {}: what the passive side listens on",
            service_id_text(m.service_id)
        ),
        C,
    )?;
    out.field(
        at + 16,
        8,
        format_args!("local CA GUID 0x{:016x}", m.local_ca_guid),
        C,
    )?;
    out.field(at + 24, 4, "reserved", C)?;
    out.field(
        at + 28,
        4,
        format_args!("local Q_Key 0x{:08x} (RD only)", m.local_qkey),
        C,
    )?;
    out.field(
        at + 32,
        3,
        format_args!(
            "local QPN 0x{:x}: the active side's QP, where the passive side sends",
            m.local_qpn
        ),
        C,
    )?;
    out.field(
        at + 35,
        1,
        format_args!(
            "responder resources {}: READs/atomics the active side takes at once",
            m.responder_resources
        ),
        C,
    )?;
    out.field(
        at + 36,
        3,
        format_args!("local EECN 0x{:x} (RD only)", m.local_eecn),
        C,
    )?;
    out.field(
        at + 39,
        1,
        format_args!(
            "initiator depth {}: READs/atomics the active side issues at once",
            m.initiator_depth
        ),
        C,
    )?;
    out.field(
        at + 40,
        3,
        format_args!("remote EECN 0x{:x} (RD only)", m.remote_eecn),
        C,
    )?;
    out.field(
        at + 43,
        1,
        format_args!(
            "remote CM response timeout {}: how long the REQ may wait for its answer; \
             transport {:?}; end-to-end flow control {}",
            timeout_text(m.remote_cm_response_timeout),
            m.transport_type,
            u8::from(m.end_to_end_flow_control)
        ),
        C,
    )?;
    out.field(
        at + 44,
        3,
        format_args!(
            "starting PSN 0x{:06x} ({}): the PSN the passive side starts sending with",
            m.starting_psn, m.starting_psn
        ),
        C,
    )?;
    out.field(
        at + 47,
        1,
        format_args!(
            "local CM response timeout {}: the active side's answer time; retry count {} \
             (transport retries for the passive QP)",
            timeout_text(m.local_cm_response_timeout),
            m.retry_count
        ),
        C,
    )?;
    out.field(
        at + 48,
        2,
        format_args!("partition key 0x{:04x}", m.partition_key),
        C,
    )?;
    let mtu = match m.path_mtu.bytes() {
        Some(b) => format!("{b}"),
        None => "reserved".into(),
    };
    out.field(
        at + 50,
        1,
        format_args!(
            "path MTU code {} ({mtu} bytes); RDC exists {}; RNR retry count {}",
            m.path_mtu.code(),
            u8::from(m.rdc_exists),
            m.rnr_retry_count
        ),
        C,
    )?;
    out.field(
        at + 51,
        1,
        format_args!(
            "max CM retries {}: REQ resends before giving up; SRQ {}; \
             extended transport type {}",
            m.max_cm_retries,
            u8::from(m.srq),
            m.extended_transport_type
        ),
        C,
    )?;
    out.heading(format_args!(
        "primary path [{}..{}]  (IBTA 12.6.5)",
        at + 52,
        at + 96
    ))?;
    explain_path(&m.primary_path, at + 52, "primary", out)?;
    if m.alternate_path.is_empty() {
        out.field(
            at + 96,
            4,
            format_args!(
                "alternate path [{}..{}]: none (all {} bytes zero)",
                at + 96,
                at + 140,
                CmPath::LEN
            ),
            C,
        )?;
    } else {
        out.heading(format_args!("alternate path [{}..{}]", at + 96, at + 140))?;
        explain_path(&m.alternate_path, at + 96, "alternate", out)?;
    }
    private_data(m.private_data.as_bytes(), at + 140, true, out)
}

fn explain_rej(m: &CmRej, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    comm_ids(m.local_comm_id, m.remote_comm_id, at, out)?;
    out.field(
        at + 8,
        1,
        format_args!("message rejected: {:?}", m.message_rejected),
        C,
    )?;
    out.field(
        at + 9,
        1,
        format_args!("reject info length {}", m.reject_info_length),
        C,
    )?;
    out.field(
        at + 10,
        2,
        format_args!(
            "reason {}: {} (IBTA 12.6.7, reject reasons)",
            m.reason.code(),
            m.reason.description()
        ),
        C,
    )?;
    let ari = m.ari_bytes();
    out.field(
        at + 12,
        ari.len().clamp(1, 16),
        format_args!(
            "additional reject information ({} of {ARI_LEN} bytes meaningful)",
            ari.len()
        ),
        C,
    )?;
    private_data(m.private_data.as_bytes(), at + 84, false, out)
}

fn explain_rep(m: &CmRep, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    comm_ids(m.local_comm_id, m.remote_comm_id, at, out)?;
    out.field(
        at + 8,
        4,
        format_args!("local Q_Key 0x{:08x} (RD only)", m.local_qkey),
        C,
    )?;
    out.field(
        at + 12,
        3,
        format_args!(
            "local QPN 0x{:x}: the passive side's QP, where the active side sends",
            m.local_qpn
        ),
        C,
    )?;
    out.field(
        at + 15,
        1,
        format_args!("vendor id 0x{:06x} (ECE, high byte)", m.vendor_id),
        C,
    )?;
    out.field(
        at + 16,
        3,
        format_args!("local EECN 0x{:x} (RD only)", m.local_eecn),
        C,
    )?;
    out.field(at + 19, 1, "vendor id, middle byte", C)?;
    out.field(
        at + 20,
        3,
        format_args!(
            "starting PSN 0x{:06x} ({}): the PSN the active side starts sending with",
            m.starting_psn, m.starting_psn
        ),
        C,
    )?;
    out.field(at + 23, 1, "vendor id, low byte", C)?;
    out.field(
        at + 24,
        1,
        format_args!("responder resources {}", m.responder_resources),
        C,
    )?;
    out.field(
        at + 25,
        1,
        format_args!("initiator depth {}", m.initiator_depth),
        C,
    )?;
    out.field(
        at + 26,
        1,
        format_args!(
            "target ACK delay {}; failover {:?}; end-to-end flow control {}",
            timeout_text(m.target_ack_delay),
            m.failover_accepted,
            u8::from(m.end_to_end_flow_control)
        ),
        C,
    )?;
    out.field(
        at + 27,
        1,
        format_args!(
            "RNR retry count {} (for the active QP); SRQ {}",
            m.rnr_retry_count,
            u8::from(m.srq)
        ),
        C,
    )?;
    out.field(
        at + 28,
        8,
        format_args!("local CA GUID 0x{:016x}", m.local_ca_guid),
        C,
    )?;
    private_data(m.private_data.as_bytes(), at + 36, false, out)
}

fn explain_sidr_rep(m: &SidrRep, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
    out.field(
        at,
        4,
        format_args!("request id 0x{:08x}: the SIDR_REQ's", m.request_id),
        C,
    )?;
    out.field(
        at + 4,
        1,
        format_args!(
            "status {}: {} (IBTA 12.11.2)",
            m.status.code(),
            m.status.description()
        ),
        C,
    )?;
    out.field(
        at + 5,
        1,
        format_args!("additional information length {}", m.additional_info_length),
        C,
    )?;
    out.field(
        at + 6,
        2,
        format_args!("vendor id 0x{:06x} (ECE)", m.vendor_id),
        C,
    )?;
    out.field(
        at + 8,
        3,
        format_args!("QPN 0x{:x}: the service's UD QP", m.qpn),
        C,
    )?;
    out.field(at + 11, 1, "vendor id, low byte", C)?;
    out.field(
        at + 12,
        8,
        format_args!("service id {}", service_id_text(m.service_id)),
        C,
    )?;
    out.field(
        at + 20,
        4,
        format_args!("Q_Key 0x{:08x}: what datagrams to the QP carry", m.qkey),
        C,
    )?;
    out.field(at + 24, 16, "additional information (first 16 bytes)", C)?;
    private_data(m.private_data.as_bytes(), at + 96, false, out)
}

impl PrettyPrint for CmMad {
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result {
        explain_header(&self.header, at, out)?;
        let d = at + MAD_HEADER_LEN;
        let (name, section, title) = match &self.message {
            CmMessage::Req(_) => ("REQ", "12.6.5", "request for communication"),
            CmMessage::Mra(_) => ("MRA", "12.6.6", "message receipt acknowledgement"),
            CmMessage::Rej(_) => ("REJ", "12.6.7", "reject"),
            CmMessage::Rep(_) => ("REP", "12.6.8", "reply to request for communication"),
            CmMessage::Rtu(_) => ("RTU", "12.6.9", "ready to use"),
            CmMessage::Dreq(_) => ("DREQ", "12.6.10", "request for communication release"),
            CmMessage::Drep(_) => ("DREP", "12.6.11", "reply to request for release"),
            CmMessage::SidrReq(_) => ("SIDR_REQ", "12.11.1", "service id resolution request"),
            CmMessage::SidrRep(_) => ("SIDR_REP", "12.11.2", "service id resolution response"),
            CmMessage::Lap(_) => ("LAP", "12.8.1", "load alternate path (not decoded)"),
            CmMessage::Apr(_) => ("APR", "12.8.2", "alternate path response (not decoded)"),
        };
        out.heading(format_args!(
            "CM {name} [{d}..{}]  {title} (IBTA {section})",
            at + MAD_LEN
        ))?;
        match &self.message {
            CmMessage::Req(m) => explain_req(m, d, out),
            CmMessage::Mra(m) => {
                comm_ids(m.local_comm_id, m.remote_comm_id, d, out)?;
                out.field(
                    d + 8,
                    1,
                    format_args!("message MRAed: {:?}", m.message_mraed),
                    C,
                )?;
                out.field(
                    d + 9,
                    1,
                    format_args!(
                        "service timeout {}: added to the sender's wait (IBTA 12.6.6)",
                        timeout_text(m.service_timeout)
                    ),
                    C,
                )?;
                private_data(m.private_data.as_bytes(), d + 10, false, out)
            }
            CmMessage::Rej(m) => explain_rej(m, d, out),
            CmMessage::Rep(m) => explain_rep(m, d, out),
            CmMessage::Rtu(m) => {
                comm_ids(m.local_comm_id, m.remote_comm_id, d, out)?;
                private_data(m.private_data.as_bytes(), d + 8, false, out)
            }
            CmMessage::Dreq(m) => {
                comm_ids(m.local_comm_id, m.remote_comm_id, d, out)?;
                out.field(
                    d + 8,
                    3,
                    format_args!(
                        "remote QPN 0x{:x}: the receiver's QP, so a stale DREQ is told apart",
                        m.remote_qpn
                    ),
                    C,
                )?;
                out.field(d + 11, 1, "reserved", C)?;
                private_data(m.private_data.as_bytes(), d + 12, false, out)
            }
            CmMessage::Drep(m) => {
                comm_ids(m.local_comm_id, m.remote_comm_id, d, out)?;
                private_data(m.private_data.as_bytes(), d + 8, false, out)
            }
            CmMessage::SidrReq(m) => {
                out.field(
                    d,
                    4,
                    format_args!("request id 0x{:08x}: echoed by the SIDR_REP", m.request_id),
                    C,
                )?;
                out.field(
                    d + 4,
                    2,
                    format_args!("partition key 0x{:04x}", m.partition_key),
                    C,
                )?;
                out.field(d + 6, 2, "reserved", C)?;
                out.field(
                    d + 8,
                    8,
                    format_args!("service id {}", service_id_text(m.service_id)),
                    C,
                )?;
                private_data(m.private_data.as_bytes(), d + 16, true, out)
            }
            CmMessage::SidrRep(m) => explain_sidr_rep(m, d, out),
            CmMessage::Lap(m) | CmMessage::Apr(m) => {
                comm_ids(m.local_comm_id, m.remote_comm_id, d, out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::cm::CmRtu;

    #[test]
    fn an_rtu_explains_its_comm_ids_at_frame_offsets() {
        let mad = CmMad::new(
            7,
            CmMessage::Rtu(CmRtu {
                local_comm_id: 0x1234_5678,
                remote_comm_id: 0x9abc_def0,
                ..CmRtu::default()
            }),
        );
        let mut frame = vec![0u8; 10];
        frame.extend_from_slice(&mad.to_bytes().unwrap());
        let text = mad.explain(&frame, 10, 2);
        assert!(
            text.contains("CM RTU [34..266]  ready to use (IBTA 12.6.9)"),
            "{text}"
        );
        assert!(text.contains("0022  12 34 56 78"), "{text}");
        assert!(text.contains("attribute id 0x0014: RTU"), "{text}");
        assert_eq!(timeout_text(20), "20 (4.096 µs × 2^20 = 4.295 s)");
    }
}
