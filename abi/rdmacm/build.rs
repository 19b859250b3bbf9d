//! Links the cdylib as `librdmacm.so.1` with the version nodes of rdma-core 44's library of that
//! name (the stubs are put into them by `xroce_abi_export::c_stubs!`).
fn main() {
    xroce_abi_export::link_versioned(
        "librdmacm.so.1",
        &["RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"],
    );
    println!("cargo:rerun-if-changed=build.rs");
}
