//! Reassembles the TCP conversations in a capture: how the out-of-band byte streams of
//! `ibv_rc_pingpong` and perftest were extracted from the rxe captures into
//! `tests/fixtures/oob/` (and how a test re-checks them against the pcap).
//!
//! Deliberately small: IPv4 or IPv6 over Ethernet, segments ordered by sequence number,
//! retransmitted bytes counted once. It is a test-vector tool, not a general TCP stack.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use etherparse::{NetSlice, SlicedPacket, TransportSlice};

/// One TCP connection's payload, one byte stream per direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConversation {
    /// The side that sent the first SYN (or the side not on `server_port`).
    pub client: SocketAddr,
    /// The listening side.
    pub server: SocketAddr,
    /// Everything the client sent, in order.
    pub client_bytes: Vec<u8>,
    /// Everything the server sent, in order.
    pub server_bytes: Vec<u8>,
}

#[derive(Default)]
struct Direction {
    /// Initial sequence number (from the SYN, or the first segment seen).
    isn: Option<u32>,
    /// Payload by offset from the ISN.
    segments: BTreeMap<u64, Vec<u8>>,
}

impl Direction {
    fn add(&mut self, seq: u32, syn: bool, payload: &[u8]) {
        let isn = *self
            .isn
            .get_or_insert(if syn { seq } else { seq.wrapping_sub(1) });
        if payload.is_empty() {
            return;
        }
        // Offset 1 is the first payload byte (the SYN takes sequence number ISN).
        let offset = u64::from(seq.wrapping_sub(isn));
        self.segments
            .entry(offset)
            .or_insert_with(|| payload.to_vec());
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut next = 1u64;
        for (&offset, data) in &self.segments {
            let end = offset + data.len() as u64;
            if end <= next {
                continue; // a pure retransmission
            }
            let skip = next.saturating_sub(offset) as usize;
            out.extend_from_slice(&data[skip..]);
            next = end;
        }
        out
    }
}

/// Errors reading a capture.
#[derive(Debug, thiserror::Error)]
pub enum TcpStreamsError {
    /// The file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a readable pcap.
    #[error("{path} is not a readable pcap file: {reason}")]
    Pcap {
        /// The file.
        path: String,
        /// Parser message.
        reason: String,
    },
}

/// Every TCP conversation in a pcap file, in order of first appearance. `server_port`
/// decides which side is the server when the SYN was not captured.
pub fn tcp_conversations(
    path: &Path,
    server_port: u16,
) -> Result<Vec<TcpConversation>, TcpStreamsError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| TcpStreamsError::Open {
        path: shown.clone(),
        source,
    })?;
    let mut reader = pcap_file::pcap::PcapReader::new(file).map_err(|e| TcpStreamsError::Pcap {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    // Key: the unordered endpoint pair; value: (client, server, two directions).
    type Key = (SocketAddr, SocketAddr);
    let mut order: Vec<Key> = Vec::new();
    let mut flows: BTreeMap<Key, (Option<SocketAddr>, Direction, Direction)> = BTreeMap::new();
    while let Some(packet) = reader.next_packet() {
        let packet = packet.map_err(|e| TcpStreamsError::Pcap {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let Ok(sliced) = SlicedPacket::from_ethernet(&packet.data) else {
            continue;
        };
        let (src_ip, dst_ip): (IpAddr, IpAddr) = match &sliced.net {
            Some(NetSlice::Ipv4(v4)) => (
                v4.header().source_addr().into(),
                v4.header().destination_addr().into(),
            ),
            Some(NetSlice::Ipv6(v6)) => (
                v6.header().source_addr().into(),
                v6.header().destination_addr().into(),
            ),
            None => continue,
        };
        let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else {
            continue;
        };
        let src = SocketAddr::new(src_ip, tcp.source_port());
        let dst = SocketAddr::new(dst_ip, tcp.destination_port());
        let key = if src < dst { (src, dst) } else { (dst, src) };
        let entry = flows.entry(key).or_insert_with(|| {
            order.push(key);
            (None, Direction::default(), Direction::default())
        });
        if entry.0.is_none() {
            if (tcp.syn() && !tcp.ack()) || dst.port() == server_port {
                entry.0 = Some(src);
            } else if src.port() == server_port {
                entry.0 = Some(dst);
            }
        }
        // Direction 1 = from key.0, direction 2 = from key.1.
        let dir = if src == key.0 {
            &mut entry.1
        } else {
            &mut entry.2
        };
        dir.add(tcp.sequence_number(), tcp.syn(), tcp.payload());
    }
    let mut out = Vec::new();
    for key in order {
        let (client, from_first, from_second) = &flows[&key];
        let client = client.unwrap_or(key.0);
        let (server, client_dir, server_dir) = if client == key.0 {
            (key.1, from_first, from_second)
        } else {
            (key.0, from_second, from_first)
        };
        let conversation = TcpConversation {
            client,
            server,
            client_bytes: client_dir.bytes(),
            server_bytes: server_dir.bytes(),
        };
        if !conversation.client_bytes.is_empty() || !conversation.server_bytes.is_empty() {
            out.push(conversation);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reorders_and_drops_retransmissions() {
        let mut d = Direction::default();
        d.add(100, true, b"");
        d.add(106, false, b"world");
        d.add(101, false, b"hello");
        d.add(101, false, b"hello"); // retransmitted
        assert_eq!(d.bytes(), b"helloworld");
    }
}
