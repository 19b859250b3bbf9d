//! Size, alignment and every field offset of the C structs, against rdma-core 44's
//! `<infiniband/verbs.h>` as Debian bookworm ships it (libibverbs-dev 44.0-2, x86_64),
//! measured there with `sizeof`, `_Alignof` and `offsetof`. A mismatch means a C program
//! would read another field than the one xroce wrote.
use std::mem::{align_of, offset_of, size_of};

use xroce_ibverbs::*;

fn field_size<T, F>(_: fn(&T) -> &F) -> usize {
    size_of::<F>()
}

/// Asserts size and alignment, each listed field's offset, and that the fields are listed in
/// order without overlapping (so a field of the wrong width shows up too).
macro_rules! layout {
    ($ty:ident, size $size:literal, align $align:literal, $($field:ident: $offset:literal,)*) => {{
        assert_eq!(size_of::<$ty>(), $size, "size of {}", stringify!($ty));
        assert_eq!(align_of::<$ty>(), $align, "alignment of {}", stringify!($ty));
        let fields: &[(&str, usize, usize)] = &[
            $((stringify!($field), offset_of!($ty, $field), field_size(|s: &$ty| &s.$field)),)*
        ];
        let expected: &[usize] = &[$($offset),*];
        let mut end = 0;
        for (&(name, offset, width), &want) in fields.iter().zip(expected) {
            assert_eq!(offset, want, "offset of {}.{}", stringify!($ty), name);
            assert!(offset >= end, "{}.{} overlaps the field before it", stringify!($ty), name);
            end = offset + width;
        }
        assert!(end <= $size, "the last field of {} ends past its size", stringify!($ty));
    }};
}

#[test]
fn ibv_gid_layout() {
    layout! { ibv_gid, size 16, align 8,
        raw: 0,
    }
}

#[test]
fn ibv_gid_entry_layout() {
    layout! { ibv_gid_entry, size 32, align 8,
        gid: 0,
        gid_index: 16,
        port_num: 20,
        gid_type: 24,
        ndev_ifindex: 28,
    }
}
#[test]
fn ibv_global_route_layout() {
    layout! { ibv_global_route, size 24, align 8,
        dgid: 0,
        flow_label: 16,
        sgid_index: 20,
        hop_limit: 21,
        traffic_class: 22,
    }
}
#[test]
fn ibv_ah_attr_layout() {
    layout! { ibv_ah_attr, size 32, align 8,
        grh: 0,
        dlid: 24,
        sl: 26,
        src_path_bits: 27,
        static_rate: 28,
        is_global: 29,
        port_num: 30,
    }
}
#[test]
fn ibv_qp_cap_layout() {
    layout! { ibv_qp_cap, size 20, align 4,
        max_send_wr: 0,
        max_recv_wr: 4,
        max_send_sge: 8,
        max_recv_sge: 12,
        max_inline_data: 16,
    }
}
#[test]
fn ibv_qp_attr_layout() {
    layout! { ibv_qp_attr, size 144, align 8,
        qp_state: 0,
        cur_qp_state: 4,
        path_mtu: 8,
        path_mig_state: 12,
        qkey: 16,
        rq_psn: 20,
        sq_psn: 24,
        dest_qp_num: 28,
        qp_access_flags: 32,
        cap: 36,
        ah_attr: 56,
        alt_ah_attr: 88,
        pkey_index: 120,
        alt_pkey_index: 122,
        en_sqd_async_notify: 124,
        sq_draining: 125,
        max_rd_atomic: 126,
        max_dest_rd_atomic: 127,
        min_rnr_timer: 128,
        port_num: 129,
        timeout: 130,
        retry_cnt: 131,
        rnr_retry: 132,
        alt_port_num: 133,
        alt_timeout: 134,
        rate_limit: 136,
    }
}
#[test]
fn ibv_srq_attr_layout() {
    layout! { ibv_srq_attr, size 12, align 4,
        max_wr: 0,
        max_sge: 4,
        srq_limit: 8,
    }
}
#[test]
fn ibv_sge_layout() {
    layout! { ibv_sge, size 16, align 8,
        addr: 0,
        length: 8,
        lkey: 12,
    }
}
#[test]
fn ibv_wc_layout() {
    layout! { ibv_wc, size 48, align 8,
        wr_id: 0,
        status: 8,
        opcode: 12,
        vendor_err: 16,
        byte_len: 20,
        imm_data: 24,
        qp_num: 28,
        src_qp: 32,
        wc_flags: 36,
        pkey_index: 40,
        slid: 42,
        sl: 44,
        dlid_path_bits: 45,
    }
}
#[test]
fn ibv_device_attr_layout() {
    layout! { ibv_device_attr, size 232, align 8,
        fw_ver: 0,
        node_guid: 64,
        sys_image_guid: 72,
        max_mr_size: 80,
        page_size_cap: 88,
        vendor_id: 96,
        vendor_part_id: 100,
        hw_ver: 104,
        max_qp: 108,
        max_qp_wr: 112,
        device_cap_flags: 116,
        max_sge: 120,
        max_sge_rd: 124,
        max_cq: 128,
        max_cqe: 132,
        max_mr: 136,
        max_pd: 140,
        max_qp_rd_atom: 144,
        max_ee_rd_atom: 148,
        max_res_rd_atom: 152,
        max_qp_init_rd_atom: 156,
        max_ee_init_rd_atom: 160,
        atomic_cap: 164,
        max_ee: 168,
        max_rdd: 172,
        max_mw: 176,
        max_raw_ipv6_qp: 180,
        max_raw_ethy_qp: 184,
        max_mcast_grp: 188,
        max_mcast_qp_attach: 192,
        max_total_mcast_qp_attach: 196,
        max_ah: 200,
        max_fmr: 204,
        max_map_per_fmr: 208,
        max_srq: 212,
        max_srq_wr: 216,
        max_srq_sge: 220,
        max_pkeys: 224,
        local_ca_ack_delay: 226,
        phys_port_cnt: 227,
    }
}
#[test]
fn ibv_port_attr_layout() {
    layout! { ibv_port_attr, size 52, align 4,
        state: 0,
        max_mtu: 4,
        active_mtu: 8,
        gid_tbl_len: 12,
        port_cap_flags: 16,
        max_msg_sz: 20,
        bad_pkey_cntr: 24,
        qkey_viol_cntr: 28,
        pkey_tbl_len: 32,
        lid: 34,
        sm_lid: 36,
        lmc: 38,
        max_vl_num: 39,
        sm_sl: 40,
        subnet_timeout: 41,
        init_type_reply: 42,
        active_width: 43,
        active_speed: 44,
        phys_state: 45,
        link_layer: 46,
        flags: 47,
        port_cap_flags2: 48,
    }
}

/// The numbers the drop-in library depends on most, as the prototype measured them.
#[test]
fn the_facts_the_prototype_relied_on() {
    assert_eq!(size_of::<ibv_wc>(), 48);
    assert_eq!(size_of::<ibv_port_attr>(), 52);
    assert_eq!(offset_of!(ibv_port_attr, link_layer), 46);
    // Older programs get the first 48 bytes: everything before port_cap_flags2.
    assert_eq!(offset_of!(ibv_port_attr, port_cap_flags2), 48);
    assert_eq!(size_of::<ibv_device_attr>(), 232);
    assert_eq!(size_of::<ibv_qp_attr>(), 144);
    assert_eq!(size_of::<ibv_ah_attr>(), 32);
    assert_eq!(size_of::<ibv_sge>(), 16);
    assert_eq!(size_of::<ibv_gid_entry>(), 32);
}

/// A completion as a C program sees it: the bytes at the C offsets are the fields.
#[test]
fn wc_bytes_are_where_c_reads_them() {
    // (Padding fields are private to the crate: outside it a struct starts zeroed.)
    let mut wc = ibv_wc::default();
    wc.wr_id = 0x0102_0304_0506_0708;
    wc.status = ibv_wc_status::RNR_RETRY_EXC_ERR;
    wc.opcode = ibv_wc_opcode::RECV;
    wc.byte_len = 0xaabb;
    wc.imm_data = u32::from_ne_bytes([9, 8, 7, 6]);
    wc.qp_num = 0x12;
    wc.src_qp = 0x34;
    wc.wc_flags = wc_flags::IBV_WC_WITH_IMM;
    wc.sl = 3;
    let bytes = bytemuck::bytes_of(&wc);
    assert_eq!(bytes.len(), 48);
    let u32_at = |off: usize| u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap());
    assert_eq!(
        u64::from_ne_bytes(bytes[0..8].try_into().unwrap()),
        0x0102_0304_0506_0708
    );
    assert_eq!((u32_at(8), u32_at(12), u32_at(20)), (13, 128, 0xaabb));
    assert_eq!(&bytes[24..28], &[9, 8, 7, 6]);
    assert_eq!((u32_at(28), u32_at(32), u32_at(36)), (0x12, 0x34, 2));
    assert_eq!(bytes[44], 3);
    // And back: any 48 bytes are a valid ibv_wc.
    let back: ibv_wc = bytemuck::pod_read_unaligned(bytes);
    assert_eq!(back, wc);
    let garbage: ibv_wc = bytemuck::pod_read_unaligned(&[0xff; 48]);
    assert_eq!(garbage.status.c_name(), None);
}

#[test]
fn zeroed_structs_are_all_zero_bytes() {
    assert!(bytemuck::bytes_of(&ibv_qp_attr::default())
        .iter()
        .all(|&b| b == 0));
    assert!(bytemuck::bytes_of(&ibv_device_attr::default())
        .iter()
        .all(|&b| b == 0));
    assert!(bytemuck::bytes_of(&ibv_port_attr::default())
        .iter()
        .all(|&b| b == 0));
}
