//! The out-of-band exchange of rdma-core's `ibv_rc_pingpong` and `ibv_ud_pingpong` (and
//! `ibv_srq_pingpong`, which sends 256 such messages each way: [`client_exchange_all`]).
//!
//! Both tools swap one fixed-size ASCII message over TCP (port 18515 by default) before any
//! RoCE packet flows. The message is `sprintf("%04x:%06x:%06x:%s", lid, qpn, psn, gid)` in a
//! 52-byte buffer (`sizeof "0000:000000:000000:" + 32 hex digits + NUL`), where the GID is
//! the 16 raw bytes as 32 lowercase hex digits (`gid_to_wire_gid` in rdma-core's
//! `libibverbs/examples/pingpong.c`). On RoCE the LID is 0.
//!
//! ```text
//! client                                   server
//!   | ---- 52 B "LID:QPN:PSN:GID\0" ----->  |  (server parses, moves its QP to RTR/RTS)
//!   | <--- 52 B "LID:QPN:PSN:GID\0" ------  |
//!   | ---- 5 B "done\0" ----------------->  |
//! ```
//!
//! The server answers only after its QP is ready (RC: RTR then RTS; UD: RTR, RTS and an
//! address handle), so the client's first SEND cannot arrive at a QP in INIT. The client
//! connects its own QP after the exchange. [`client_exchange`] and [`server_exchange`] do the
//! byte-exact exchange over any `Read + Write` stream, so they are tested against the bytes
//! recorded from real rxe runs (`tests/fixtures/oob/`).

use std::net::Ipv6Addr;
use std::time::Duration;

use crate::setup::{self, OobStream};

/// Size of the message buffer: `sizeof "0000:000000:000000:00000000000000000000000000000000"`.
pub const MSG_LEN: usize = 52;
/// The client's final message, sent with its NUL: `write(fd, "done", sizeof "done")`.
pub const DONE: &[u8; 5] = b"done\0";
/// The TCP port both tools use unless `-p` says otherwise.
pub const DEFAULT_PORT: u16 = 18515;
/// The Q_Key `ibv_ud_pingpong` sets on its QP and in every send WR (the tools' UD Q_Key).
pub use crate::endpoint::UD_QKEY;
/// Bytes `ibv_ud_pingpong` reserves in front of each receive buffer for the GRH.
pub const UD_GRH_LEN: usize = 40;

/// What each side tells the other: the `struct pingpong_dest` of rdma-core's examples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingpongDest {
    /// Local identifier; 0 on RoCE.
    pub lid: u16,
    /// The QP number (24 bits).
    pub qpn: u32,
    /// The first PSN this side will send (24 bits).
    pub psn: u32,
    /// The GID, raw bytes in network order (all zero when `-g` was not given).
    pub gid: [u8; 16],
}

/// Everything that can go wrong in the exchange. Each message names what to check.
#[derive(Debug, thiserror::Error)]
pub enum PingpongOobError {
    /// The TCP stream failed or closed early.
    #[error("out-of-band TCP exchange failed while {during}: {source} (is the peer running the same tool with the same -p port?)")]
    Io {
        /// Which step was running.
        during: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The peer's address message is not `LID:QPN:PSN:GID`.
    #[error("malformed address message from peer ({reason}): {text:?}; expected \"%04x:%06x:%06x:<32 hex GID>\" as sent by ibv_rc_pingpong/ibv_ud_pingpong")]
    Malformed {
        /// What was wrong.
        reason: &'static str,
        /// The message as text, up to its NUL.
        text: String,
    },
    /// The peer sent nothing (or not enough) within the set-up bound.
    #[error("no answer from the peer within {secs} s while {during} (got {got} of {expected} bytes){hint}; check that the peer runs ibv_rc_pingpong/ibv_ud_pingpong or xroce pingpong, with the same -p port")]
    Timeout {
        /// Which step was running.
        during: &'static str,
        /// The bound, in seconds.
        secs: u64,
        /// Bytes the step expects.
        expected: usize,
        /// Bytes that arrived.
        got: usize,
        /// What the bytes that arrived show about the peer (may be empty).
        hint: String,
    },
    /// The peer's bytes show it runs another tool.
    #[error(
        "the peer runs another tool (seen while {during}){hint}; run the same tool on both sides"
    )]
    OtherTool {
        /// Which step was running.
        during: &'static str,
        /// What its bytes show.
        hint: String,
    },
    /// The client did not finish with `"done\0"`.
    #[error("peer ended the exchange with {got:?} instead of \"done\\0\"")]
    BadDone {
        /// What arrived instead.
        got: Vec<u8>,
    },
    /// Our own QP could not be connected (the callback failed).
    #[error("could not connect the local QP to the peer: {0}")]
    Connect(#[source] anyhow::Error),
}

impl PingpongDest {
    /// The GID as an IPv6 address, for printing the way `inet_ntop(AF_INET6, ..)` does
    /// (e.g. `::ffff:198.18.0.12`).
    pub fn gid_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.gid)
    }

    /// True if the GID's interface-id half is non-zero: rdma-core then sets a GRH
    /// (`is_global = 1`) in the address vector; on RoCE a GID is always needed.
    pub fn has_global_gid(&self) -> bool {
        self.gid[8..].iter().any(|&b| b != 0)
    }

    /// The 52-byte message: `"%04x:%06x:%06x:%s"` and NUL padding.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let mut gid_hex = String::with_capacity(32);
        for b in self.gid {
            gid_hex.push_str(&format!("{b:02x}"));
        }
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF,
            gid_hex
        );
        let mut msg = [0u8; MSG_LEN];
        // 4+1+6+1+6+1+32 = 51 bytes: always fits, with the NUL the buffer keeps.
        msg[..text.len()].copy_from_slice(text.as_bytes());
        msg
    }

    /// Parses a peer's message the way `sscanf("%x:%x:%x:%s")` + `wire_gid_to_gid` would,
    /// but rejects what sscanf would silently misread (missing fields, values out of
    /// range, a GID that is not 32 hex digits).
    pub fn decode(msg: &[u8]) -> Result<Self, PingpongOobError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = String::from_utf8_lossy(&msg[..end]).into_owned();
        let bad = |reason| PingpongOobError::Malformed {
            reason,
            text: text.clone(),
        };
        let mut parts = text.split(':');
        let mut hex_field = |name: &'static str, max: u32| -> Result<u32, PingpongOobError> {
            let field = parts.next().ok_or_else(|| bad(name))?;
            let value = u32::from_str_radix(field.trim(), 16).map_err(|_| bad(name))?;
            if value > max {
                return Err(bad(name));
            }
            Ok(value)
        };
        let lid = hex_field("LID is not a 16-bit hex number", 0xFFFF)? as u16;
        let qpn = hex_field("QPN is not a 24-bit hex number", 0xFF_FFFF)?;
        let psn = hex_field("PSN is not a 24-bit hex number", 0xFF_FFFF)?;
        let gid_text = parts.next().ok_or_else(|| bad("GID missing"))?;
        if parts.next().is_some() {
            return Err(bad("too many ':' fields"));
        }
        let gid = parse_wire_gid(gid_text).ok_or_else(|| bad("GID is not 32 hex digits"))?;
        Ok(PingpongDest { lid, qpn, psn, gid })
    }

    /// The line both tools print, e.g.
    /// `  local address:  LID 0x0000, QPN 0x000011, PSN 0x2fa524, GID ::ffff:198.18.0.12`.
    /// `side` is `"local address: "` or `"remote address:"`; `ud_local` reproduces
    /// `ibv_ud_pingpong`'s local line, which has `": GID"` instead of `", GID"`.
    pub fn address_line(&self, side: &str, ud_local: bool) -> String {
        format!(
            "  {side} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{} GID {}",
            self.lid,
            self.qpn,
            self.psn,
            if ud_local { ":" } else { "," },
            self.gid_addr()
        )
    }
}

/// 32 hex digits to 16 bytes (either case, as `sscanf("%x")` accepts).
fn parse_wire_gid(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != 32 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, pair) in text.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        gid[i] = (hi * 16 + lo) as u8;
    }
    Some(gid)
}

fn io(during: &'static str) -> impl FnOnce(std::io::Error) -> PingpongOobError {
    move |source| PingpongOobError::Io { during, source }
}

/// Reads one message within `bound`; a short message names what the peer looks like.
fn read_msg<S: OobStream>(
    stream: &mut S,
    buf: &mut [u8],
    bound: Duration,
    during: &'static str,
    if_silent: &str,
) -> Result<(), PingpongOobError> {
    match setup::read_full(stream, buf) {
        Ok(()) => Ok(()),
        Err((n, e)) if setup::is_timeout(&e) => {
            let mut hint = setup::peer_hint(&buf[..n]);
            if n == 0 {
                hint.push_str(if_silent);
            }
            Err(PingpongOobError::Timeout {
                during,
                secs: bound.as_secs_f64().ceil() as u64,
                expected: buf.len(),
                got: n,
                hint,
            })
        }
        Err((n, _)) if matches!(setup::identify_peer(&buf[..n]), Some(tool) if tool != setup::PeerTool::Pingpong) => {
            Err(PingpongOobError::OtherTool {
                during,
                hint: setup::peer_hint(&buf[..n]),
            })
        }
        Err((_, e)) => Err(PingpongOobError::Io { during, source: e }),
    }
}

/// The client side (`pp_client_exch_dest`): send ours, read theirs, send `"done\0"`.
/// The caller connects its QP afterwards. Each read waits at most
/// [`setup::SETUP_TIMEOUT`].
pub fn client_exchange<S: OobStream>(
    stream: &mut S,
    mine: &PingpongDest,
) -> Result<PingpongDest, PingpongOobError> {
    client_exchange_within(stream, mine, setup::SETUP_TIMEOUT)
}

/// [`client_exchange`] with reads bounded by `bound`.
pub fn client_exchange_within<S: OobStream>(
    stream: &mut S,
    mine: &PingpongDest,
    bound: Duration,
) -> Result<PingpongDest, PingpongOobError> {
    stream
        .bound_reads(Some(bound))
        .map_err(io("setting the set-up timeout"))?;
    stream
        .write_all(&mine.encode())
        .map_err(io("sending the local address"))?;
    let mut msg = [0u8; MSG_LEN];
    read_msg(stream, &mut msg, bound, "reading the remote address", "")?;
    stream.write_all(DONE).map_err(io("sending \"done\""))?;
    stream.flush().map_err(io("sending \"done\""))?;
    stream
        .bound_reads(None)
        .map_err(io("clearing the set-up timeout"))?;
    decode_from_peer(&msg)
}

/// [`PingpongDest::decode`], naming the peer's tool when its message is another tool's.
fn decode_from_peer(msg: &[u8]) -> Result<PingpongDest, PingpongOobError> {
    PingpongDest::decode(msg).map_err(|e| match setup::identify_peer(msg) {
        Some(tool) if tool != setup::PeerTool::Pingpong => PingpongOobError::OtherTool {
            during: "reading the remote address",
            hint: setup::peer_hint(msg),
        },
        _ => e,
    })
}

/// The server side (`pp_server_exch_dest`): read the client's address, call `connect` with
/// it (move the QP to RTR/RTS), and only then answer with ours and wait for `"done\0"`.
/// Each read waits at most [`setup::SETUP_TIMEOUT`].
pub fn server_exchange<S, F>(
    stream: &mut S,
    mine: &PingpongDest,
    connect: F,
) -> Result<PingpongDest, PingpongOobError>
where
    S: OobStream,
    F: FnOnce(&PingpongDest) -> anyhow::Result<()>,
{
    server_exchange_within(stream, mine, connect, setup::SETUP_TIMEOUT)
}

/// [`server_exchange`] with reads bounded by `bound`.
pub fn server_exchange_within<S, F>(
    stream: &mut S,
    mine: &PingpongDest,
    connect: F,
    bound: Duration,
) -> Result<PingpongDest, PingpongOobError>
where
    S: OobStream,
    F: FnOnce(&PingpongDest) -> anyhow::Result<()>,
{
    stream
        .bound_reads(Some(bound))
        .map_err(io("setting the set-up timeout"))?;
    let mut msg = [0u8; MSG_LEN];
    read_msg(
        stream,
        &mut msg,
        bound,
        "reading the remote address",
        "; the peer connected but sent nothing (a pingpong client writes first)",
    )?;
    let remote = decode_from_peer(&msg)?;
    connect(&remote).map_err(PingpongOobError::Connect)?;
    stream
        .write_all(&mine.encode())
        .map_err(io("sending the local address"))?;
    stream.flush().map_err(io("sending the local address"))?;
    let mut done = [0u8; DONE.len()];
    read_msg(stream, &mut done, bound, "waiting for \"done\"", "")?;
    if &done != DONE {
        return Err(PingpongOobError::BadDone { got: done.to_vec() });
    }
    stream
        .bound_reads(None)
        .map_err(io("clearing the set-up timeout"))?;
    Ok(remote)
}

/// How many addresses `ibv_srq_pingpong` sends each way, whatever its `-q` (its `MAX_QP`):
/// those past the QPs in use are all zero (`"0000:000000:000000:0000...0"`).
pub const SRQ_MAX_QP: usize = 256;

/// The client side of `ibv_srq_pingpong`'s exchange: [`client_exchange`] with
/// `mine.len()` messages each way (all of ours, then all of the peer's), then `"done\0"`.
pub fn client_exchange_all<S: OobStream>(
    stream: &mut S,
    mine: &[PingpongDest],
) -> Result<Vec<PingpongDest>, PingpongOobError> {
    let bound = setup::SETUP_TIMEOUT;
    stream
        .bound_reads(Some(bound))
        .map_err(io("setting the set-up timeout"))?;
    let mut out = Vec::with_capacity(mine.len() * MSG_LEN);
    for dest in mine {
        out.extend_from_slice(&dest.encode());
    }
    stream
        .write_all(&out)
        .map_err(io("sending the local addresses"))?;
    let mut remote = Vec::with_capacity(mine.len());
    let mut msg = [0u8; MSG_LEN];
    for _ in mine {
        read_msg(stream, &mut msg, bound, "reading the remote addresses", "")?;
        remote.push(decode_from_peer(&msg)?);
    }
    stream.write_all(DONE).map_err(io("sending \"done\""))?;
    stream.flush().map_err(io("sending \"done\""))?;
    stream
        .bound_reads(None)
        .map_err(io("clearing the set-up timeout"))?;
    Ok(remote)
}

/// The server side of `ibv_srq_pingpong`'s exchange: read `mine.len()` addresses, `connect`
/// the QPs to them, answer with ours and wait for `"done\0"`.
pub fn server_exchange_all<S, F>(
    stream: &mut S,
    mine: &[PingpongDest],
    connect: F,
) -> Result<Vec<PingpongDest>, PingpongOobError>
where
    S: OobStream,
    F: FnOnce(&[PingpongDest]) -> anyhow::Result<()>,
{
    let bound = setup::SETUP_TIMEOUT;
    stream
        .bound_reads(Some(bound))
        .map_err(io("setting the set-up timeout"))?;
    let mut remote = Vec::with_capacity(mine.len());
    let mut msg = [0u8; MSG_LEN];
    for i in 0..mine.len() {
        let silent = if i == 0 {
            "; the peer connected but sent nothing (a pingpong client writes first)"
        } else {
            "; the peer sent fewer addresses than ibv_srq_pingpong's 256 (is it ibv_rc_pingpong?)"
        };
        read_msg(
            stream,
            &mut msg,
            bound,
            "reading the remote addresses",
            silent,
        )?;
        remote.push(decode_from_peer(&msg)?);
    }
    connect(&remote).map_err(PingpongOobError::Connect)?;
    let mut out = Vec::with_capacity(mine.len() * MSG_LEN);
    for dest in mine {
        out.extend_from_slice(&dest.encode());
    }
    stream
        .write_all(&out)
        .map_err(io("sending the local addresses"))?;
    stream.flush().map_err(io("sending the local addresses"))?;
    let mut done = [0u8; DONE.len()];
    read_msg(stream, &mut done, bound, "waiting for \"done\"", "")?;
    if &done != DONE {
        return Err(PingpongOobError::BadDone { got: done.to_vec() });
    }
    stream
        .bound_reads(None)
        .map_err(io("clearing the set-up timeout"))?;
    Ok(remote)
}

/// The two result lines both tools print at the end, e.g.
/// `8192000 bytes in 0.01 seconds = 6553.60 Mbit/sec` and
/// `1000 iters in 0.01 seconds = 10.00 usec/iter`. `usec` is the elapsed time; the byte
/// count is `size * iters * 2` (both directions), as in rdma-core.
pub fn result_lines(size: u64, iters: u64, usec: f64) -> [String; 2] {
    let bytes = size * iters * 2;
    // rdma-core computes in float; a zero duration would print inf, guard it.
    let usec = if usec > 0.0 { usec } else { f64::MIN_POSITIVE };
    [
        format!(
            "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
            bytes,
            usec / 1_000_000.0,
            bytes as f64 * 8.0 / usec
        ),
        format!(
            "{} iters in {:.2} seconds = {:.2} usec/iter",
            iters,
            usec / 1_000_000.0,
            usec / iters.max(1) as f64
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    // The client's message from rxe_rc_pingpong.pcap (198.18.0.12, QPN 0x11).
    const CLIENT_MSG: &[u8; MSG_LEN] = b"0000:000011:2fa524:00000000000000000000ffffc612000c\0";

    #[test]
    fn decodes_and_reencodes_a_real_message() {
        let dest = PingpongDest::decode(CLIENT_MSG).unwrap();
        assert_eq!(dest.lid, 0);
        assert_eq!(dest.qpn, 0x11);
        assert_eq!(dest.psn, 0x2fa524);
        assert_eq!(dest.gid_addr().to_string(), "::ffff:198.18.0.12");
        assert!(dest.has_global_gid());
        assert_eq!(&dest.encode(), CLIENT_MSG);
    }

    #[test]
    fn address_lines_match_rdma_core() {
        let dest = PingpongDest::decode(CLIENT_MSG).unwrap();
        assert_eq!(
            dest.address_line("local address: ", false),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x2fa524, GID ::ffff:198.18.0.12"
        );
        assert_eq!(
            dest.address_line("local address: ", true),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x2fa524: GID ::ffff:198.18.0.12"
        );
    }

    #[test]
    fn rejects_malformed_messages() {
        for bad in [
            &b"0000:000011:2fa524\0"[..],
            b"0000:1000000:2fa524:00000000000000000000ffffc612000c\0",
            b"0000:000011:2fa524:00000000000000000000ffffc612000\0",
            b"0000:000011:2fa524:0000000000000000000gffffc612000c\0",
            b"zzzz:000011:2fa524:00000000000000000000ffffc612000c\0",
            b"",
        ] {
            assert!(
                matches!(
                    PingpongDest::decode(bad),
                    Err(PingpongOobError::Malformed { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn result_lines_format() {
        let [a, b] = result_lines(4096, 1000, 10_000.0);
        assert_eq!(a, "8192000 bytes in 0.01 seconds = 6553.60 Mbit/sec");
        assert_eq!(b, "1000 iters in 0.01 seconds = 10.00 usec/iter");
    }
}
