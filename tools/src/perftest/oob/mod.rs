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

mod codec;
mod script;
mod session;

pub use crate::setup::Role;
pub use codec::*;
pub use script::*;
pub use session::*;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};
    use std::net::Ipv6Addr;

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

    #[test]
    fn each_cause_is_printed_once() {
        // A perf server whose client died: the cause was printed twice, and the message
        // asked whether the peer runs the same test.
        let eof = std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "failed to fill whole buffer",
        );
        let err = anyhow::Error::from(PerftestOobError::Io {
            during: "exchanging versions",
            source: eof,
        });
        let text = crate::setup::error_text(&err);
        assert_eq!(
            text.matches("failed to fill whole buffer").count(),
            1,
            "{text}"
        );
        assert!(text.contains("the peer closed the connection"), "{text}");
        assert!(!text.contains("same test"), "{text}");
        assert_eq!(format!("{err:#}").matches("failed to fill").count(), 2);
        // Context that does not repeat its cause keeps it.
        let err = anyhow::Error::from(std::io::Error::other("disk full")).context("writing x");
        assert_eq!(crate::setup::error_text(&err), "writing x: disk full");
    }
}
