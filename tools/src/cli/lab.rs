//! `xroce lab`: the project's soft-RoCE lab (QEMU guests running Linux `rdma_rxe` on a bridge in
//! a network namespace) and host-side endpoint namespaces attached to it.
//! The arguments; the scripts and how they run are `xroce_tools::lab`. See `docs/lab.md`.
use std::path::PathBuf;

use xroce_tools::lab::{install_scripts, run_script};

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
    run_script(&lab_dir, args.ns.as_deref(), script, &words, &env)
}
