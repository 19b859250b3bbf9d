//! Links the cdylib as `libibverbs.so.1` with rdma-core's version nodes (the functions are
//! put into them by `xroce_abi_export::c_export!`).
fn main() {
    xroce_abi_export::link_versioned(
        "libibverbs.so.1",
        &[
            "IBVERBS_1.0",
            "IBVERBS_1.1",
            "IBVERBS_1.5",
            "IBVERBS_1.6",
            "IBVERBS_1.7",
            "IBVERBS_1.8",
            "IBVERBS_1.9",
            "IBVERBS_1.10",
            "IBVERBS_1.11",
            "IBVERBS_1.12",
            "IBVERBS_1.13",
            "IBVERBS_1.14",
            "IBVERBS_PRIVATE_34",
            // The rdma_* calls xroce's librdmacm.so.1 forwards to (src/rdmacm).
            "XROCE_RDMACM_PRIVATE",
            // xroce's own calls (xroce_read_counters).
            "XROCE_1.0",
        ],
    );
    println!("cargo:rerun-if-changed=build.rs");
}
