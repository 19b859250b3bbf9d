//! `xroce run`: runs an unmodified verbs program (rdma-core's tools, perftest, pyverbs, ...)
//! on xroce's drop-in `libibverbs.so.1`.
//!
//! It finds the libraries, makes a private temporary directory of symlinks named by soname
//! (`libibverbs.so.1 -> .../libxroce_ibverbs.so`, and the stand-ins `libmlx5.so.1`,
//! `libefa.so.1`, `librdmacm.so.1`), puts it first on `LD_LIBRARY_PATH`, sets the
//! `XROCE_*` variables the library reads from the options, runs the program as a child with
//! the terminal inherited, forwards SIGINT/SIGTERM/SIGHUP to it, removes the directory and
//! exits with the program's status (128 + signal number if a signal ended it).
use std::ffi::OsString;
use std::path::PathBuf;

use xroce::verbs::ProgressMode;
use xroce_tools::endpoint::verbs::DriverChoice;
use xroce_tools::launch::{launch, RunError, RunOptions};

const EXAMPLES: &str = "\
Examples:
  xroce run -- ibv_devinfo -v
  # server in one namespace, client in the other (root: AF_XDP):
  xroce run -d veth0 -- ibv_rc_pingpong -g 1
  xroce run -d veth1 -- ibv_rc_pingpong -g 1 198.18.0.1
  xroce run -d veth1 --pcap /tmp/c.pcap -- ib_write_bw -x 1 -a 198.18.0.1
  # without root, over a kernel UDP socket:
  xroce run -d eth0 --driver udp -- ib_send_bw -x 1

Libraries: $XROCE_LIB_DIR if set, else the directory of this xroce executable (where cargo
puts libxroce_ibverbs.so), else /usr/local/lib/xroce.";

/// Run PROGRAM on xroce's libibverbs.so.1 (rdma-core's tools, perftest, pyverbs, ...).
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES, verbatim_doc_comment)]
pub struct Args {
    /// Network interface(s) the library offers as devices (xroce_<IFACE>); repeat or
    /// separate with commas. Default: every Ethernet interface that is up (XROCE_NETDEV).
    #[arg(
        short = 'd',
        long = "ib-dev",
        value_name = "IFACE",
        value_delimiter = ','
    )]
    pub devices: Vec<String>,
    /// Frame driver (XROCE_DRIVER; the library's default is xdp).
    #[arg(long = "driver", value_parser = super::values::driver())]
    pub driver: Option<DriverChoice>,
    /// How the background progress thread waits (XROCE_PROGRESS; default wakeup).
    #[arg(long = "progress", value_parser = super::values::progress())]
    pub progress: Option<ProgressMode>,
    /// Engine shards per device, one per thread and queue (XROCE_SHARDS; default 1).
    #[arg(long = "shards", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=xroce::verbs::MAX_SHARDS as i64))]
    pub shards: Option<u32>,
    /// Write every frame the program's devices send and receive to FILE (XROCE_PCAP; `%p`
    /// in FILE becomes the process id).
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(
        value_name = "PROGRAM",
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub command: Vec<OsString>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    match launch(RunOptions {
        devices: args.devices,
        driver: args.driver,
        progress: args.progress,
        shards: args.shards,
        pcap: args.pcap,
        command: args.command,
    }) {
        Ok(code) => Ok(code),
        Err(e @ (RunError::ProgramNotFound(_) | RunError::NotExecutable { .. })) => {
            eprintln!("xroce: error: {e}");
            Ok(e.exit_code())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::Path;
    use xroce_tools::launch::check_interfaces;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|c| c.args)
    }
    #[test]
    fn options_before_the_separator_and_the_program_after() {
        let a = parse(&[
            "-d",
            "veth0",
            "--driver",
            "udp",
            "--progress",
            "busy-poll",
            "--pcap",
            "x.pcap",
            "--",
            "ib_write_bw",
            "-a",
            "-d",
            "xroce_veth0",
            "198.18.0.1",
        ])
        .unwrap();
        assert_eq!(a.devices, ["veth0"]);
        assert_eq!(a.driver, Some(DriverChoice::Udp));
        assert_eq!(a.progress, Some(ProgressMode::BusyPoll));
        assert_eq!(a.pcap.as_deref(), Some(Path::new("x.pcap")));
        assert_eq!(
            a.command,
            ["ib_write_bw", "-a", "-d", "xroce_veth0", "198.18.0.1"]
        );
        // Without `--`, the program's own options still belong to it.
        let a = parse(&["ibv_devinfo", "-v", "--driver", "nope"]).unwrap();
        assert_eq!(a.command, ["ibv_devinfo", "-v", "--driver", "nope"]);
        assert_eq!(a.driver, None);
        // Several interfaces: repeated or comma-separated.
        let a = parse(&["-d", "a,b", "-d", "c", "--", "ibv_devices"]).unwrap();
        assert_eq!(a.devices, ["a", "b", "c"]);
    }

    #[test]
    fn bad_options_are_refused_before_anything_runs() {
        let err = parse(&["--driver", "mem", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("[possible values: xdp, udp, relay]"), "{err}");
        let err = parse(&["--progress", "spin", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("[possible values: wakeup, busy-poll]"),
            "{err}"
        );
        let err = parse(&["--shards", "0", "--", "true"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid value '0' for '--shards <N>'"),
            "{err}"
        );
        assert_eq!(
            parse(&["--shards", "2", "--", "true"]).unwrap().shards,
            Some(2)
        );
        let err = parse(&["-d", "veth0"]).unwrap_err().to_string();
        assert!(err.contains("<PROGRAM>"), "{err}");
        assert!(check_interfaces(&["xroce-nope0".into()])
            .unwrap_err()
            .to_string()
            .contains("-d xroce-nope0: no such network interface here (interfaces: "));
    }
}
