//! Links the cdylib as `libefa.so.1` with the version nodes of rdma-core 44's library of that
//! name (the stubs are put into them by `xroce_abi_export::c_stubs!`).
fn main() {
    xroce_abi_export::link_versioned("libefa.so.1", &["EFA_1.0", "EFA_1.1", "EFA_1.2"]);
    println!("cargo:rerun-if-changed=build.rs");
}
