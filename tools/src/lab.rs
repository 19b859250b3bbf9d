//! The soft-RoCE lab's scripts (QEMU guests running Linux `rdma_rxe` on a bridge in a network
//! namespace, host-side endpoint namespaces attached to it): shell scripts under `lab/`,
//! readable by anyone who knows `ip`, `tc`, `qemu-system-x86_64`, `debootstrap` and `tcpdump`
//! and runnable without Rust. They are embedded with `include_str!`, so an installed `xroce`
//! works outside the repository: [`install_scripts`] writes them to `<lab dir>/scripts/` (only
//! when their content changed) and [`run_script`] runs one. See `docs/lab.md`.
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};

/// The lab scripts, as (path relative to the scripts directory, content).
const SCRIPTS: &[(&str, &str)] = &[
    ("common.sh", include_str!("../../lab/common.sh")),
    ("build-image.sh", include_str!("../../lab/build-image.sh")),
    ("lab.sh", include_str!("../../lab/lab.sh")),
    ("guestctl.py", include_str!("../../lab/guestctl.py")),
    ("guest/init", include_str!("../../lab/guest/init")),
    ("guest/lab-ctl", include_str!("../../lab/guest/lab-ctl")),
    ("guest/lab-bg", include_str!("../../lab/guest/lab-bg")),
    ("guest/lab-wait", include_str!("../../lab/guest/lab-wait")),
    ("guest/lab-kill", include_str!("../../lab/guest/lab-kill")),
    ("guest/lab-mr.py", include_str!("../../lab/guest/lab-mr.py")),
    ("guest/lab-mw.py", include_str!("../../lab/guest/lab-mw.py")),
    (
        "guest/lab-blackout",
        include_str!("../../lab/guest/lab-blackout"),
    ),
];

/// Runs `script` (a name among the embedded scripts, installed first into
/// `<lab_dir>/scripts`) with `words` and `env`, for the lab in `lab_dir` (and the namespace
/// `ns`, when not the default); the script's exit status.
pub fn run_script(
    lab_dir: &Path,
    ns: Option<&str>,
    script: &str,
    words: &[String],
    env: &[(&str, String)],
) -> anyhow::Result<i32> {
    if let Some(ns) = ns {
        validate_ns(ns)?;
    }
    let scripts = lab_dir.join("scripts");
    install_scripts(&scripts)?;
    let mut cmd = Command::new("bash");
    cmd.arg(scripts.join(script)).args(words);
    cmd.env("XROCE_LAB_DIR", lab_dir);
    if let Some(ns) = ns {
        cmd.env("XROCE_LAB_NS", ns);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot run bash {}", scripts.join(script).display()))?;
    // A signal-terminated script has no code; report it the way a shell would.
    Ok(status.code().unwrap_or(128 + 15))
}

/// Namespace names become file names under /run/netns and prefixes of endpoint namespaces.
pub fn validate_ns(ns: &str) -> anyhow::Result<()> {
    let ok = !ns.is_empty()
        && ns.len() <= 32
        && ns
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        bail!("--ns must be 1-32 of [A-Za-z0-9_-], got {ns:?}");
    }
    Ok(())
}

/// Writes the embedded scripts into `dir`, replacing a file only when its content differs;
/// each file is written to a temporary name and renamed, so concurrent `xroce lab` runs never
/// see a half-written script.
pub fn install_scripts(dir: &Path) -> anyhow::Result<()> {
    for (rel, content) in SCRIPTS {
        let path = dir.join(rel);
        if fs::read(&path).ok().as_deref() == Some(content.as_bytes()) {
            continue;
        }
        let parent = path.parent().expect("script paths have a parent");
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let tmp = parent.join(format!(
            ".{}.{}",
            path.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let mut f =
            fs::File::create(&tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        f.write_all(content.as_bytes())?;
        f.set_permissions(fs::Permissions::from_mode(0o755))?;
        drop(f);
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_checked() {
        assert!(validate_ns("xroce-lab").is_ok());
        assert!(validate_ns("xrl_123").is_ok());
        assert!(validate_ns("").is_err());
        assert!(validate_ns("../etc").is_err());
        assert!(validate_ns("a b").is_err());
        assert!(validate_ns(&"x".repeat(33)).is_err());
    }

    #[test]
    fn every_file_of_the_lab_directory_is_embedded() {
        // The image stamp hashes lab/guest/*: a file on disk but not embedded would make an
        // installed xroce build a different image than the checkout.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab");
        let mut on_disk = Vec::new();
        for sub in ["", "guest"] {
            for entry in fs::read_dir(root.join(sub)).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_file() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    on_disk.push(if sub.is_empty() {
                        name
                    } else {
                        format!("{sub}/{name}")
                    });
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = SCRIPTS.iter().map(|(r, _)| r.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
    }

    #[test]
    fn scripts_are_written_once_and_match_the_embedded_copy() {
        let dir = std::env::temp_dir().join(format!("xroce-lab-scripts-{}", std::process::id()));
        install_scripts(&dir).unwrap();
        for (rel, content) in SCRIPTS {
            assert_eq!(fs::read_to_string(dir.join(rel)).unwrap(), *content);
        }
        let mtime = fs::metadata(dir.join("lab.sh"))
            .unwrap()
            .modified()
            .unwrap();
        install_scripts(&dir).unwrap();
        assert_eq!(
            fs::metadata(dir.join("lab.sh"))
                .unwrap()
                .modified()
                .unwrap(),
            mtime,
            "an unchanged script must not be rewritten"
        );
        fs::write(dir.join("lab.sh"), "tampered").unwrap();
        install_scripts(&dir).unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("lab.sh")).unwrap(),
            SCRIPTS.iter().find(|(r, _)| *r == "lab.sh").unwrap().1
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
