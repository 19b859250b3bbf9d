//! Compiles the XDP program (bpf/xroce_xdp.c) into $OUT_DIR/xroce_xdp.o; the AF_XDP driver
//! embeds that object with `include_bytes!` and loads it from memory. Only with the `xdp`
//! feature (the default): without it there is no AF_XDP driver and clang is never run.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/xroce_xdp.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    if std::env::var_os("CARGO_FEATURE_XDP").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("xroce_xdp.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let multiarch = match std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("aarch64") => "aarch64-linux-gnu",
        _ => "x86_64-linux-gnu",
    };
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
        .arg(format!("-I/usr/include/{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("\n\n{clang} failed to compile {src} ({s}); see the errors above.\n\n"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "\n\nclang was not found: xroce needs it to compile its XDP program ({src}).\n\
             Install it with `scripts/setup.sh` (as root), or `apt-get install clang llvm \
             linux-libc-dev`, or point the CLANG environment variable at a clang binary.\n\n"
        ),
        Err(e) => panic!("\n\ncould not run {clang} to compile {src}: {e}\n\n"),
    }
}
