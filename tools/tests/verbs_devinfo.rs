//! `xroce devinfo`: the device, port and GID table xroce makes of an interface.
use std::process::Command;

use xroce::netns::{LinkConfig, VethLink};

fn devinfo(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("running xroce devinfo");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn devinfo_on_loopback() {
    let (ok, out, err) =
        devinfo(Command::new(env!("CARGO_BIN_EXE_xroce")).args(["devinfo", "-d", "lo", "-v"]));
    assert!(ok, "{err}");
    assert!(out.starts_with("hca_id:\txroce_lo\n"), "{out}");
    for field in [
        "transport:",
        "node_guid:",
        "phys_port_cnt:\t\t\t1",
        "max_qp_wr:",
        "link_layer:\t\tEthernet",
        "GID[  0]:",
        "RoCE v2",
        "pkey_tbl_len:\t\t1",
    ] {
        assert!(out.contains(field), "no {field:?} in\n{out}");
    }
}

#[test]
fn devinfo_names_a_missing_interface() {
    let (ok, _, err) =
        devinfo(Command::new(env!("CARGO_BIN_EXE_xroce")).args(["devinfo", "-d", "xroce-nope0"]));
    assert!(!ok);
    assert!(err.contains("\"xroce-nope0\" not found"), "{err}");
}

#[test]
fn devinfo_in_a_namespace_reports_mtus_and_gids() {
    match xroce::netns::require_privileges("devinfo_in_a_namespace_reports_mtus_and_gids") {
        Ok(true) => {}
        Ok(false) => return,
        Err(msg) => panic!("{msg}"),
    }
    for (link_mtu, active) in [(1500, "1024 (3)"), (9000, "4096 (5)"), (2200, "2048 (4)")] {
        let link = VethLink::create(&LinkConfig {
            mtu: link_mtu,
            ipv6: true,
            ..LinkConfig::default()
        })
        .unwrap();
        let (ok, out, err) = devinfo(
            link.a
                .command(env!("CARGO_BIN_EXE_xroce"))
                .args(["devinfo", "-v", "-d", &link.a_if]),
        );
        assert!(ok, "{err}");
        assert!(out.contains("state:\t\t\tPORT_ACTIVE (4)"), "{out}");
        assert!(
            out.contains(&format!("active_mtu:\t\t{active}")),
            "link {link_mtu}: {out}"
        );
        assert!(out.contains("max_mtu:\t\t4096 (5)"), "{out}");
        // Index 0 link-local, 1 the IPv4 address mapped, 2 the global IPv6 address.
        assert!(out.contains("GID[  0]:\t\tfe80:"), "{out}");
        assert!(
            out.contains("GID[  1]:\t\t0000:0000:0000:0000:0000:ffff:c612:0001, RoCE v2"),
            "{out}"
        );
        assert!(
            out.contains("GID[  2]:\t\t2001:0002:0000:0000:0000:0000:0000:0001, RoCE v2"),
            "{out}"
        );
        assert!(out.contains("gid_tbl_len:\t\t3"), "{out}");
    }
}

/// The identity a verbs user reads, and limits equal to the ones the engine enforces.
#[test]
fn devinfo_reports_identity_and_the_enforced_limits() {
    use xroce::engine::limits;
    let (ok, out, err) =
        devinfo(Command::new(env!("CARGO_BIN_EXE_xroce")).args(["devinfo", "-d", "lo", "-v"]));
    assert!(ok, "{err}");
    let fields = [
        format!("fw_ver:\t\t\t\t{}\n", env!("CARGO_PKG_VERSION")),
        // lo's MAC is 00:00:00:00:00:00: its modified EUI-64 flips the U/L bit.
        "node_guid:\t\t\t0200:00ff:fe00:0000\n".to_string(),
        "sys_image_guid:\t\t\t0200:00ff:fe00:0000\n".to_string(),
        "vendor_id:\t\t\t0xffffff\n".to_string(),
        format!("vendor_part_id:\t\t\t{}\n", 0x7872),
        "atomic_cap:\t\t\tATOMIC_HCA (1)\n".to_string(),
        format!("max_qp:\t\t\t\t{}\n", limits::MAX_QP),
        format!("max_qp_wr:\t\t\t{}\n", limits::MAX_QP_WR),
        format!("max_sge:\t\t\t{}\n", limits::MAX_SGE),
        format!("max_cq:\t\t\t\t{}\n", limits::MAX_CQ),
        format!("max_cqe:\t\t\t{}\n", limits::MAX_CQE),
        format!("max_mr:\t\t\t\t{}\n", limits::MAX_MR),
        format!("max_pd:\t\t\t\t{}\n", limits::MAX_PD),
        format!("max_mr_size:\t\t\t0x{:x}\n", limits::MAX_MR_SIZE),
        format!("max_qp_rd_atom:\t\t\t{}\n", limits::MAX_RD_ATOMIC),
        format!("max_qp_init_rd_atom:\t\t{}\n", limits::MAX_RD_ATOMIC),
        format!("max_inline_data:\t\t{}\n", limits::MAX_INLINE_DATA),
        format!("max_ah:\t\t\t\t{}\n", limits::MAX_AH),
        format!("max_srq:\t\t\t{}\n", limits::MAX_SRQ),
        format!("max_srq_wr:\t\t\t{}\n", limits::MAX_SRQ_WR),
        format!("max_srq_sge:\t\t\t{}\n", limits::MAX_SRQ_SGE),
        format!("max_mw:\t\t\t\t{}\n", limits::MAX_MW),
    ];
    for field in &fields {
        assert!(out.contains(field.as_str()), "no {field:?} in\n{out}");
    }
}
