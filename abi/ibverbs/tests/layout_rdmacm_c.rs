//! The rdma_cm structs of `xroce_ibverbs::rdmacm` against gcc's own answer on
//! `<rdma/rdma_cma.h>` and `<infiniband/sa.h>` (Debian's librdmacm-dev): `sizeof` and
//! `offsetof` of every field listed, and the values of the constants, must equal Rust's.
//! A program reads `id->verbs`, `id->qp`, `event->param.ud.qkey` at these offsets.
//!
//! Needs gcc and librdmacm-dev: under `XROCE_CI=1` their absence fails, elsewhere it skips
//! visibly.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use xroce_ibverbs::rdmacm::*;

/// (C struct, C field or "" for sizeof, Rust's value).
type Fact = (&'static str, &'static str, usize);

macro_rules! facts {
    ($($ty:ident { $($field:ident $(= $cname:literal)?),* $(,)? })*) => {{
        let mut v: Vec<Fact> = Vec::new();
        $(
            v.push((stringify!($ty), "", size_of::<$ty>()));
            $(
                let cname: &'static str = facts!(@name $field $($cname)?);
                v.push((stringify!($ty), cname, offset_of!($ty, $field)));
            )*
        )*
        v
    }};
    (@name $field:ident $cname:literal) => { $cname };
    (@name $field:ident) => { stringify!($field) };
}

fn rust_facts() -> Vec<Fact> {
    let mut v = facts! {
        rdma_event_channel { fd }
        rdma_ib_addr { sgid, dgid, pkey }
        rdma_addr { src_storage = "src_addr", dst_storage = "dst_addr", ibaddr = "addr.ibaddr" }
        ibv_sa_path_rec {
            dgid, sgid, dlid, slid, raw_traffic, flow_label, hop_limit, traffic_class,
            reversible, numb_path, pkey, sl, mtu_selector, mtu, rate_selector, rate,
            packet_life_time_selector, packet_life_time, preference
        }
        rdma_route { addr, path_rec, num_paths }
        rdma_cm_id {
            verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
            recv_cq_channel, recv_cq, srq, pd, qp_type
        }
        rdma_conn_param {
            private_data, private_data_len, responder_resources, initiator_depth, flow_control,
            retry_count, rnr_retry_count, srq, qp_num
        }
        rdma_ud_param { private_data, private_data_len, ah_attr, qp_num, qkey }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_addrinfo {
            ai_flags, ai_family, ai_qp_type, ai_port_space, ai_src_len, ai_dst_len, ai_src_addr,
            ai_dst_addr, ai_src_canonname, ai_dst_canonname, ai_route_len, ai_route,
            ai_connect_len, ai_connect, ai_next
        }
    };
    let param = offset_of!(rdma_cm_event, param);
    v.extend([
        ("rdma_cm_event", "param.conn.private_data_len", param + 8),
        (
            "rdma_cm_event",
            "param.conn.qp_num",
            param + offset_of!(rdma_conn_param, qp_num),
        ),
        (
            "rdma_cm_event",
            "param.ud.ah_attr",
            param + offset_of!(rdma_ud_param, ah_attr),
        ),
        (
            "rdma_cm_event",
            "param.ud.qp_num",
            param + offset_of!(rdma_ud_param, qp_num),
        ),
        (
            "rdma_cm_event",
            "param.ud.qkey",
            param + offset_of!(rdma_ud_param, qkey),
        ),
        (
            "rdma_cm_id",
            "route.addr.addr.ibaddr.pkey",
            offset_of!(rdma_cm_id, route) + offset_of!(rdma_addr, ibaddr) + 32,
        ),
    ]);
    v
}

/// (C expression, Rust's value).
fn constants() -> Vec<(&'static str, i64)> {
    let mut v: Vec<(&'static str, i64)> = vec![
        ("RDMA_PS_IPOIB", RDMA_PS_IPOIB as i64),
        ("RDMA_PS_TCP", RDMA_PS_TCP as i64),
        ("RDMA_PS_UDP", RDMA_PS_UDP as i64),
        ("RDMA_PS_IB", RDMA_PS_IB as i64),
        ("RDMA_OPTION_ID", RDMA_OPTION_ID as i64),
        ("RDMA_OPTION_ID_TOS", RDMA_OPTION_ID_TOS as i64),
        ("RDMA_OPTION_ID_REUSEADDR", RDMA_OPTION_ID_REUSEADDR as i64),
        ("RDMA_OPTION_ID_AFONLY", RDMA_OPTION_ID_AFONLY as i64),
        (
            "RDMA_OPTION_ID_ACK_TIMEOUT",
            RDMA_OPTION_ID_ACK_TIMEOUT as i64,
        ),
        ("RDMA_OPTION_IB", RDMA_OPTION_IB as i64),
        ("RDMA_OPTION_IB_PATH", RDMA_OPTION_IB_PATH as i64),
        ("RAI_PASSIVE", RAI_PASSIVE as i64),
        ("RAI_NUMERICHOST", RAI_NUMERICHOST as i64),
        ("RAI_NOROUTE", RAI_NOROUTE as i64),
        ("RAI_FAMILY", RAI_FAMILY as i64),
        ("AF_IB", AF_IB as i64),
        ("RDMA_UDP_QKEY", xroce::rdmacm::RDMA_UDP_QKEY as i64),
    ];
    for (name, code) in EVENT_NAMES.iter().zip(0..) {
        v.push((name, code));
    }
    v
}

fn c_values(facts: &[Fact], consts: &[(&str, i64)]) -> Option<HashMap<String, usize>> {
    let header = std::path::Path::new("/usr/include/rdma/rdma_cma.h");
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !header.exists() || !gcc {
        let why = "needs gcc and librdmacm-dev (scripts/setup.sh installs them)";
        assert!(
            std::env::var("XROCE_CI").map_or(true, |v| v != "1"),
            "layout_rdmacm_c: {why}"
        );
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED: layout_rdmacm_c: {why}");
        return None;
    }
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <rdma/rdma_cma.h>\n\
         #include <infiniband/sa.h>\n#include <infiniband/ib.h>\nint main(void) {\n",
    );
    for (ty, field, _) in facts {
        if field.is_empty() {
            src += &format!("printf(\"{ty} - %zu\\n\", sizeof(struct {ty}));\n");
        } else {
            src += &format!("printf(\"{ty} {field} %zu\\n\", offsetof(struct {ty}, {field}));\n");
        }
    }
    for (name, _) in consts {
        src += &format!("printf(\"const {name} %lld\\n\", (long long)({name}));\n");
    }
    src += "return 0;\n}\n";
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("layout.c");
    let exe = dir.path().join("layout");
    std::fs::write(&c, src).unwrap();
    let out = Command::new("gcc")
        .args(["-std=gnu99", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&c)
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run the layout program");
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.lines()
            .map(|l| {
                let (key, n) = l.rsplit_once(' ').unwrap();
                (key.to_string(), n.parse::<i64>().unwrap() as usize)
            })
            .collect(),
    )
}

#[test]
fn rdmacm_structs_match_the_c_compiler() {
    let facts = rust_facts();
    let consts = constants();
    let Some(c) = c_values(&facts, &consts) else {
        return;
    };
    let mut wrong = Vec::new();
    for (ty, field, rust) in &facts {
        let key = if field.is_empty() {
            format!("{ty} -")
        } else {
            format!("{ty} {field}")
        };
        if c[&key] != *rust {
            wrong.push(format!("{key}: C {}, Rust {rust}", c[&key]));
        }
    }
    for (name, rust) in &consts {
        let got = c[&format!("const {name}")] as i64;
        if got != *rust {
            wrong.push(format!("{name}: C {got}, Rust {rust}"));
        }
    }
    assert!(wrong.is_empty(), "differences:\n{}", wrong.join("\n"));
    // The sizes docs/rdmacm-abi.md measured, so a header change shows up here too.
    assert_eq!(size_of::<rdma_cm_id>(), 416);
    assert_eq!(size_of::<rdma_cm_event>(), 80);
    assert_eq!(size_of::<rdma_conn_param>(), 24);
    assert_eq!(size_of::<rdma_ud_param>(), 56);
    assert_eq!(size_of::<rdma_addrinfo>(), 96);
    assert_eq!(size_of::<ibv_sa_path_rec>(), 64);
    assert!(facts.len() > 80, "{} facts checked", facts.len());
}
