//! Installing on the nodes of a cluster: `scripts/deb.sh` packages this build (the `xroce`
//! binary and the drop-in libraries), and the package is installed with dpkg, used, and
//! removed, as an administrator would on each node:
//!
//! - `dpkg -i` puts `xroce` in /usr/bin and the libraries in /usr/lib/xroce, with links of
//!   their sonames in /usr/lib/xroce/sonames, the same path on every node;
//! - the installed `xroce run` (no XROCE_LIB_DIR, started from outside the source tree)
//!   finds them and runs rdma-core's unmodified `ibv_devinfo` on xroce's libibverbs, in a
//!   namespace whose veth end becomes the device `xroce_<ifname>`;
//! - `dpkg -r` removes every file it installed.
//!
//! Needs root, dpkg-deb and ibverbs-utils; under `XROCE_CI=1` a missing one fails the test,
//! elsewhere it skips visibly. It refuses to run where a package named xroce is installed
//! already (it would not be ours to remove).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use xroce::netns::{LinkConfig, VethLink};

const INSTALLED: [&str; 6] = [
    "/usr/lib/xroce/sonames/libibverbs.so.1",
    "/usr/bin/xroce",
    "/usr/lib/xroce/libxroce_ibverbs.so",
    "/usr/lib/xroce/libxroce_rdmacm.so",
    "/usr/lib/xroce/libxroce_mlx5.so",
    "/usr/lib/xroce/libxroce_efa.so",
];

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("run a command");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn installed() -> bool {
    Command::new("dpkg")
        .args(["-s", "xroce"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_debian_package_installs_runs_and_removes() {
    const TEST: &str = "the_debian_package_installs_runs_and_removes";
    if !common::privileged_or_skip(TEST) {
        return;
    }
    let ci = std::env::var("XROCE_CI").is_ok_and(|v| v == "1");
    for tool in ["dpkg-deb", "ibv_devinfo"] {
        if !Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success())
        {
            let why = format!("needs {tool} (scripts/setup.sh installs it)");
            assert!(!ci, "{TEST}: {why}");
            common::report_skip(TEST, &why);
            return;
        }
    }
    assert!(
        !installed(),
        "a package named xroce is installed already; remove it first (dpkg -r xroce)"
    );
    let build: PathBuf = common::ensure_abi_libraries();
    let out_dir = tempfile::tempdir().unwrap();
    let script = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("scripts/deb.sh");
    let (ok, text) = run(Command::new(&script)
        .env("BUILD_DIR", &build)
        .env("OUT_DIR", out_dir.path()));
    assert!(ok, "scripts/deb.sh failed:\n{text}");
    let deb = PathBuf::from(text.trim().lines().last().unwrap_or_default());
    assert!(deb.is_file(), "no package at {}:\n{text}", deb.display());

    let (ok, text) = run(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(ok, "dpkg -i failed:\n{text}");
    let result = std::panic::catch_unwind(|| {
        for file in INSTALLED {
            assert!(
                Path::new(file).is_file(),
                "{file} was not installed (or is a broken link)"
            );
        }
        let link = VethLink::create(&LinkConfig::default()).expect("namespaces and veth pair");
        let (ok, text) = run(link
            .a
            .command("/usr/bin/xroce")
            .args(["run", "-d", &link.a_if, "--", "ibv_devinfo", "-v"])
            .current_dir("/")
            .env_remove("XROCE_LIB_DIR"));
        assert!(ok, "the installed xroce run failed:\n{text}");
        assert!(
            text.contains(&format!("hca_id:\txroce_{}", link.a_if)),
            "ibv_devinfo did not see the device:\n{text}"
        );
        assert!(text.contains("PORT_ACTIVE"), "{text}");
        // The packaged links are what the program was given, not a private folder.
        let (ok, env) = run(Command::new("/usr/bin/xroce")
            .args(["run", "--", "sh", "-c", "echo $LD_LIBRARY_PATH"])
            .env_remove("LD_LIBRARY_PATH"));
        assert!(ok, "{env}");
        assert_eq!(env.trim(), "/usr/lib/xroce/sonames", "{env}");
    });
    let (removed, text) = run(Command::new("dpkg").args(["-r", "xroce"]));
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    assert!(removed, "dpkg -r failed:\n{text}");
    assert!(!installed(), "xroce is still installed");
    for file in INSTALLED {
        assert!(!Path::new(file).exists(), "{file} was left behind");
    }
}
