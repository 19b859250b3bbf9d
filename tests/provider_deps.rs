//! Two products, two crates: the provider (this package) and the tools (`tools/`). What every
//! MPI rank loads, the drop-in C libraries, and what an application embedding xroce builds,
//! the provider, link none of the tools' crates: no CLI, terminal, hashing, temp-file, JSON or
//! error-reporting crate. This reads the workspace's resolved dependency graph
//! (`cargo tree --locked`: the committed lock file, nothing re-resolved) and fails on any
//! such crate in the normal (linked) dependencies of each of them.
use std::collections::BTreeSet;
use std::process::Command;

/// The packages that must stay lean: the provider and each C library.
const LEAN: &[&str] = &[
    "xroce",
    "xroce-ibverbs",
    "xroce-rdmacm",
    "xroce-standin-mlx5",
    "xroce-standin-efa",
];

/// Crates that belong to the tools only.
const TOOLS_ONLY: &[&str] = &[
    "xroce-tools",
    "clap",
    "indicatif",
    "sha2",
    "tempfile",
    "serde_json",
    "anyhow",
    "signal-hook",
    "tracing-subscriber",
];

/// The names of the crates `package` links, itself included.
fn linked_crates(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "--locked", "--edges", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "--package", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_provider_and_the_c_libraries_link_no_tool_crate() {
    for package in LEAN {
        let crates = linked_crates(package);
        assert!(
            crates.contains(*package)
                && crates.contains("xroce-abi-export") == (*package != "xroce"),
            "the tree of {package} was read: {crates:?}"
        );
        let tools: Vec<_> = TOOLS_ONLY.iter().filter(|c| crates.contains(**c)).collect();
        assert!(tools.is_empty(), "{package} links tool crates: {tools:?}");
    }
}

#[test]
fn the_tools_do_link_them() {
    // The check above can fail: the same reading of the tools' tree finds them.
    let crates = linked_crates("xroce-tools");
    for name in ["xroce", "clap", "indicatif", "sha2", "anyhow"] {
        assert!(
            crates.contains(name),
            "xroce-tools without {name}: {crates:?}"
        );
    }
}
