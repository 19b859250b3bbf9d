//! `xroce file send|recv`: move a file with RDMA WRITE + WRITE_WITH_IMM and check its
//! SHA-256 at the other end; a progress bar while it runs, the throughput at the end.
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use xroce::tools::file::{self, FileOptions};
use xroce::tools::options;
use xroce::tools::setup;
use xroce::tools::verbs_endpoint::{self, DriverChoice, EndpointSpec};

const EXAMPLES: &str = "\
Examples:
  # receiver first (writes into the current directory under the sender's file name):
  xroce file recv -d veth0
  # sender:
  xroce file send -d veth1 198.18.0.1 ./disk.img
  # choose the output path and the chunking:
  xroce file recv -d veth0 -o /tmp/copy.img --chunk 4194304 --slots 4";

/// `send` or `recv`.
#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Send a file to a waiting receiver.
    #[command(after_help = EXAMPLES)]
    Send {
        /// The receiver's address.
        host: String,
        /// File to send.
        path: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Wait for a sender and receive one file.
    #[command(after_help = EXAMPLES)]
    Recv {
        /// Where to write (default: the sender's file name in the current directory).
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// Overwrite an existing file.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
}

/// Options both sides take.
#[derive(clap::Args, Debug)]
pub struct Common {
    /// Network interface.
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// GID index (default: the first IPv4 GID).
    #[arg(short = 'g', long = "gid-idx")]
    pub gid_idx: Option<u32>,
    /// TCP port for the set-up exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18516)]
    pub port: u16,
    /// Bytes per chunk (receiver decides).
    #[arg(long, default_value_t = 1 << 20)]
    pub chunk: usize,
    /// Chunks in flight (receiver decides).
    #[arg(long, default_value_t = 8)]
    pub slots: usize,
    /// Path MTU (default: the largest the link carries).
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Frame driver.
    #[arg(long = "driver", value_enum, default_value_t = DriverChoice::Xdp)]
    pub driver: DriverChoice,
    /// Write every frame this endpoint sends and receives to FILE (pcap, Ethernet link
    /// type): over AF_XDP, tcpdump on the interface sees no RoCE frames.
    #[arg(long = "pcap", value_name = "FILE")]
    pub pcap: Option<std::path::PathBuf>,
}

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

fn bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let common = match &args.action {
        Action::Send { common, .. } | Action::Recv { common, .. } => common,
    };
    // Option checks first, before any interface is looked at.
    FileOptions {
        chunk_size: common.chunk,
        slots: common.slots,
        ..FileOptions::default()
    }
    .validate()?;
    options::tcp_port("-p/--port", common.port)?;
    let dev = setup::pick_device(common.ib_dev.as_deref())?;
    let gid = setup::pick_gid(&dev, common.gid_idx, "-g")?;
    let opts = FileOptions {
        chunk_size: common.chunk,
        slots: common.slots,
        mtu: setup::pick_mtu(&dev, common.mtu)?,
        stall_timeout: Duration::from_secs(30),
    };
    opts.validate()?;
    match args.action {
        Action::Send { host, path, common } => {
            let meta = std::fs::metadata(&path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            if !meta.is_file() {
                anyhow::bail!("{} is not a regular file", path.display());
            }
            let mut reader = std::io::BufReader::new(std::fs::File::open(&path)?);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "file".into());
            let spec = EndpointSpec {
                rc: true,
                buf_len: opts.sender_buffer_len(),
                max_send_wr: 2 * opts.slots as u32 + 2,
                max_recv_wr: opts.slots as u32 + 1,
                driver: common.driver,
                events: false,
                pcap: common.pcap.clone(),
            };
            let mut eps = verbs_endpoint::open(&dev, &gid, &spec, 1)?;
            let mut stream = setup::connect(&host, common.port, Duration::from_secs(10))?;
            let progress = bar(meta.len());
            let outcome = file::send(
                eps[0].as_mut(),
                &mut stream,
                &mut reader,
                &name,
                meta.len(),
                &opts,
                setup::random_psn(),
                &mut |n| progress.set_position(n),
            )?;
            progress.finish_and_clear();
            println!(
                "sent {} ({} bytes) in {:.2} s = {:.1} MB/s, sha256 {}",
                outcome.name,
                outcome.bytes,
                outcome.elapsed.as_secs_f64(),
                outcome.megabytes_per_sec(),
                outcome.sha256
            );
            if !outcome.verified {
                eprintln!("xroce: error: the receiver's SHA-256 differs: the copy is corrupt");
                return Ok(2);
            }
            println!("receiver verified SHA-256: OK");
            Ok(0)
        }
        Action::Recv {
            output,
            force,
            common,
        } => {
            let spec = EndpointSpec {
                rc: true,
                buf_len: opts.receiver_buffer_len(),
                max_send_wr: opts.slots as u32 + 1,
                max_recv_wr: opts.slots as u32 + 1,
                driver: common.driver,
                events: false,
                pcap: common.pcap.clone(),
            };
            let mut eps = verbs_endpoint::open(&dev, &gid, &spec, 1)?;
            let mut stream = setup::accept_one(common.port)?;
            // Write to a temporary name first; rename once the SHA-256 matches.
            let dir_default = std::env::current_dir()?;
            let tmp = match &output {
                Some(p) => p.with_extension("xroce-partial"),
                None => dir_default.join(".xroce-incoming.partial"),
            };
            let mut writer = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            let progress = bar(0);
            let result = file::recv(
                eps[0].as_mut(),
                &mut stream,
                &mut writer,
                &opts,
                setup::random_psn(),
                &mut |done, total| {
                    progress.set_length(total);
                    progress.set_position(done);
                },
            );
            drop(writer);
            progress.finish_and_clear();
            let outcome = match result {
                Ok(o) => o,
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            };
            // Only the base name of what the sender proposed, never a path.
            let safe_name = std::path::Path::new(&outcome.name)
                .file_name()
                .map(|n| n.to_owned())
                .unwrap_or_else(|| "received.bin".into());
            let dest = output.unwrap_or_else(|| dir_default.join(safe_name));
            if !outcome.verified {
                let _ = std::fs::remove_file(&tmp);
                eprintln!("xroce: error: SHA-256 mismatch: the received data is corrupt; nothing was written");
                return Ok(2);
            }
            if dest.exists() && !force {
                let _ = std::fs::remove_file(&tmp);
                anyhow::bail!(
                    "{} exists: pass --force to overwrite or -o to choose another path",
                    dest.display()
                );
            }
            std::fs::rename(&tmp, &dest)?;
            println!(
                "received {} ({} bytes) in {:.2} s = {:.1} MB/s, sha256 {} verified",
                dest.display(),
                outcome.bytes,
                outcome.elapsed.as_secs_f64(),
                outcome.megabytes_per_sec(),
                outcome.sha256
            );
            Ok(0)
        }
    }
}
