//! Stand-in `libmlx5.so.1`: the mlx5 (ConnectX) direct-verbs library, as far as a program
//! needs it to start.
//!
//! perftest links libmlx5 and binds `mlx5dv_*` at load time (BIND_NOW), so do pyverbs'
//! `providers.mlx5` modules; rdma-core's real libmlx5 in turn needs libibverbs' private
//! provider symbols and registers a provider from its constructor. xroce's devices are not
//! mlx5 devices and say so (no Mellanox vendor id, so perftest never takes its mlx5 paths);
//! a program that calls these anyway gets `EOPNOTSUPP` and one line on stderr per function.
//!
//! The table lists every function rdma-core 44's libmlx5 exports, under its version node;
//! return kinds follow `<infiniband/mlx5dv.h>` and the mlx5dv man pages (abi/export's
//! `c_stubs!`): pointers are NULL, `int`s are "0 or the value of errno" except where noted.

xroce_abi_export::c_stubs! { why: "xroce's devices are not mlx5 devices";
    "MLX5_1.0" {
        mlx5dv_query_device: Errno,
    }
    "MLX5_1.1" {
        mlx5dv_create_cq: Null,
    }
    "MLX5_1.2" {
        mlx5dv_init_obj: Errno,
        mlx5dv_set_context_attr: Errno,
    }
    "MLX5_1.3" {
        mlx5dv_create_qp: Null,
        mlx5dv_create_wq: Null,
    }
    "MLX5_1.4" {
        mlx5dv_get_clock_info: Errno,
    }
    "MLX5_1.5" {
        mlx5dv_create_flow_action_esp: Null,
    }
    "MLX5_1.6" {
        mlx5dv_create_flow: Null,
        mlx5dv_create_flow_matcher: Null,
        mlx5dv_destroy_flow_matcher: Errno,
    }
    "MLX5_1.7" {
        mlx5dv_create_flow_action_modify_header: Null,
        mlx5dv_create_flow_action_packet_reformat: Null,
        mlx5dv_devx_alloc_uar: Null,
        mlx5dv_devx_free_uar: Void,
        mlx5dv_devx_general_cmd: Errno,
        mlx5dv_devx_obj_create: Null,
        mlx5dv_devx_obj_destroy: Errno,
        mlx5dv_devx_obj_modify: Errno,
        mlx5dv_devx_obj_query: Errno,
        mlx5dv_devx_query_eqn: Errno,
        mlx5dv_devx_umem_dereg: Errno,
        mlx5dv_devx_umem_reg: Null,
        mlx5dv_open_device: Null,
    }
    "MLX5_1.8" {
        mlx5dv_devx_cq_modify: Errno,
        mlx5dv_devx_cq_query: Errno,
        mlx5dv_devx_ind_tbl_modify: Errno,
        mlx5dv_devx_ind_tbl_query: Errno,
        mlx5dv_devx_qp_modify: Errno,
        mlx5dv_devx_qp_query: Errno,
        mlx5dv_devx_srq_modify: Errno,
        mlx5dv_devx_srq_query: Errno,
        mlx5dv_devx_wq_modify: Errno,
        mlx5dv_devx_wq_query: Errno,
        mlx5dv_is_supported: NotThisVendorFalse,
    }
    "MLX5_1.9" {
        mlx5dv_devx_create_cmd_comp: Null,
        mlx5dv_devx_destroy_cmd_comp: Void,
        mlx5dv_devx_get_async_cmd_comp: Errno,
        mlx5dv_devx_obj_query_async: Errno,
    }
    "MLX5_1.10" {
        mlx5dv_alloc_dm: Null,
        mlx5dv_create_mkey: Null,
        mlx5dv_destroy_mkey: Errno,
        mlx5dv_dr_action_create_dest_ibv_qp: Null,
        mlx5dv_dr_action_create_dest_table: Null,
        mlx5dv_dr_action_create_dest_vport: Null,
        mlx5dv_dr_action_create_drop: Null,
        mlx5dv_dr_action_create_flow_counter: Null,
        mlx5dv_dr_action_create_modify_header: Null,
        mlx5dv_dr_action_create_packet_reformat: Null,
        mlx5dv_dr_action_create_tag: Null,
        mlx5dv_dr_action_destroy: Errno,
        mlx5dv_dr_domain_create: Null,
        mlx5dv_dr_domain_destroy: Errno,
        mlx5dv_dr_domain_sync: Errno,
        mlx5dv_dr_matcher_create: Null,
        mlx5dv_dr_matcher_destroy: Errno,
        mlx5dv_dr_rule_create: Null,
        mlx5dv_dr_rule_destroy: Errno,
        mlx5dv_dr_table_create: Null,
        mlx5dv_dr_table_destroy: Errno,
        mlx5dv_qp_ex_from_ibv_qp_ex: Null,
    }
    "MLX5_1.11" {
        mlx5dv_devx_create_event_channel: Null,
        mlx5dv_devx_destroy_event_channel: Void,
        // ssize_t: the bytes read, or -1 and errno.
        mlx5dv_devx_get_event: SsizeMinusOne,
        mlx5dv_devx_subscribe_devx_event: Errno,
        mlx5dv_devx_subscribe_devx_event_fd: Errno,
    }
    "MLX5_1.12" {
        mlx5dv_alloc_var: Null,
        mlx5dv_dr_action_create_flow_meter: Null,
        mlx5dv_dr_action_modify_flow_meter: Errno,
        mlx5dv_dump_dr_domain: Errno,
        mlx5dv_dump_dr_matcher: Errno,
        mlx5dv_dump_dr_rule: Errno,
        mlx5dv_dump_dr_table: Errno,
        mlx5dv_free_var: Void,
    }
    "MLX5_1.13" {
        mlx5dv_pp_alloc: Null,
        mlx5dv_pp_free: Void,
    }
    "MLX5_1.14" {
        mlx5dv_dr_action_create_default_miss: Null,
        mlx5dv_dr_domain_set_reclaim_device_memory: Void,
        mlx5dv_modify_qp_lag_port: Errno,
        mlx5dv_query_qp_lag_port: Errno,
    }
    "MLX5_1.15" {
        mlx5dv_dr_action_create_dest_devx_tir: Null,
    }
    "MLX5_1.16" {
        mlx5dv_dr_action_create_dest_array: Null,
        mlx5dv_dr_action_create_flow_sampler: Null,
    }
    "MLX5_1.17" {
        mlx5dv_dr_action_create_aso: Null,
        mlx5dv_dr_action_create_pop_vlan: Null,
        mlx5dv_dr_action_create_push_vlan: Null,
        mlx5dv_dr_action_modify_aso: Errno,
        mlx5dv_modify_qp_sched_elem: Errno,
        mlx5dv_modify_qp_udp_sport: Errno,
        mlx5dv_sched_leaf_create: Null,
        mlx5dv_sched_leaf_destroy: Errno,
        mlx5dv_sched_leaf_modify: Errno,
        mlx5dv_sched_node_create: Null,
        mlx5dv_sched_node_destroy: Errno,
        mlx5dv_sched_node_modify: Errno,
    }
    "MLX5_1.18" {
        mlx5dv_reserved_qpn_alloc: Errno,
        mlx5dv_reserved_qpn_dealloc: Errno,
    }
    "MLX5_1.19" {
        // What the inline mlx5dv_query_port() calls.
        _mlx5dv_query_port: Errno,
        mlx5dv_devx_umem_reg_ex: Null,
        mlx5dv_dm_map_op_addr: Null,
    }
    "MLX5_1.20" {
        // What the inline mlx5dv_mkey_check() calls.
        _mlx5dv_mkey_check: Errno,
        mlx5dv_dr_domain_allow_duplicate_rules: Void,
        mlx5dv_map_ah_to_qp: Errno,
        // The number of work requests cancelled, or -errno.
        mlx5dv_qp_cancel_posted_send_wrs: NegErrno,
    }
    "MLX5_1.21" {
        mlx5dv_crypto_login: Errno,
        mlx5dv_crypto_login_query_state: Errno,
        mlx5dv_crypto_logout: Errno,
        mlx5dv_dci_stream_id_reset: Errno,
        mlx5dv_dek_create: Null,
        mlx5dv_dek_destroy: Errno,
        mlx5dv_dek_query: Errno,
        mlx5dv_dr_action_create_dest_ib_port: Null,
        mlx5dv_dr_matcher_set_layout: Errno,
        mlx5dv_get_vfio_device_list: Null,
        // A file descriptor.
        mlx5dv_vfio_get_events_fd: MinusOne,
        mlx5dv_vfio_process_events: Errno,
    }
    "MLX5_1.22" {
        mlx5dv_dr_aso_other_domain_link: Errno,
        mlx5dv_dr_aso_other_domain_unlink: Errno,
    }
    "MLX5_1.23" {
        mlx5dv_devx_alloc_msi_vector: Null,
        mlx5dv_devx_create_eq: Null,
        mlx5dv_devx_destroy_eq: Errno,
        mlx5dv_devx_free_msi_vector: Errno,
    }
    "MLX5_1.24" {
        mlx5dv_create_steering_anchor: Null,
        mlx5dv_crypto_login_create: Null,
        mlx5dv_crypto_login_destroy: Errno,
        mlx5dv_crypto_login_query: Errno,
        mlx5dv_destroy_steering_anchor: Errno,
        mlx5dv_dr_action_create_dest_root_table: Null,
    }
}

// rdma-core keeps the MLX5_1.0 mlx5dv_init_obj for programs linked before MLX5_1.2 changed
// its default version; the same stub answers both.
xroce_abi_export::c_alias!(mlx5dv_init_obj, "MLX5_1.0");
