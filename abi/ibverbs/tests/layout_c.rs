//! The objects and function tables of `objects.rs` against the C compiler's own answer: a C
//! program compiled here against `<infiniband/verbs.h>` (Debian's libibverbs-dev) prints
//! `sizeof` and `offsetof` of every field listed, and each must equal Rust's. A mismatch
//! means a program would call through the wrong function pointer or read the wrong field.
//!
//! Needs gcc and libibverbs-dev: under `XROCE_CI=1` their absence fails, elsewhere it skips
//! visibly.

use std::collections::HashMap;
use std::mem::{offset_of, size_of};
use std::process::Command;

use xroce_ibverbs::objects::*;

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
    facts! {
        ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        ibv_context_ops {
            alloc_mw, bind_mw, dealloc_mw, poll_cq, req_notify_cq, post_srq_recv, post_send,
            post_recv, _compat_async_event
        }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        verbs_context {
            query_port, advise_mr, alloc_null_mr, read_counters, reg_dm_mr, alloc_dm,
            modify_cq, create_wq, query_rt_values, create_cq_ex, priv_ = "priv",
            query_device_ex, ibv_destroy_flow, ibv_create_flow, open_qp, create_qp_ex,
            get_srq_num, create_srq_ex, open_xrcd, close_xrcd, sz, context
        }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_mw { context, pd, rkey, handle, type_ = "type" }
        ibv_mw_bind_info { mr, addr, length, mw_access_flags }
        ibv_mw_bind { wr_id, send_flags, bind_info }
        ibv_comp_channel { context, fd, refcnt }
        ibv_cq {
            context, channel, cq_context, handle, cqe, mutex, cond, comp_events_completed,
            async_events_completed
        }
        ibv_cq_ex {
            cq = "context", comp_mask, status, wr_id, start_poll, next_poll, end_poll, read_opcode,
            read_vendor_err, read_byte_len, read_imm_data, read_qp_num, read_src_qp,
            read_wc_flags, read_slid, read_sl, read_dlid_path_bits, read_completion_ts,
            read_cvlan, read_flow_tag, read_tm_info, read_completion_wallclock_ns
        }
        ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
        }
        ibv_srq { context, srq_context, pd, handle, mutex, cond, events_completed }
        ibv_srq_init_attr { srq_context, attr }
        ibv_srq_init_attr_ex { srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap }
        ibv_qp {
            context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type,
            mutex, cond, events_completed
        }
        ibv_qp_ex {
            qp_base, comp_mask, wr_id, wr_flags, wr_atomic_cmp_swp, wr_atomic_fetch_add,
            wr_bind_mw, wr_local_inv, wr_rdma_read, wr_rdma_write, wr_rdma_write_imm, wr_send,
            wr_send_imm, wr_send_inv, wr_send_tso, wr_set_ud_addr, wr_set_xrc_srqn,
            wr_set_inline_data, wr_set_inline_data_list, wr_set_sge, wr_set_sge_list, wr_start,
            wr_complete, wr_abort, wr_atomic_write
        }
        ibv_data_buf { addr, length }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_init_attr_ex {
            qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all, comp_mask, pd, xrcd,
            create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn, send_ops_flags
        }
        ibv_ah { context, pd, handle }
        ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr, qp_type, bind_mw
        }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_async_event { element, event_type }
        ibv_odp_caps { general_caps, rc_odp_caps = "per_transport_caps.rc_odp_caps",
            uc_odp_caps = "per_transport_caps.uc_odp_caps",
            ud_odp_caps = "per_transport_caps.ud_odp_caps" }
        ibv_device_attr_ex {
            orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
            device_cap_flags_ex, tso_caps, rss_caps, max_wq_type_rq, packet_pacing_caps,
            raw_packet_caps, tm_caps, cq_mod_caps, max_dm_size, pci_atomic_caps, xrc_odp_caps,
            phys_port_cnt_ex
        }
    }
}

/// The members of the `ibv_send_wr` unions, which Rust spells as nested structs.
fn union_facts() -> Vec<Fact> {
    let wr = offset_of!(ibv_send_wr, wr);
    let bind = offset_of!(ibv_send_wr, bind_mw);
    vec![
        ("ibv_send_wr", "wr.rdma.remote_addr", wr),
        (
            "ibv_send_wr",
            "wr.rdma.rkey",
            wr + offset_of!(ibv_send_wr_rdma, rkey),
        ),
        (
            "ibv_send_wr",
            "wr.atomic.compare_add",
            wr + offset_of!(ibv_send_wr_atomic, compare_add),
        ),
        (
            "ibv_send_wr",
            "wr.atomic.swap",
            wr + offset_of!(ibv_send_wr_atomic, swap),
        ),
        (
            "ibv_send_wr",
            "wr.atomic.rkey",
            wr + offset_of!(ibv_send_wr_atomic, rkey),
        ),
        ("ibv_send_wr", "wr.ud.ah", wr),
        (
            "ibv_send_wr",
            "wr.ud.remote_qpn",
            wr + offset_of!(ibv_send_wr_ud, remote_qpn),
        ),
        (
            "ibv_send_wr",
            "wr.ud.remote_qkey",
            wr + offset_of!(ibv_send_wr_ud, remote_qkey),
        ),
        ("ibv_send_wr", "bind_mw.mw", bind),
        (
            "ibv_send_wr",
            "bind_mw.rkey",
            bind + offset_of!(ibv_send_wr_bind_mw, rkey),
        ),
        (
            "ibv_send_wr",
            "bind_mw.bind_info",
            bind + offset_of!(ibv_send_wr_bind_mw, bind_info),
        ),
        (
            "ibv_send_wr",
            "invalidate_rkey",
            offset_of!(ibv_send_wr, imm_data),
        ),
    ]
}

fn c_facts(facts: &[Fact]) -> Option<HashMap<(String, String), usize>> {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !header.exists() || !gcc {
        let why = "needs gcc and libibverbs-dev (scripts/setup.sh installs them)";
        assert!(std::env::var_os("XROCE_CI").is_none(), "layout_c: {why}");
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "SKIPPED: layout_c: {why}");
        return None;
    }
    let mut src = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (ty, field, _) in facts {
        if field.is_empty() {
            src += &format!("printf(\"{ty} - %zu\\n\", sizeof(struct {ty}));\n");
        } else {
            src += &format!("printf(\"{ty} {field} %zu\\n\", offsetof(struct {ty}, {field}));\n");
        }
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
                let mut p = l.split(' ');
                let (ty, field, n) = (p.next().unwrap(), p.next().unwrap(), p.next().unwrap());
                let field = if field == "-" { "" } else { field };
                ((ty.to_string(), field.to_string()), n.parse().unwrap())
            })
            .collect(),
    )
}

#[test]
fn objects_match_the_c_compiler() {
    let mut facts = rust_facts();
    facts.extend(union_facts());
    let Some(c) = c_facts(&facts) else { return };
    let mut wrong = Vec::new();
    for (ty, field, rust) in &facts {
        let key = (ty.to_string(), field.to_string());
        let c_value = c[&key];
        if c_value != *rust {
            let what = if field.is_empty() {
                "sizeof".to_string()
            } else {
                format!(".{field}")
            };
            wrong.push(format!("{ty}{what}: C {c_value}, Rust {rust}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "layout differences:\n{}",
        wrong.join("\n")
    );
    assert!(facts.len() > 200, "{} facts checked", facts.len());
}
