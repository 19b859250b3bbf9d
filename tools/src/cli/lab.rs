//! `xroce lab`: the project's soft-RoCE lab (QEMU guests running Linux `rdma_rxe` on a bridge in
//! a network namespace) and host-side endpoint namespaces attached to it.
//!
//! The lab is orchestration of `ip`, `tc`, `qemu-system-x86_64`, `debootstrap` and `tcpdump`, so
//! it is written as the shell scripts under `lab/` (readable by anyone who knows those tools,
//! runnable without Rust). This command embeds them with `include_str!`, so an installed
//! `xroce` works outside the repository: it writes them to `<lab dir>/scripts/` (only when
//! their content changed) and runs them. See `docs/lab.md`.
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The lab scripts, as (path relative to the scripts directory, content).
const SCRIPTS: &[(&str, &str)] = &[
    ("common.sh", include_str!("../../../lab/common.sh")),
    (
        "build-image.sh",
        include_str!("../../../lab/build-image.sh"),
    ),
    ("lab.sh", include_str!("../../../lab/lab.sh")),
    ("guestctl.py", include_str!("../../../lab/guestctl.py")),
    ("guest/init", include_str!("../../../lab/guest/init")),
    ("guest/lab-ctl", include_str!("../../../lab/guest/lab-ctl")),
    ("guest/lab-bg", include_str!("../../../lab/guest/lab-bg")),
    (
        "guest/lab-wait",
        include_str!("../../../lab/guest/lab-wait"),
    ),
    (
        "guest/lab-kill",
        include_str!("../../../lab/guest/lab-kill"),
    ),
    (
        "guest/lab-mr.py",
        include_str!("../../../lab/guest/lab-mr.py"),
    ),
    (
        "guest/lab-mw.py",
        include_str!("../../../lab/guest/lab-mw.py"),
    ),
    (
        "guest/lab-blackout",
        include_str!("../../../lab/guest/lab-blackout"),
    ),
];

/// Default work directory: guest image, state of running labs, per-run captures and logs.
pub const DEFAULT_LAB_DIR: &str = "/var/tmp/xroce-lab";

/// Manage the rxe lab: build the guest image, boot guests, attach endpoints, impair links.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  sudo xroce lab build                      # guest image in /var/tmp/xroce-lab/image (~2 min once)
  sudo xroce lab up 2                       # g1 = 198.18.0.11, g2 = 198.18.0.12
  sudo xroce lab attach me                  # namespace xroce-lab-me, eth0 = 198.18.0.2
  sudo xroce lab attach far --routed        # xroce-lab-far behind router xroce-lab-far-rt: 198.19.3.2
  sudo xroce lab exec 1 'ibv_devinfo -d rxe0'
  sudo xroce lab netem 1 'loss 1% delay 1ms reorder 5%'
  sudo xroce lab capture start mytest       # tcpdump on the bridge
  sudo xroce lab status
  sudo xroce lab down")]
pub struct Args {
    /// Lab name (its network namespace); several labs can run at once [env: XROCE_LAB_NS;
    /// default: xroce-lab].
    #[arg(long, global = true)]
    ns: Option<String>,
    /// Work directory [env: XROCE_LAB_DIR; default: /var/tmp/xroce-lab].
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: LabCommand,
}

#[derive(clap::Subcommand)]
enum LabCommand {
    /// Build the guest image, or do nothing if it is up to date (installs qemu, debootstrap).
    Build {
        /// Rebuild everything from scratch.
        #[arg(long)]
        force: bool,
    },
    /// Boot the guests (removes a stale lab of the same name first).
    Up {
        /// Number of guests: g1 = 198.18.0.11, g2 = .12, ...
        #[arg(default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=9))]
        guests: u8,
        /// Link MTU of the bridge, guests and endpoints (9000 gives rxe a 4096 path MTU).
        #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(1280..=9000))]
        mtu: u16,
        /// Memory per guest in MiB (256 is too small for the initramfs).
        #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u16).range(384..=8192))]
        mem: u16,
    },
    /// Stop the guests, captures and endpoints; the run's captures and logs are kept.
    Down,
    /// Show what is really running; exit 0 healthy, 1 down, 2 degraded.
    Status,
    /// Run a bash script in a guest; the exit status is the script's.
    Exec {
        /// Guest number (1 = g1).
        guest: u8,
        /// The script (several words are joined with spaces).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        script: Vec<String>,
    },
    /// Impair both directions of a guest's link with tc netem, or `off`.
    Netem {
        /// Guest number.
        guest: u8,
        /// netem arguments, e.g. `loss 1% delay 1ms reorder 5%`, or `off`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Change the link MTU of the running lab (bridge, guests, endpoints).
    Mtu {
        #[arg(value_parser = clap::value_parser!(u16).range(1280..=9000))]
        mtu: u16,
    },
    /// Attach a host-side endpoint: namespace <lab>-NAME with eth0 on the lab's bridge.
    Attach {
        /// Endpoint name, 1-8 of [a-z0-9].
        name: String,
        /// Address in 198.18.0.0/24 (default: the first free of .2 to .9).
        ip: Option<String>,
        /// Put the endpoint behind a router namespace <lab>-NAME-rt: the router takes the
        /// bridge address, the endpoint gets 198.19.K.2/24 (K = the address's last byte) and
        /// the guests a route to it through the router.
        #[arg(long)]
        routed: bool,
    },
    /// Remove an endpoint namespace.
    Detach { name: String },
    /// Start or stop a tcpdump of the bridge into <run dir>/pcaps/NAME.pcap (prints the path).
    Capture {
        #[arg(value_parser = ["start", "stop"])]
        action: String,
        name: String,
        /// With `start`: capture only frames to or from each of these IPv4 addresses (the two
        /// ends of one case, when cases run at once).
        #[arg(value_parser = clap::value_parser!(std::net::Ipv4Addr))]
        hosts: Vec<std::net::Ipv4Addr>,
    },
    /// Print the run directory of the running lab (captures, console logs).
    RunDir,
    /// Write the embedded lab scripts to a directory (to read them or run them by hand).
    Scripts {
        /// Target directory (default: <lab dir>/scripts).
        dir: Option<PathBuf>,
    },
}

/// Runs `xroce lab ...`; returns the exit status of the underlying script.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let lab_dir = args
        .dir
        .clone()
        .or_else(|| std::env::var_os("XROCE_LAB_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LAB_DIR));
    if let LabCommand::Scripts { dir } = &args.command {
        let dir = dir.clone().unwrap_or_else(|| lab_dir.join("scripts"));
        install_scripts(&dir)?;
        println!("{}", dir.display());
        return Ok(0);
    }
    if let Some(ns) = &args.ns {
        validate_ns(ns)?;
    }
    let scripts = lab_dir.join("scripts");
    install_scripts(&scripts)?;

    let (script, words, env): (&str, Vec<String>, Vec<(&str, String)>) = match args.command {
        LabCommand::Build { force } => (
            "build-image.sh",
            vec![],
            vec![("FORCE", if force { "1" } else { "0" }.to_string())],
        ),
        LabCommand::Up { guests, mtu, mem } => (
            "lab.sh",
            vec!["up".into(), guests.to_string()],
            vec![
                ("XROCE_LAB_MTU", mtu.to_string()),
                ("XROCE_LAB_MEM", mem.to_string()),
            ],
        ),
        LabCommand::Down => ("lab.sh", vec!["down".into()], vec![]),
        LabCommand::Status => ("lab.sh", vec!["status".into()], vec![]),
        LabCommand::Exec { guest, script } => (
            "lab.sh",
            vec!["exec".into(), guest.to_string(), script.join(" ")],
            vec![],
        ),
        LabCommand::Netem { guest, args } => (
            "lab.sh",
            vec!["netem".into(), guest.to_string(), args.join(" ")],
            vec![],
        ),
        LabCommand::Mtu { mtu } => ("lab.sh", vec!["mtu".into(), mtu.to_string()], vec![]),
        LabCommand::Attach { name, ip, routed } => {
            let verb = if routed { "attach-routed" } else { "attach" };
            let mut w = vec![verb.into(), name];
            w.extend(ip);
            ("lab.sh", w, vec![])
        }
        LabCommand::Detach { name } => ("lab.sh", vec!["detach".into(), name], vec![]),
        LabCommand::Capture {
            action,
            name,
            hosts,
        } => {
            let mut w = vec!["capture".into(), action, name];
            w.extend(hosts.iter().map(|ip| ip.to_string()));
            ("lab.sh", w, vec![])
        }
        LabCommand::RunDir => ("lab.sh", vec!["run-dir".into()], vec![]),
        LabCommand::Scripts { .. } => unreachable!("handled above"),
    };
    let mut cmd = Command::new("bash");
    cmd.arg(scripts.join(script)).args(&words);
    cmd.env("XROCE_LAB_DIR", &lab_dir);
    if let Some(ns) = &args.ns {
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
fn validate_ns(ns: &str) -> anyhow::Result<()> {
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
