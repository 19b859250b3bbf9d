//! The exchange's bytes: constants, the messages each step carries (versions, the QP
//! address, the parameter block, the bandwidth report) and their encodings, and its errors.
use std::net::Ipv6Addr;

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

/// What an I/O failure of the exchange means for the user. A closed connection is a peer
/// that stopped (killed, crashed, or it refused our options and said why in its own
/// output): asking whether it runs the same test would mislead.
pub(super) fn io_cause(e: &std::io::Error) -> String {
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

pub(super) fn io(during: &'static str) -> impl FnOnce(std::io::Error) -> PerftestOobError {
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
