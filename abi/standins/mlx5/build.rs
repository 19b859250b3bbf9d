//! Links the cdylib as `libmlx5.so.1` with the version nodes of rdma-core 44's library of that
//! name (the stubs are put into them by `xroce_abi_export::c_stubs!`).
fn main() {
    xroce_abi_export::link_versioned(
        "libmlx5.so.1",
        &[
            "MLX5_1.0",
            "MLX5_1.1",
            "MLX5_1.2",
            "MLX5_1.3",
            "MLX5_1.4",
            "MLX5_1.5",
            "MLX5_1.6",
            "MLX5_1.7",
            "MLX5_1.8",
            "MLX5_1.9",
            "MLX5_1.10",
            "MLX5_1.11",
            "MLX5_1.12",
            "MLX5_1.13",
            "MLX5_1.14",
            "MLX5_1.15",
            "MLX5_1.16",
            "MLX5_1.17",
            "MLX5_1.18",
            "MLX5_1.19",
            "MLX5_1.20",
            "MLX5_1.21",
            "MLX5_1.22",
            "MLX5_1.23",
            "MLX5_1.24",
        ],
    );
    println!("cargo:rerun-if-changed=build.rs");
}
