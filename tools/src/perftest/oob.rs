//! perftest's out-of-band TCP exchange (`ib_write_bw`, `ib_read_lat`, ...), byte for byte.
//!
//! Source: linux-rdma/perftest `src/perftest_communication.c`, checked against the streams
//! recorded from perftest 4.5-0.17 (announces itself as "6.06", Debian bookworm) in
//! `tests/fixtures/oob/`. Every exchange is symmetric: the **client writes first**, then
//! reads; the server reads, then writes (`ctx_xchg_data_ethernet`). Integers are big-endian.
//!
//! | step | bytes each way | when |
//! |---|---|---|
//! | version | 16: `char version[16]`, e.g. `"6.06"` NUL-padded | unless `--dont_xchg_versions` |
//! | page size ("cycle buffer") | 4, `htonl` | peer >= 5.32 |
//! | cache-line size | 4, `htonl` | peer >= 5.32 |
//! | MTU | `"%d"` of the `ibv_mtu` enum ("3" = 1024) in 2 bytes (4 if peer < 5.31) | peer >= 5.1 |
//! | parameter block | `struct perftest_parameters_negotiate` (see [`NegotiateParams`]) | both >= 6.28 |
//! | QP address | 59 B `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"` or 108 B with GID | per QP, several rounds |
//! | bandwidth report | size (8), iters (8; 4 if peer < 5.33), peak, avg, msg rate (`double`, byte-swapped to big-endian) | bw tests, after the run |
//! | close | one more QP-address round, then both write `"done\0"` | end |
//!
//! Each side takes the larger page and cache-line size and the smaller MTU. The QP address
//! rounds are barriers as much as data: the same message is sent again and again. Which
//! rounds happen depends on the test ([`script`]), and both sides must agree, so the order
//! here follows each perftest main() exactly.
//!
//! perftest 6.06 quirk: with `--dont_xchg_versions` the remote version stays empty and
//! perftest then refuses to run ("not compatible with versions older than 5.70"). xroce
//! instead skips the version, page-size, MTU and parameter steps and assumes the peer
//! speaks its own version, which works xroce-to-xroce.

use std::net::Ipv6Addr;
use std::time::Duration;

use crate::setup::{self, OobStream, PeerTool};

/// The version perftest 4.5+0.17 (Debian bookworm) announces.
pub const BOOKWORM_VERSION: &str = "6.06";
/// The first version that sends the parameter block.
#[allow(clippy::approx_constant)] // a version number that happens to be close to tau
pub const NEGOTIATE_MIN_VERSION: f64 = 6.28;
/// perftest refuses peers older than this (`check_version_compatibility`).
pub const MIN_COMPATIBLE_VERSION: f64 = 5.70;
/// `char version[MAX_VERSION]`.
pub const VERSION_LEN: usize = 16;
/// `KEY_MSG_SIZE`: a QP address without GID, NUL included.
pub const KEY_MSG_SIZE: usize = 59;
/// `KEY_MSG_SIZE_GID`: a QP address with GID, NUL included.
pub const KEY_MSG_SIZE_GID: usize = 108;
/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// `sizeof(struct ibv_device_attr)` on x86-64.
pub const DEVICE_ATTR_LEN: usize = 232;
/// Offset of `max_qp_rd_atom` inside `struct ibv_device_attr` (x86-64).
pub const DEVICE_ATTR_MAX_QP_RD_ATOM: usize = 144;

/// Which end of the TCP connection this is. The client writes first in every exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Connects to the server; perftest's `servername` is set.
    Client,
    /// Listens and waits.
    Server,
}

/// What an I/O failure of the exchange means for the user. A closed connection is a peer
/// that stopped (killed, crashed, or it refused our options and said why in its own
/// output): asking whether it runs the same test would mislead.
fn io_cause(e: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => format!(
            "the peer closed the connection ({e}): it stopped, was killed or gave up; its own output says why"
        ),
        _ => format!(
            "{e} (does the peer run the same test, with the same -s/-a/-q/-x/-c options and port?)"
        ),
    }
}

/// Errors of the exchange. Messages say what the peer is expected to be.
#[derive(Debug, thiserror::Error)]
pub enum PerftestOobError {
    /// The TCP stream failed or closed early.
    #[error(
        "perftest out-of-band exchange failed while {during}: {}",
        io_cause(source)
    )]
    Io {
        /// Which step was running.
        during: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The peer's version is older than perftest accepts.
    #[error("peer perftest version {0:?} is older than 5.70, which perftest itself refuses; upgrade the peer")]
    VersionTooOld(String),
    /// The peer's first bytes are another tool's message, not perftest's version.
    #[error("the peer does not speak perftest's exchange: its first bytes {text:?} look like {peer}; {advice}")]
    NotPerftest {
        /// The bytes as text, up to the first NUL.
        text: String,
        /// What they look like.
        peer: String,
        /// What to run instead.
        advice: &'static str,
    },
    /// The peer sent nothing (or not enough) within the set-up bound.
    #[error("no answer from the peer within {secs} s while {during} (got {got} of {expected} bytes){hint}; check that both sides run the same test (xroce perf or perftest) with the same options")]
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
    /// The peer runs a different perftest test (see docs/tools.md for what is detected).
    #[error("the peer runs another test: {0}")]
    OtherTest(String),
    /// A QP address message could not be parsed.
    #[error("malformed QP address from peer ({reason}): {text:?}")]
    MalformedDest {
        /// What was wrong.
        reason: &'static str,
        /// The message up to its NUL.
        text: String,
    },
    /// The parameter blocks differ in a field perftest requires to match.
    #[error("perftest parameter mismatch: {0}; run both sides with the same test and options")]
    ParamMismatch(String),
    /// The GID types differ (one side IPv4-mapped, the other not).
    #[error("GID types differ (local {local}, remote {remote}): use GIDs of the same IP version on both sides (-x)")]
    GidTypeMismatch {
        /// Our GID.
        local: Ipv6Addr,
        /// Theirs.
        remote: Ipv6Addr,
    },
}

fn io(during: &'static str) -> impl FnOnce(std::io::Error) -> PerftestOobError {
    move |source| PerftestOobError::Io { during, source }
}

/// `atof()` of a version string: the leading decimal number, 0.0 if none.
pub fn version_number(version: &str) -> f64 {
    let text: String = version
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    // "6.06.1" would be 6.06 for atof; keep up to the second dot.
    let mut dots = 0;
    let cut: String = text
        .chars()
        .take_while(|&c| {
            if c == '.' {
                dots += 1;
            }
            dots < 2
        })
        .collect();
    cut.parse().unwrap_or(0.0)
}

/// One QP's address: perftest's `struct pingpong_dest` as it crosses the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerftestDest {
    /// LID; 0 on RoCE.
    pub lid: u16,
    /// Outstanding RDMA READ/atomic requests this side allows (`-o`).
    pub out_reads: u32,
    /// QP number.
    pub qpn: u32,
    /// First PSN.
    pub psn: u32,
    /// R_Key of the buffer the peer may access.
    pub rkey: u32,
    /// Virtual address of that buffer.
    pub vaddr: u64,
    /// GID (raw bytes); `None` sends the 59-byte form (no `-x`).
    pub gid: Option<[u8; 16]>,
    /// SRQ number (XRC/DC only; 0 here).
    pub srqn: u32,
}

impl PerftestDest {
    /// Length of this message on the wire.
    pub fn wire_len(with_gid: bool) -> usize {
        if with_gid {
            KEY_MSG_SIZE_GID
        } else {
            KEY_MSG_SIZE
        }
    }

    /// `KEY_PRINT_FMT` (59 B) or `KEY_PRINT_FMT_GID` (108 B, note the trailing ':').
    pub fn encode(&self) -> Vec<u8> {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads & 0xFFFF,
            self.qpn & 0xFF_FFFF,
            self.psn & 0xFF_FFFF,
            self.rkey,
            self.vaddr
        );
        let len = Self::wire_len(self.gid.is_some());
        if let Some(gid) = self.gid {
            for b in gid {
                text.push_str(&format!("{b:02x}:"));
            }
            text.push_str(&format!("{:08x}:", self.srqn));
        } else {
            text.push_str(&format!("{:08x}", self.srqn));
        }
        let mut msg = text.into_bytes();
        msg.resize(len, 0);
        msg
    }

    /// Parses either form. `with_gid` says which one was expected (both sides use `-x`
    /// alike; perftest decides by its own `gid_index`).
    pub fn decode(msg: &[u8], with_gid: bool) -> Result<Self, PerftestOobError> {
        let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
        let text = String::from_utf8_lossy(&msg[..end]).into_owned();
        let bad = |reason| PerftestOobError::MalformedDest {
            reason,
            text: text.clone(),
        };
        let fields: Vec<&str> = text.split(':').collect();
        // Without GID: 7 fields. With GID: 6 + 16 + SRQN + the empty one after the last ':'.
        let expected = if with_gid { 24 } else { 7 };
        if fields.len() != expected {
            return Err(bad(if with_gid {
                "expected 23 ':'-terminated fields (LID:OUT:QPN:PSN:RKEY:VA:16 GID bytes:SRQN:); is the peer using -x too?"
            } else {
                "expected 7 fields LID:OUT:QPN:PSN:RKEY:VA:SRQN; does the peer use -x (GID) while we do not?"
            }));
        }
        let hex = |i: usize, max: u64, what| -> Result<u64, PerftestOobError> {
            let v = u64::from_str_radix(fields[i], 16).map_err(|_| bad(what))?;
            if v > max {
                return Err(bad(what));
            }
            Ok(v)
        };
        let lid = hex(0, 0xFFFF, "LID")? as u16;
        let out_reads = hex(1, 0xFFFF, "outstanding reads")? as u32;
        let qpn = hex(2, 0xFF_FFFF, "QPN")? as u32;
        let psn = hex(3, 0xFF_FFFF, "PSN")? as u32;
        let rkey = hex(4, 0xFFFF_FFFF, "R_Key")? as u32;
        let vaddr = hex(5, u64::MAX, "VA")?;
        let (gid, srqn) = if with_gid {
            let mut gid = [0u8; 16];
            for (k, byte) in gid.iter_mut().enumerate() {
                *byte = hex(6 + k, 0xFF, "GID byte")? as u8;
            }
            if !fields[23].is_empty() {
                return Err(bad("text after the final ':'"));
            }
            (Some(gid), hex(22, 0xFFFF_FFFF, "SRQN")? as u32)
        } else {
            (None, hex(6, 0xFFFF_FFFF, "SRQN")? as u32)
        };
        Ok(PerftestDest {
            lid,
            out_reads,
            qpn,
            psn,
            rkey,
            vaddr,
            gid,
            srqn,
        })
    }
}

/// `sizeof(struct pingpong_dest)` on x86-64: the address message over rdma_cm.
pub const DEST_BINARY_LEN: usize = 56;

impl PerftestDest {
    /// The form `rdma_write_keys` sends over an rdma_cm side channel: the raw
    /// `struct pingpong_dest` with its integers big-endian (lid, out_reads, qpn, psn, rkey at
    /// 0..20, 4 bytes padding, vaddr at 24, the GID at 32, srqn at 48, gid_index at 52).
    pub fn encode_binary(&self, gid_index: i32) -> [u8; DEST_BINARY_LEN] {
        let mut m = [0u8; DEST_BINARY_LEN];
        m[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        m[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        m[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        m[12..16].copy_from_slice(&self.psn.to_be_bytes());
        m[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        m[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        m[32..48].copy_from_slice(&self.gid.unwrap_or([0; 16]));
        m[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        m[52..56].copy_from_slice(&gid_index.to_be_bytes());
        m
    }

    /// Parses [`Self::encode_binary`]'s form (`rdma_read_keys` takes all but srqn and
    /// gid_index).
    pub fn decode_binary(m: &[u8]) -> Result<Self, PerftestOobError> {
        if m.len() < DEST_BINARY_LEN {
            return Err(PerftestOobError::MalformedDest {
                reason: "an rdma_cm address message is 56 bytes (struct pingpong_dest)",
                text: format!("{} bytes", m.len()),
            });
        }
        let be32 = |o: usize| u32::from_be_bytes(m[o..o + 4].try_into().unwrap_or([0; 4]));
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&m[32..48]);
        Ok(PerftestDest {
            lid: be32(0) as u16,
            out_reads: be32(4),
            qpn: be32(8),
            psn: be32(12),
            rkey: be32(16),
            vaddr: u64::from_be_bytes(m[24..32].try_into().unwrap_or([0; 8])),
            gid: Some(gid),
            srqn: be32(48),
        })
    }
}

/// Page ("cycle buffer") and cache-line size, exchanged so both sides size buffers alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SysData {
    /// `sysconf(_SC_PAGESIZE)`, usually 4096.
    pub page_size: u32,
    /// L1 cache line, usually 64.
    pub cache_line: u32,
}

/// The `ibv_mtu` enum: 1 = 256, 2 = 512, 3 = 1024, 4 = 2048, 5 = 4096.
pub fn mtu_enum(bytes: u32) -> Option<u8> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// Bytes of an `ibv_mtu` enum value (`MTU_SIZE`).
pub fn mtu_bytes(mtu_enum: u8) -> Option<u32> {
    (1..=5).contains(&mtu_enum).then(|| 128u32 << mtu_enum)
}

/// perftest's enums, as numbered in `perftest_parameters.h`.
#[allow(missing_docs)]
pub mod enums {
    pub const RUN_REGULAR: i32 = 0;
    pub const RUN_ALL: i32 = 1;
    pub const CONN_RC: i32 = 0;
    pub const CONN_UC: i32 = 1;
    pub const CONN_UD: i32 = 2;
    pub const VERB_SEND: i32 = 0;
    pub const VERB_WRITE: i32 = 2;
    pub const VERB_READ: i32 = 4;
    pub const VERB_ATOMIC: i32 = 5;
    pub const TST_LAT: i32 = 0;
    pub const TST_BW: i32 = 1;
    pub const CMP_AND_SWAP: i32 = 0;
    pub const FETCH_AND_ADD: i32 = 1;
    pub const ITERATIONS: i32 = 0;
    pub const DURATION: i32 = 1;
    pub const GBS: i32 = 0;
    pub const MBS: i32 = 1;
}

/// perftest >= 6.28's `struct perftest_parameters_negotiate` (x86-64 layout): the test
/// parameters each side checks for equality, then the raw `struct ibv_device_attr`
/// (host byte order, 232 B) and, when perftest was built with mlx5dv, an 8-byte
/// `mlx5dv_comp_mask`. Layout: 7 x i32 (0..28), pad to 32, size u64 (32), iters u64
/// (40), 8 x i32 (48..80), device attributes (80..312), [mlx5dv u64 (312..320)].
/// Integer fields are big-endian (`hton_int`, `hton_64`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NegotiateParams {
    /// `enum ctx_test_method`: RUN_REGULAR 0, RUN_ALL 1, RUN_INFINITELY 2.
    pub test_method: i32,
    /// RC 0, UC 1, UD 2, ...
    pub connection_type: i32,
    /// SEND 0, SEND_IMM 1, WRITE 2, WRITE_IMM 3, READ 4, ATOMIC 5.
    pub verb: i32,
    /// LAT 0, BW 1.
    pub tst: i32,
    /// CMP_AND_SWAP 0, FETCH_AND_ADD 1.
    pub atomic_type: i32,
    /// ITERATIONS 0, DURATION 1.
    pub test_type: i32,
    /// GBS 0, MBS 1.
    pub report_fmt: i32,
    /// Message size.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// AES-XTS offload (0).
    pub aes_xts: i32,
    /// Number of QPs.
    pub num_of_qps: i32,
    /// `-D` seconds.
    pub duration: i32,
    /// rdma_cm (0).
    pub use_rdma_cm: i32,
    /// WRITE_WITH_IMM (0).
    pub use_write_with_imm: i32,
    /// mlx5 enhanced reorder disabled.
    pub no_enhanced_reorder: i32,
    /// Signature offload (0).
    pub sig_offload: i32,
    /// Data validation (0).
    pub data_validation: i32,
    /// `struct ibv_device_attr`, raw, host (little-endian) order.
    pub device_attr: [u8; DEVICE_ATTR_LEN],
    /// Present when the block includes perftest's mlx5dv field.
    pub mlx5dv_comp_mask: Option<u64>,
}

impl NegotiateParams {
    /// Length on the wire: 312, or 320 with the mlx5dv field.
    pub fn wire_len(with_mlx5dv: bool) -> usize {
        80 + DEVICE_ATTR_LEN + if with_mlx5dv { 8 } else { 0 }
    }

    /// A device-attribute block with the fields perftest reads filled in.
    pub fn device_attr_block(max_qp_rd_atom: i32) -> [u8; DEVICE_ATTR_LEN] {
        let mut attr = [0u8; DEVICE_ATTR_LEN];
        attr[DEVICE_ATTR_MAX_QP_RD_ATOM..DEVICE_ATTR_MAX_QP_RD_ATOM + 4]
            .copy_from_slice(&max_qp_rd_atom.to_le_bytes());
        attr
    }

    /// The peer's `max_qp_rd_atom` (perftest lowers `out_reads` to it).
    pub fn max_qp_rd_atom(&self) -> i32 {
        let at = DEVICE_ATTR_MAX_QP_RD_ATOM;
        i32::from_le_bytes(self.device_attr[at..at + 4].try_into().unwrap_or([0; 4]))
    }

    /// Serializes in perftest's layout.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(Self::wire_len(self.mlx5dv_comp_mask.is_some()));
        for v in [
            self.test_method,
            self.connection_type,
            self.verb,
            self.tst,
            self.atomic_type,
            self.test_type,
            self.report_fmt,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.size.to_be_bytes());
        out.extend_from_slice(&self.iters.to_be_bytes());
        for v in [
            self.aes_xts,
            self.num_of_qps,
            self.duration,
            self.use_rdma_cm,
            self.use_write_with_imm,
            self.no_enhanced_reorder,
            self.sig_offload,
            self.data_validation,
        ] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&self.device_attr);
        if let Some(mask) = self.mlx5dv_comp_mask {
            out.extend_from_slice(&mask.to_be_bytes());
        }
        out
    }

    /// Parses a block of [`Self::wire_len`] bytes.
    pub fn decode(buf: &[u8]) -> Option<Self> {
        let with_mlx5dv = match buf.len() {
            n if n == Self::wire_len(false) => false,
            n if n == Self::wire_len(true) => true,
            _ => return None,
        };
        let i32_at = |at: usize| i32::from_be_bytes(buf[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_be_bytes(buf[at..at + 8].try_into().unwrap());
        let mut device_attr = [0u8; DEVICE_ATTR_LEN];
        device_attr.copy_from_slice(&buf[80..80 + DEVICE_ATTR_LEN]);
        Some(NegotiateParams {
            test_method: i32_at(0),
            connection_type: i32_at(4),
            verb: i32_at(8),
            tst: i32_at(12),
            atomic_type: i32_at(16),
            test_type: i32_at(20),
            report_fmt: i32_at(24),
            size: u64_at(32),
            iters: u64_at(40),
            aes_xts: i32_at(48),
            num_of_qps: i32_at(52),
            duration: i32_at(56),
            use_rdma_cm: i32_at(60),
            use_write_with_imm: i32_at(64),
            no_enhanced_reorder: i32_at(68),
            sig_offload: i32_at(72),
            data_validation: i32_at(76),
            device_attr,
            mlx5dv_comp_mask: with_mlx5dv.then(|| u64_at(80 + DEVICE_ATTR_LEN)),
        })
    }

    /// perftest's `compare()` over every field it checks; the first mismatch, named.
    pub fn check_matches(&self, remote: &Self) -> Result<(), PerftestOobError> {
        let pairs: [(&str, u64, u64); 17] = [
            (
                "test_method",
                self.test_method as u64,
                remote.test_method as u64,
            ),
            (
                "connection_type",
                self.connection_type as u64,
                remote.connection_type as u64,
            ),
            ("verb", self.verb as u64, remote.verb as u64),
            ("tst", self.tst as u64, remote.tst as u64),
            (
                "atomicType",
                self.atomic_type as u64,
                remote.atomic_type as u64,
            ),
            ("test_type", self.test_type as u64, remote.test_type as u64),
            (
                "report_fmt",
                self.report_fmt as u64,
                remote.report_fmt as u64,
            ),
            ("size", self.size, remote.size),
            ("iters", self.iters, remote.iters),
            ("aes_xts", self.aes_xts as u64, remote.aes_xts as u64),
            (
                "num_of_qps",
                self.num_of_qps as u64,
                remote.num_of_qps as u64,
            ),
            ("duration", self.duration as u64, remote.duration as u64),
            (
                "use_rdma_cm",
                self.use_rdma_cm as u64,
                remote.use_rdma_cm as u64,
            ),
            (
                "use_write_with_imm",
                self.use_write_with_imm as u64,
                remote.use_write_with_imm as u64,
            ),
            (
                "no_enhanced_reorder",
                self.no_enhanced_reorder as u64,
                remote.no_enhanced_reorder as u64,
            ),
            (
                "sig_offload",
                self.sig_offload as u64,
                remote.sig_offload as u64,
            ),
            (
                "data_validation",
                self.data_validation as u64,
                remote.data_validation as u64,
            ),
        ];
        for (name, local, rem) in pairs {
            if local != rem {
                return Err(PerftestOobError::ParamMismatch(format!(
                    "{name}: local={local}, remote={rem}"
                )));
            }
        }
        Ok(())
    }
}

/// A bandwidth result as exchanged after a bw test (`struct bw_report_data`, the fields
/// that cross the wire). Rates are in the unit of the report format (MB/s or Gb/s).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations measured.
    pub iters: u64,
    /// Peak bandwidth.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Average message rate, Mpps.
    pub msg_rate_avg: f64,
}

/// One step of a perftest conversation; [`script`] lists them in order for a test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The 16-byte version strings.
    Versions,
    /// Page size and cache-line size.
    SysData,
    /// The MTU string.
    Mtu,
    /// perftest >= 6.28's parameter block (skipped unless both sides are that new).
    Negotiate,
    /// One QP-address round for QP `i`.
    HandShake(usize),
    /// Connect the QPs (RTR/RTS) with the addresses learned so far; no bytes on TCP.
    /// With `-R` the QPs are already connected ([`Step::CmConnect`]): only the peer's
    /// addresses (R_Key, VA) are taken.
    Connect,
    /// `-R`: a QP-address round of an all-zero address, perftest's sync before and after
    /// it connects the test QPs through rdma_cm (`create_rdma_cm_connection`).
    SyncHandShake,
    /// `-R`: connect the test QPs through rdma_cm, one id per QP
    /// ([`PerftestRunner::cm_connect`]).
    CmConnect,
    /// Run the measurement for one message size; no bytes on TCP.
    Run(u64),
    /// Bandwidth report exchange.
    BwReports,
    /// `-b`: bandwidth report exchange, then the runner prints the sum of both
    /// directions ([`PerftestRunner::duplex_report`]).
    DuplexReports,
    /// Final QP-address round and `"done\0"`.
    Close,
}

/// The script of `-R` (perftest's `--rdma_cm`): every main calls
/// `create_rdma_cm_connection` right after the version/MTU steps, before any address round:
/// a zero-address round, the CM connection of the test QPs, another zero-address round.
/// The rest is unchanged; [`Step::Connect`] then only takes the peer's addresses.
pub fn with_rdma_cm(steps: &[Step]) -> Vec<Step> {
    let at = steps
        .iter()
        .position(|s| {
            !matches!(
                s,
                Step::Versions | Step::SysData | Step::Mtu | Step::Negotiate
            )
        })
        .unwrap_or(steps.len());
    let mut out = steps[..at].to_vec();
    out.extend([Step::SyncHandShake, Step::CmConnect, Step::SyncHandShake]);
    out.extend_from_slice(&steps[at..]);
    out
}

/// A test name that is none of the eight.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown test {typed:?}: one of send_bw, write_bw, read_bw, atomic_bw, send_lat, write_lat, read_lat, atomic_lat")]
pub struct UnknownTest {
    /// What was typed.
    pub typed: String,
}

impl std::str::FromStr for TestKind {
    type Err = UnknownTest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TestKind::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| UnknownTest {
                typed: s.to_string(),
            })
    }
}

/// The eight tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// `ib_send_bw`
    SendBw,
    /// `ib_write_bw`
    WriteBw,
    /// `ib_read_bw`
    ReadBw,
    /// `ib_atomic_bw`
    AtomicBw,
    /// `ib_send_lat`
    SendLat,
    /// `ib_write_lat`
    WriteLat,
    /// `ib_read_lat`
    ReadLat,
    /// `ib_atomic_lat`
    AtomicLat,
}

impl TestKind {
    /// All tests, in the order of the command's help.
    pub const ALL: [TestKind; 8] = [
        TestKind::SendBw,
        TestKind::WriteBw,
        TestKind::ReadBw,
        TestKind::AtomicBw,
        TestKind::SendLat,
        TestKind::WriteLat,
        TestKind::ReadLat,
        TestKind::AtomicLat,
    ];

    /// The perftest binary this test mirrors.
    pub fn perftest_binary(self) -> &'static str {
        match self {
            TestKind::SendBw => "ib_send_bw",
            TestKind::WriteBw => "ib_write_bw",
            TestKind::ReadBw => "ib_read_bw",
            TestKind::AtomicBw => "ib_atomic_bw",
            TestKind::SendLat => "ib_send_lat",
            TestKind::WriteLat => "ib_write_lat",
            TestKind::ReadLat => "ib_read_lat",
            TestKind::AtomicLat => "ib_atomic_lat",
        }
    }

    /// The test's name on the command line (`xroce perf send_bw`), as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            TestKind::SendBw => "send_bw",
            TestKind::WriteBw => "write_bw",
            TestKind::ReadBw => "read_bw",
            TestKind::AtomicBw => "atomic_bw",
            TestKind::SendLat => "send_lat",
            TestKind::WriteLat => "write_lat",
            TestKind::ReadLat => "read_lat",
            TestKind::AtomicLat => "atomic_lat",
        }
    }

    /// One line of help: what the test measures, and the perftest program it mirrors.
    pub fn about(self) -> &'static str {
        match self {
            TestKind::SendBw => "SEND bandwidth (ib_send_bw)",
            TestKind::WriteBw => "RDMA WRITE bandwidth (ib_write_bw)",
            TestKind::ReadBw => "RDMA READ bandwidth (ib_read_bw)",
            TestKind::AtomicBw => "Atomic bandwidth (ib_atomic_bw)",
            TestKind::SendLat => "SEND latency, ping-pong (ib_send_lat)",
            TestKind::WriteLat => "RDMA WRITE latency, ping-pong through memory (ib_write_lat)",
            TestKind::ReadLat => "RDMA READ latency (ib_read_lat)",
            TestKind::AtomicLat => "Atomic latency (ib_atomic_lat)",
        }
    }

    /// Bandwidth (true) or latency (false).
    pub fn is_bw(self) -> bool {
        matches!(
            self,
            TestKind::SendBw | TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw
        )
    }

    /// perftest's `VerbType` number.
    pub fn verb(self) -> i32 {
        match self {
            TestKind::SendBw | TestKind::SendLat => enums::VERB_SEND,
            TestKind::WriteBw | TestKind::WriteLat => enums::VERB_WRITE,
            TestKind::ReadBw | TestKind::ReadLat => enums::VERB_READ,
            TestKind::AtomicBw | TestKind::AtomicLat => enums::VERB_ATOMIC,
        }
    }

    /// The verb as perftest prints it in the header ("Send", "RDMA_Write", ...).
    pub fn verb_name(self) -> &'static str {
        match self.verb() {
            enums::VERB_SEND => "Send",
            enums::VERB_WRITE => "RDMA_Write",
            enums::VERB_READ => "RDMA_Read",
            _ => "Atomic",
        }
    }

    /// True for tests that READ or use atomics (they report outstanding reads and, for
    /// latency, count the whole round trip as one sample).
    pub fn is_read_like(self) -> bool {
        matches!(self.verb(), enums::VERB_READ | enums::VERB_ATOMIC)
    }

    /// perftest's default message size (`DEF_SIZE_BW` 65536, `DEF_SIZE_LAT` 2, atomics 8).
    pub fn default_size(self) -> u64 {
        match self {
            TestKind::AtomicBw | TestKind::AtomicLat => 8,
            k if k.is_bw() => 65536,
            _ => 2,
        }
    }

    /// Sizes `-a` runs: 2^1 .. 2^23 (2 B .. 8 MiB) as perftest; atomics only 8 B; UD sends
    /// up to the MTU.
    pub fn run_all_sizes(self, ud_mtu: Option<u32>) -> Vec<u64> {
        if self.verb() == enums::VERB_ATOMIC {
            return vec![8];
        }
        let max_pow = match ud_mtu {
            Some(mtu) if self.verb() == enums::VERB_SEND => mtu.trailing_zeros() + 1,
            _ => 24,
        };
        (1..max_pow).map(|i| 1u64 << i).collect()
    }
}

/// The conversation of one test for one role, as perftest 6.06's main() does it
/// (non-duplex, `RUN_REGULAR` for one size or `RUN_ALL` for several).
pub fn script(kind: TestKind, role: Role, sizes: &[u64], num_qps: usize) -> Vec<Step> {
    script_with(kind, role, sizes, num_qps, false)
}

/// [`script`], or with `duplex` (`-b`) the bidirectional conversation of write_bw, read_bw
/// and atomic_bw (perftest's main() with `user_param.duplex`): both roles run every size,
/// each run between a handshake before (and with several sizes one after, perftest >= 4.6),
/// each followed by the report exchange; no final report round.
pub fn script_with(
    kind: TestKind,
    role: Role,
    sizes: &[u64],
    num_qps: usize,
    duplex: bool,
) -> Vec<Step> {
    if duplex
        && matches!(
            kind,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw
        )
    {
        let mut steps = vec![Step::Versions, Step::SysData, Step::Mtu, Step::Negotiate];
        steps.extend((0..num_qps).map(Step::HandShake));
        steps.push(Step::Connect);
        steps.extend((0..num_qps).map(Step::HandShake));
        steps.push(Step::HandShake(0)); // "additional handshake after moving qp to RTR"
        for &size in sizes {
            steps.extend([Step::HandShake(0), Step::Run(size)]);
            if sizes.len() > 1 {
                steps.push(Step::HandShake(0));
            }
            steps.push(Step::DuplexReports);
        }
        steps.push(Step::Close);
        return steps;
    }
    let mut steps = vec![Step::Versions, Step::SysData, Step::Mtu, Step::Negotiate];
    let per_qp = |steps: &mut Vec<Step>| steps.extend((0..num_qps).map(Step::HandShake));
    let run_all = sizes.len() > 1;
    match kind {
        TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw => {
            per_qp(&mut steps);
            steps.push(Step::Connect);
            per_qp(&mut steps);
            steps.push(Step::HandShake(0)); // "additional handshake after moving qp to RTR"
            if role == Role::Client {
                steps.extend(sizes.iter().map(|&s| Step::Run(s)));
            }
            steps.extend([Step::HandShake(0), Step::BwReports, Step::Close]);
        }
        TestKind::SendBw | TestKind::SendLat => {
            per_qp(&mut steps);
            steps.push(Step::Connect);
            steps.push(Step::HandShake(0));
            per_qp(&mut steps);
            for &size in sizes {
                steps.push(Step::HandShake(0));
                steps.push(Step::Run(size));
                if kind == TestKind::SendBw && run_all {
                    steps.push(Step::HandShake(0));
                }
            }
            steps.push(Step::Close);
        }
        TestKind::WriteLat => {
            steps.push(Step::HandShake(0));
            per_qp(&mut steps);
            steps.push(Step::Connect);
            per_qp(&mut steps);
            steps.push(Step::HandShake(0));
            // ib_write_lat closes its socket without a final round or "done".
            steps.extend(sizes.iter().map(|&s| Step::Run(s)));
        }
        TestKind::ReadLat | TestKind::AtomicLat => {
            steps.push(Step::HandShake(0));
            per_qp(&mut steps);
            steps.push(Step::Connect);
            per_qp(&mut steps);
            steps.push(Step::HandShake(0));
            if role == Role::Client {
                steps.extend(sizes.iter().map(|&s| Step::Run(s)));
            }
            steps.push(Step::Close);
        }
    }
    steps
}

/// One end of the perftest TCP conversation. Generic over the stream so it can be
/// replayed against recorded bytes.
///
/// Until the QPs are connected every read waits at most the set-up bound
/// ([`setup::SETUP_TIMEOUT`] unless [`Self::with_setup_bound`] says otherwise): a peer that
/// runs another tool, or says nothing, is a [`PerftestOobError::Timeout`], not a hang.
/// After that the peer may be measuring for a long time, so reads block.
pub struct PerftestComm<S> {
    stream: S,
    role: Role,
    local_version: String,
    remote_version: Option<String>,
    dont_xchg_versions: bool,
    with_gid: bool,
    setup_bound: Option<Duration>,
    bound_applied: bool,
    in_setup: bool,
    /// Bytes read ahead by [`PeerWatch::peer_has_spoken`], consumed first by the next read.
    read_ahead: Vec<u8>,
    peer_closed: bool,
    /// `-R`: the side channel is an rdma_cm connection (one SEND per message); addresses
    /// go as the binary `struct pingpong_dest` with this GID index, and no "done" closes.
    rdma_cm_gid_index: Option<i32>,
}

/// What a runner may ask the conversation while it measures.
pub trait PeerWatch {
    /// True once the peer has written its next exchange message (or closed the stream):
    /// it has finished its part of the run. Never blocks.
    fn peer_has_spoken(&mut self) -> bool;
}

/// A watch for runners driven without a conversation (the peer never speaks).
pub struct Silent;

impl PeerWatch for Silent {
    fn peer_has_spoken(&mut self) -> bool {
        false
    }
}

impl<S: OobStream> PeerWatch for PerftestComm<S> {
    fn peer_has_spoken(&mut self) -> bool {
        if !self.read_ahead.is_empty() || self.peer_closed {
            return true;
        }
        if self.stream.nonblocking_reads(true).is_err() {
            return false;
        }
        let mut buf = [0u8; 256];
        let spoke = match self.stream.read(&mut buf) {
            Ok(0) => {
                self.peer_closed = true;
                true
            }
            Ok(n) => {
                self.read_ahead.extend_from_slice(&buf[..n]);
                true
            }
            Err(_) => false,
        };
        // If this fails, the next blocking read fails too and reports it.
        let _ = self.stream.nonblocking_reads(false);
        spoke
    }
}

impl<S: OobStream> PerftestComm<S> {
    /// A conversation on an established TCP stream. `local_version` is what we announce
    /// (normally [`BOOKWORM_VERSION`]); `with_gid` is perftest's `-x` (108-byte addresses).
    pub fn new(
        stream: S,
        role: Role,
        local_version: &str,
        dont_xchg_versions: bool,
        with_gid: bool,
    ) -> Self {
        PerftestComm {
            stream,
            role,
            local_version: local_version.to_string(),
            remote_version: None,
            dont_xchg_versions,
            with_gid,
            setup_bound: Some(setup::SETUP_TIMEOUT),
            bound_applied: false,
            in_setup: true,
            read_ahead: Vec::new(),
            peer_closed: false,
            rdma_cm_gid_index: None,
        }
    }

    /// `-R`: perftest then exchanges over rdma_cm ("Data ex. method : rdma_cm"), `stream`
    /// being one (a [`crate::perftest::cm::CmStream`]); `gid_index` is what our
    /// addresses announce.
    pub fn with_rdma_cm(mut self, gid_index: u32) -> Self {
        self.rdma_cm_gid_index = Some(gid_index as i32);
        self
    }

    /// perftest's sync rounds around `create_rdma_cm_connection`: `my_dest[0]` is still
    /// all zeros then, and what the peer sends is not looked at.
    pub fn sync_hand_shake(&mut self) -> Result<(), PerftestOobError> {
        let zero = PerftestDest {
            lid: 0,
            out_reads: 0,
            qpn: 0,
            psn: 0,
            rkey: 0,
            vaddr: 0,
            gid: Some([0; 16]),
            srqn: 0,
        };
        let (mine, len) = match self.rdma_cm_gid_index {
            Some(_) => (zero.encode_binary(0).to_vec(), DEST_BINARY_LEN),
            None => {
                let mut z = zero;
                if !self.with_gid {
                    z.gid = None;
                }
                (z.encode(), PerftestDest::wire_len(self.with_gid))
            }
        };
        self.xchg(&mine, len, "the sync round around the rdma_cm connection")?;
        Ok(())
    }

    /// Sets the set-up bound (`None`: wait forever, as perftest does).
    pub fn with_setup_bound(mut self, bound: Option<Duration>) -> Self {
        self.setup_bound = bound;
        self
    }

    /// The QPs are connected: from now on reads block without a bound.
    pub fn end_setup(&mut self) -> Result<(), PerftestOobError> {
        self.in_setup = false;
        if self.bound_applied {
            self.bound_applied = false;
            self.stream
                .bound_reads(None)
                .map_err(io("clearing the set-up timeout"))?;
        }
        Ok(())
    }

    /// Gives the stream back.
    pub fn into_inner(self) -> S {
        self.stream
    }

    /// The peer's version string (after [`Self::exchange_versions`]).
    pub fn remote_version(&self) -> Option<&str> {
        self.remote_version.as_deref()
    }

    /// The version number used for the peer's compatibility rules: what it announced,
    /// or ours when versions were not exchanged.
    pub fn remote_version_number(&self) -> f64 {
        version_number(
            self.remote_version
                .as_deref()
                .unwrap_or(&self.local_version),
        )
    }

    fn exchanges(&self) -> bool {
        !self.dont_xchg_versions
    }

    /// Reads exactly `buf.len()` bytes, read-ahead first, within the set-up bound while
    /// it applies.
    fn read_msg(&mut self, buf: &mut [u8], during: &'static str) -> Result<(), PerftestOobError> {
        if self.in_setup && !self.bound_applied {
            if let Some(bound) = self.setup_bound {
                self.stream
                    .bound_reads(Some(bound))
                    .map_err(io("setting the set-up timeout"))?;
                self.bound_applied = true;
            }
        }
        let ahead = self.read_ahead.len().min(buf.len());
        buf[..ahead].copy_from_slice(&self.read_ahead[..ahead]);
        self.read_ahead.drain(..ahead);
        if ahead == buf.len() {
            return Ok(());
        }
        match setup::read_full(&mut self.stream, &mut buf[ahead..]) {
            Ok(()) => Ok(()),
            Err((n, e)) if setup::is_timeout(&e) && self.bound_applied => {
                let got = &buf[..ahead + n];
                let mut hint = setup::peer_hint(got);
                if !self.exchanges()
                    && matches!(setup::identify_peer(got), Some(PeerTool::Perftest { .. }))
                {
                    hint.push_str(": it exchanges versions, we were told not to (--dont_xchg_versions); use that option on both sides or on neither");
                } else if got.is_empty() && self.role == Role::Server {
                    hint.push_str("; the peer connected but sent nothing (perftest clients write first; xroce file send, for one, waits to be spoken to)");
                }
                Err(PerftestOobError::Timeout {
                    during,
                    secs: self
                        .setup_bound
                        .map_or(0, |b| b.as_secs_f64().ceil() as u64),
                    expected: buf.len(),
                    got: got.len(),
                    hint,
                })
            }
            Err((_, e)) => Err(PerftestOobError::Io { during, source: e }),
        }
    }

    /// `ctx_xchg_data_ethernet`: the client writes then reads; the server reads then writes.
    pub fn xchg(
        &mut self,
        mine: &[u8],
        theirs_len: usize,
        during: &'static str,
    ) -> Result<Vec<u8>, PerftestOobError> {
        let mut theirs = vec![0u8; theirs_len];
        match self.role {
            Role::Client => {
                self.stream.write_all(mine).map_err(io(during))?;
                self.stream.flush().map_err(io(during))?;
                self.read_msg(&mut theirs, during)?;
            }
            Role::Server => {
                self.read_msg(&mut theirs, during)?;
                self.stream.write_all(mine).map_err(io(during))?;
                self.stream.flush().map_err(io(during))?;
            }
        }
        Ok(theirs)
    }

    /// `exchange_versions` + `check_version_compatibility`.
    pub fn exchange_versions(&mut self) -> Result<(), PerftestOobError> {
        if !self.exchanges() {
            return Ok(());
        }
        let mut mine = [0u8; VERSION_LEN];
        let bytes = self.local_version.as_bytes();
        let n = bytes.len().min(VERSION_LEN - 1);
        mine[..n].copy_from_slice(&bytes[..n]);
        let theirs = self.xchg(&mine, VERSION_LEN, "exchanging versions")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(VERSION_LEN);
        let remote = String::from_utf8_lossy(&theirs[..end]).into_owned();
        if version_number(&remote) < MIN_COMPATIBLE_VERSION {
            let advice = match setup::identify_peer(&theirs) {
                Some(PeerTool::Pingpong) => "run xroce pingpong (or ibv_rc_pingpong) on this side too, or xroce perf/perftest on the peer",
                Some(PeerTool::PerftestWithoutVersions) => "use --dont_xchg_versions on both sides or on neither",
                Some(PeerTool::JsonLines) => "run the same xroce command on both sides",
                Some(PeerTool::Perftest { .. }) | None => {
                    return Err(PerftestOobError::VersionTooOld(remote))
                }
            };
            let peer = setup::identify_peer(&theirs)
                .map(|p| p.describe())
                .unwrap_or_default();
            return Err(PerftestOobError::NotPerftest {
                text: remote,
                peer,
                advice,
            });
        }
        self.remote_version = Some(remote);
        Ok(())
    }

    /// `check_sys_data`: returns the larger page and cache-line sizes.
    pub fn exchange_sys_data(&mut self, local: SysData) -> Result<SysData, PerftestOobError> {
        if !self.exchanges() || self.remote_version_number() < 5.32 {
            return Ok(local);
        }
        let page = self.xchg(&local.page_size.to_be_bytes(), 4, "exchanging page size")?;
        let line = self.xchg(
            &local.cache_line.to_be_bytes(),
            4,
            "exchanging cache-line size",
        )?;
        let page = u32::from_be_bytes(page[..4].try_into().unwrap_or([0; 4]));
        let line = u32::from_be_bytes(line[..4].try_into().unwrap_or([0; 4]));
        Ok(SysData {
            page_size: local.page_size.max(page),
            cache_line: local.cache_line.max(line),
        })
    }

    /// `check_mtu`: sends our `ibv_mtu` enum as text and returns the smaller one (a
    /// peer's invalid value is ignored, as perftest does).
    pub fn exchange_mtu(&mut self, local_mtu_enum: u8) -> Result<u8, PerftestOobError> {
        let rem = self.remote_version_number();
        if !self.exchanges() || rem < 5.1 {
            return Ok(local_mtu_enum);
        }
        let len = if rem >= 5.31 { 2 } else { 4 };
        let mut mine = vec![0u8; len];
        let text = local_mtu_enum.to_string();
        mine[..1].copy_from_slice(&text.as_bytes()[..1]);
        let theirs = self.xchg(&mine, len, "exchanging MTU")?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(len);
        let remote: i64 = std::str::from_utf8(&theirs[..end])
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        if (1..=5).contains(&remote) && (remote as u8) < local_mtu_enum {
            Ok(remote as u8)
        } else {
            Ok(local_mtu_enum)
        }
    }

    /// `negotiate_params` (perftest >= 6.28): only when both sides are that new. Returns
    /// the peer's block, after checking that the test parameters match.
    pub fn negotiate(
        &mut self,
        local: &NegotiateParams,
    ) -> Result<Option<NegotiateParams>, PerftestOobError> {
        if !self.exchanges()
            || version_number(&self.local_version) < NEGOTIATE_MIN_VERSION
            || self.remote_version_number() < NEGOTIATE_MIN_VERSION
        {
            return Ok(None);
        }
        let mine = local.encode();
        let theirs = self.xchg(&mine, mine.len(), "exchanging the parameter block")?;
        let remote = NegotiateParams::decode(&theirs).ok_or(PerftestOobError::ParamMismatch(
            "parameter block has an unexpected size".into(),
        ))?;
        local.check_matches(&remote)?;
        Ok(Some(remote))
    }

    /// `ctx_hand_shake`: one QP-address round.
    pub fn hand_shake(&mut self, mine: &PerftestDest) -> Result<PerftestDest, PerftestOobError> {
        if let Some(gid_index) = self.rdma_cm_gid_index {
            let theirs = self.xchg(
                &mine.encode_binary(gid_index),
                DEST_BINARY_LEN,
                "exchanging QP addresses",
            )?;
            return PerftestDest::decode_binary(&theirs);
        }
        let mut mine = *mine;
        if !self.with_gid {
            mine.gid = None;
        } else if mine.gid.is_none() {
            mine.gid = Some([0; 16]);
        }
        let theirs = self.xchg(
            &mine.encode(),
            PerftestDest::wire_len(self.with_gid),
            "exchanging QP addresses",
        )?;
        PerftestDest::decode(&theirs, self.with_gid)
    }

    /// `xchg_bw_reports`: five (plain) values, each its own exchange.
    pub fn exchange_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, PerftestOobError> {
        let iters_len = if self.remote_version_number() >= 5.33 {
            8
        } else {
            4
        };
        let size = self.xchg(&mine.size.to_be_bytes(), 8, "exchanging bw reports")?;
        let iters_bytes = if iters_len == 8 {
            mine.iters.to_be_bytes().to_vec()
        } else {
            (mine.iters as u32).to_be_bytes().to_vec()
        };
        let iters = self.xchg(&iters_bytes, iters_len, "exchanging bw reports")?;
        let peak = self.xchg(
            &mine.bw_peak.to_bits().to_be_bytes(),
            8,
            "exchanging bw reports",
        )?;
        let avg = self.xchg(
            &mine.bw_avg.to_bits().to_be_bytes(),
            8,
            "exchanging bw reports",
        )?;
        let rate = self.xchg(
            &mine.msg_rate_avg.to_bits().to_be_bytes(),
            8,
            "exchanging bw reports",
        )?;
        let u64_of = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().unwrap_or([0; 8]));
        Ok(BwReport {
            size: u64_of(&size),
            iters: if iters_len == 8 {
                u64_of(&iters)
            } else {
                u32::from_be_bytes(iters[..4].try_into().unwrap_or([0; 4])) as u64
            },
            bw_peak: f64::from_bits(u64_of(&peak)),
            bw_avg: f64::from_bits(u64_of(&avg)),
            msg_rate_avg: f64::from_bits(u64_of(&rate)),
        })
    }

    /// `ctx_close_connection`: a last address round, then `"done\0"` from both sides. The
    /// peer's "done" is not waited for (perftest does not read it either).
    pub fn close(&mut self, mine: &PerftestDest) -> Result<(), PerftestOobError> {
        self.hand_shake(mine)?;
        if self.rdma_cm_gid_index.is_some() {
            // ctx_close_connection writes "done" on TCP only.
            return Ok(());
        }
        // The peer may already have written its own "done" and closed: that is success.
        let result = self
            .stream
            .write_all(b"done\0")
            .and_then(|_| self.stream.flush());
        match result {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(())
            }
            other => other.map_err(io("sending \"done\"")),
        }
    }
}

/// perftest's `ipv6_addr_v4mapped` (also accepts the IPv4 multicast form `ff0e::ffff:x`).
pub fn gid_is_v4_mapped(gid: &[u8; 16]) -> bool {
    let mapped_tail = gid[8..10] == [0, 0] && gid[10..12] == [0xff, 0xff];
    (gid[..8] == [0; 8] && mapped_tail)
        || (gid[..4] == [0xff, 0x0e, 0, 0] && gid[4..8] == [0; 4] && mapped_tail)
}

/// `ctx_check_gid_compatibility`: both GIDs IPv4-mapped, or neither.
pub fn check_gid_compatibility(
    local: &[u8; 16],
    remote: &[u8; 16],
) -> Result<(), PerftestOobError> {
    if gid_is_v4_mapped(local) != gid_is_v4_mapped(remote) {
        return Err(PerftestOobError::GidTypeMismatch {
            local: Ipv6Addr::from(*local),
            remote: Ipv6Addr::from(*remote),
        });
    }
    Ok(())
}

/// What a [`run_script`] caller supplies: the RDMA side of a test.
pub trait PerftestRunner {
    /// Connect our QPs to the peer's (RTR, RTS); called at [`Step::Connect`].
    fn connect(&mut self, remote: &[PerftestDest], mtu_enum: u8) -> anyhow::Result<()>;
    /// Run one message size; a bw test returns its report, a latency test `None`. `peer`
    /// tells whether the peer has finished its part (a receiver that waits for datagrams
    /// uses it to stop once no more can come).
    fn run(&mut self, size: u64, peer: &mut dyn PeerWatch) -> anyhow::Result<Option<BwReport>>;
    /// `-R`: connect the QPs through rdma_cm ([`Step::CmConnect`]).
    fn cm_connect(&mut self) -> anyhow::Result<()> {
        anyhow::bail!("this runner cannot connect through rdma_cm (-R)")
    }
    /// `-b`: both reports of the size just run are known ([`Step::DuplexReports`]).
    fn duplex_report(&mut self, _mine: &BwReport, _theirs: &BwReport) -> anyhow::Result<()> {
        Ok(())
    }
}

/// What a finished conversation learned.
#[derive(Debug, Clone, Default)]
pub struct ScriptOutcome {
    /// The peer's version (None with `--dont_xchg_versions`).
    pub remote_version: Option<String>,
    /// Page and cache-line size after taking the maximum.
    pub sys_data: Option<SysData>,
    /// The MTU enum both use.
    pub mtu_enum: u8,
    /// The peer's parameter block, if one was exchanged.
    pub remote_params: Option<NegotiateParams>,
    /// Peer addresses per QP (from the first rounds).
    pub remote_dests: Vec<PerftestDest>,
    /// Our reports, one per size run.
    pub local_reports: Vec<BwReport>,
    /// The report the peer sent (bw tests).
    pub remote_report: Option<BwReport>,
}

/// Error of [`run_script`]: the exchange itself, or the RDMA side.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The TCP conversation failed.
    #[error(transparent)]
    Oob(#[from] PerftestOobError),
    /// The RDMA side failed.
    #[error("{0:#}")]
    Rdma(anyhow::Error),
}

/// Inputs of [`run_script`] that describe this side.
#[derive(Debug, Clone)]
pub struct LocalSide {
    /// Page/cache-line sizes to announce.
    pub sys_data: SysData,
    /// Our `ibv_mtu` enum.
    pub mtu_enum: u8,
    /// Our parameter block (sent only to new peers).
    pub params: NegotiateParams,
    /// One address per QP.
    pub dests: Vec<PerftestDest>,
}

/// Runs a whole [`script`] on `comm`, calling `runner` for the RDMA steps, and checks the
/// echo rule: every later address round must repeat what the peer said first.
pub fn run_script<S: OobStream, R: PerftestRunner>(
    comm: &mut PerftestComm<S>,
    steps: &[Step],
    local: &LocalSide,
    runner: &mut R,
) -> Result<ScriptOutcome, ScriptError> {
    let mut out = ScriptOutcome {
        mtu_enum: local.mtu_enum,
        ..Default::default()
    };
    let mut remote: Vec<Option<PerftestDest>> = vec![None; local.dests.len()];
    for step in steps {
        match *step {
            Step::Versions => {
                comm.exchange_versions()?;
                out.remote_version = comm.remote_version().map(str::to_string);
            }
            Step::SysData => out.sys_data = Some(comm.exchange_sys_data(local.sys_data)?),
            Step::Mtu => out.mtu_enum = comm.exchange_mtu(local.mtu_enum)?,
            Step::Negotiate => out.remote_params = comm.negotiate(&local.params)?,
            Step::HandShake(i) => {
                let theirs = comm.hand_shake(&local.dests[i])?;
                match &remote[i] {
                    None => remote[i] = Some(theirs),
                    Some(first) if same_qp(first, &theirs) => {}
                    Some(_) => {
                        return Err(PerftestOobError::MalformedDest {
                            reason: "peer changed its QP address between rounds",
                            text: String::from_utf8_lossy(&theirs.encode()).into_owned(),
                        }
                        .into())
                    }
                }
            }
            Step::Connect => {
                let dests: Vec<PerftestDest> = remote.iter().flatten().copied().collect();
                if let (Some(first), Some(mine)) = (dests.first(), local.dests.first()) {
                    if let (Some(a), Some(b)) = (mine.gid, first.gid) {
                        check_gid_compatibility(&a, &b)?;
                    }
                    check_same_test(&local.params, mine, first)?;
                }
                runner
                    .connect(&dests, out.mtu_enum)
                    .map_err(ScriptError::Rdma)?;
                out.remote_dests = dests;
                comm.end_setup()?;
            }
            Step::SyncHandShake => comm.sync_hand_shake()?,
            Step::CmConnect => runner.cm_connect().map_err(ScriptError::Rdma)?,
            Step::Run(size) => {
                if let Some(report) = runner.run(size, comm).map_err(ScriptError::Rdma)? {
                    out.local_reports.push(report);
                }
            }
            Step::BwReports => {
                let mine = out.local_reports.last().copied().unwrap_or_default();
                out.remote_report = Some(comm.exchange_bw_reports(&mine)?);
            }
            Step::DuplexReports => {
                let mine = out.local_reports.last().copied().unwrap_or_default();
                let theirs = comm.exchange_bw_reports(&mine)?;
                out.remote_report = Some(theirs);
                runner
                    .duplex_report(&mine, &theirs)
                    .map_err(ScriptError::Rdma)?;
            }
            Step::Close => comm.close(&local.dests[0])?,
        }
    }
    if out.remote_dests.is_empty() {
        out.remote_dests = remote.into_iter().flatten().collect();
    }
    Ok(out)
}

/// The test a parameter block describes, as perftest's binary name.
fn test_name(params: &NegotiateParams) -> &'static str {
    let bw = params.tst == enums::TST_BW;
    match (params.verb, bw) {
        (enums::VERB_SEND, true) => "ib_send_bw",
        (enums::VERB_SEND, false) => "ib_send_lat",
        (enums::VERB_WRITE, true) => "ib_write_bw",
        (enums::VERB_WRITE, false) => "ib_write_lat",
        (enums::VERB_READ, true) => "ib_read_bw",
        (enums::VERB_READ, false) => "ib_read_lat",
        (_, true) => "ib_atomic_bw",
        (_, false) => "ib_atomic_lat",
    }
}

/// perftest 6.06 sends nothing that names its test; the QP address's outstanding-reads
/// field is the one thing that differs: the READ and atomic tests announce their `-o`
/// depth (the device maximum by default, 128 on rxe, 16 on xroce), the SEND and WRITE
/// tests always 1 (`perftest_parameters.c`). perftest >= 6.28 compares the whole
/// parameter block instead ([`NegotiateParams::check_matches`]).
pub fn check_same_test(
    local: &NegotiateParams,
    mine: &PerftestDest,
    theirs: &PerftestDest,
) -> Result<(), PerftestOobError> {
    let ours = test_name(local);
    let read_like = matches!(local.verb, enums::VERB_READ | enums::VERB_ATOMIC);
    if !read_like && theirs.out_reads > 1 {
        return Err(PerftestOobError::OtherTest(format!(
            "its QP address allows {} outstanding RDMA READs/atomics, which only the read and atomic tests announce (send and write tests send 1), and we run {ours}; run the same test on both sides",
            theirs.out_reads
        )));
    }
    if read_like && mine.out_reads > 1 && theirs.out_reads <= 1 {
        return Err(PerftestOobError::OtherTest(format!(
            "its QP address allows {} outstanding RDMA READs/atomics, as the send and write tests announce, and we run {ours} with -o {}; run the same test on both sides (if the peer runs {ours} with -o 1, give -o 1 here too)",
            theirs.out_reads, mine.out_reads
        )));
    }
    Ok(())
}

/// Rounds after the first repeat the same QP; perftest's server reuses its
/// `my_dest[0]` for the barrier rounds, so compare the QP identity fields.
fn same_qp(a: &PerftestDest, b: &PerftestDest) -> bool {
    a.qpn == b.qpn && a.psn == b.psn && a.rkey == b.rkey && a.vaddr == b.vaddr && a.gid == b.gid
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    const SERVER_DEST_GID: &[u8] = b"0000:0001:000013:caa1a6:00000435:000055a3bc876000:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:0b:00000000:\0";

    #[test]
    fn dest_with_gid_round_trips_real_bytes() {
        assert_eq!(SERVER_DEST_GID.len(), KEY_MSG_SIZE_GID);
        let dest = PerftestDest::decode(SERVER_DEST_GID, true).unwrap();
        assert_eq!(dest.qpn, 0x13);
        assert_eq!(dest.psn, 0xcaa1a6);
        assert_eq!(dest.rkey, 0x435);
        assert_eq!(dest.vaddr, 0x55a3bc876000);
        assert_eq!(
            Ipv6Addr::from(dest.gid.unwrap()).to_string(),
            "::ffff:198.18.0.11"
        );
        assert_eq!(dest.encode(), SERVER_DEST_GID);
    }

    #[test]
    fn dest_without_gid_is_59_bytes() {
        let dest = PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: 0x11,
            psn: 0xabcdef,
            rkey: 0x1234,
            vaddr: 0x7f00_0000_1000,
            gid: None,
            srqn: 0,
        };
        let msg = dest.encode();
        assert_eq!(msg.len(), KEY_MSG_SIZE);
        assert_eq!(
            &msg[..58],
            b"0000:0001:000011:abcdef:00001234:00007f0000001000:00000000"
        );
        assert_eq!(PerftestDest::decode(&msg, false).unwrap(), dest);
        // The wrong form is a clear error, not a misparse.
        assert!(PerftestDest::decode(&msg, true).is_err());
        assert!(PerftestDest::decode(SERVER_DEST_GID, false).is_err());
    }

    #[test]
    fn version_numbers() {
        assert_eq!(version_number("6.06"), 6.06);
        assert_eq!(version_number("6.29"), 6.29);
        assert_eq!(version_number(""), 0.0);
        assert_eq!(version_number("5.70-beta"), 5.70);
    }

    #[test]
    fn negotiate_block_layout() {
        let params = NegotiateParams {
            test_method: 0,
            connection_type: 0,
            verb: enums::VERB_WRITE,
            tst: enums::TST_BW,
            atomic_type: 0,
            test_type: 0,
            report_fmt: enums::MBS,
            size: 65536,
            iters: 5000,
            aes_xts: 0,
            num_of_qps: 1,
            duration: 5,
            use_rdma_cm: 0,
            use_write_with_imm: 0,
            no_enhanced_reorder: 0,
            sig_offload: 0,
            data_validation: 0,
            device_attr: NegotiateParams::device_attr_block(16),
            mlx5dv_comp_mask: Some(0),
        };
        let bytes = params.encode();
        assert_eq!(bytes.len(), 320);
        assert_eq!(&bytes[8..12], &[0, 0, 0, 2]);
        assert_eq!(&bytes[32..40], &65536u64.to_be_bytes());
        assert_eq!(bytes[80 + DEVICE_ATTR_MAX_QP_RD_ATOM], 16);
        let back = NegotiateParams::decode(&bytes).unwrap();
        assert_eq!(back, params);
        assert_eq!(back.max_qp_rd_atom(), 16);
        let mut other = params.clone();
        other.size = 4096;
        let err = params.check_matches(&other).unwrap_err().to_string();
        assert!(err.contains("size: local=65536, remote=4096"), "{err}");
        assert!(NegotiateParams::decode(&bytes[..300]).is_none());
    }

    #[test]
    fn scripts_follow_perftest_main() {
        use Step::*;
        let prelude = [Versions, SysData, Mtu, Negotiate];
        let s = script(TestKind::WriteBw, Role::Server, &[4096], 1);
        assert_eq!(s[..4], prelude);
        assert_eq!(
            s[4..],
            [
                HandShake(0),
                Connect,
                HandShake(0),
                HandShake(0),
                HandShake(0),
                BwReports,
                Close
            ]
        );
        let c = script(TestKind::WriteBw, Role::Client, &[4096], 1);
        assert!(c.contains(&Run(4096)));
        let wl = script(TestKind::WriteLat, Role::Server, &[64], 1);
        assert!(!wl.contains(&Close), "ib_write_lat never sends done");
        let rl = script(TestKind::ReadLat, Role::Server, &[64], 1);
        assert_eq!(rl.iter().filter(|s| matches!(s, HandShake(_))).count(), 4);
        assert_eq!(rl.last(), Some(&Close));
    }

    #[test]
    fn gid_compatibility() {
        let v4 = Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0xc612, 0x000b]).octets();
        let v6 = Ipv6Addr::from([0xfe80, 0, 0, 0, 1, 2, 3, 4]).octets();
        assert!(check_gid_compatibility(&v4, &v4).is_ok());
        assert!(check_gid_compatibility(&v6, &v6).is_ok());
        assert!(check_gid_compatibility(&v4, &v6).is_err());
    }

    #[test]
    fn rdma_cm_address_is_the_raw_struct_big_endian() {
        let d = PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: 0x12,
            psn: 0xabcdef,
            rkey: 0x315,
            vaddr: 0x7ff5_ceccd000,
            gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 12]),
            srqn: 0,
        };
        let m = d.encode_binary(1);
        assert_eq!(m.len(), 56);
        assert_eq!(m[4..8], [0, 0, 0, 1]);
        assert_eq!(m[8..12], [0, 0, 0, 0x12]);
        assert_eq!(m[12..16], [0, 0xab, 0xcd, 0xef]);
        assert_eq!(m[16..20], [0, 0, 0x03, 0x15]);
        assert_eq!(m[20..24], [0; 4], "padding");
        assert_eq!(m[24..32], 0x7ff5_ceccd000u64.to_be_bytes());
        assert_eq!(m[32..48], d.gid.unwrap());
        assert_eq!(m[52..56], [0, 0, 0, 1], "gid_index");
        assert_eq!(PerftestDest::decode_binary(&m).unwrap(), d);
        assert!(PerftestDest::decode_binary(&m[..55]).is_err());
    }

    #[test]
    fn rdma_cm_script_connects_before_the_first_address_round() {
        use Step::*;
        // The client's 56-byte SENDs of `ib_write_bw -R` between two rxe guests: a zero
        // round, the test QP's REQ/REP/RTU, a zero round, three address rounds, the
        // server's wait round, five 8-byte reports, the closing round.
        let s = with_rdma_cm(&script(TestKind::WriteBw, Role::Server, &[65536], 1));
        assert_eq!(
            s,
            [
                Versions,
                SysData,
                Mtu,
                Negotiate,
                SyncHandShake,
                CmConnect,
                SyncHandShake,
                HandShake(0),
                Connect,
                HandShake(0),
                HandShake(0),
                HandShake(0),
                BwReports,
                Close
            ]
        );
        for kind in [TestKind::SendLat, TestKind::WriteLat, TestKind::ReadBw] {
            let s = with_rdma_cm(&script(kind, Role::Client, &[64], 2));
            let cm = s.iter().position(|x| *x == CmConnect).unwrap();
            let first = s.iter().position(|x| matches!(x, HandShake(_))).unwrap();
            assert!(cm < first, "{kind:?}: {s:?}");
            assert_eq!(s[cm - 1], SyncHandShake);
            assert_eq!(s[cm + 1], SyncHandShake);
        }
    }

    #[test]
    fn rdma_cm_exchange_sends_binary_addresses_and_no_done() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let dest = PerftestDest {
            lid: 0,
            out_reads: 1,
            qpn: 7,
            psn: 9,
            rkey: 11,
            vaddr: 13,
            gid: Some([1; 16]),
            srqn: 0,
        };
        let server = std::thread::spawn(move || {
            let mut comm =
                PerftestComm::new(b, Role::Server, BOOKWORM_VERSION, false, true).with_rdma_cm(3);
            comm.sync_hand_shake().unwrap();
            let theirs = comm.hand_shake(&dest).unwrap();
            comm.close(&dest).unwrap();
            theirs
        });
        let mut peer = a;
        let mut zero = [0xAAu8; 56];
        peer.write_all(&[0; 56]).unwrap();
        peer.read_exact(&mut zero).unwrap();
        assert_eq!(zero, [0; 56], "the sync round is all zeros");
        peer.write_all(&dest.encode_binary(1)).unwrap();
        let mut m = [0u8; 56];
        peer.read_exact(&mut m).unwrap();
        assert_eq!(m, dest.encode_binary(3));
        peer.write_all(&dest.encode_binary(1)).unwrap();
        peer.read_exact(&mut m).unwrap();
        assert_eq!(server.join().unwrap(), dest);
        let mut rest = Vec::new();
        peer.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "no \"done\" over rdma_cm: {rest:?}");
    }
}
