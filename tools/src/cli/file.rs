//! `xroce file send|recv`: move a file with RDMA WRITE + WRITE_WITH_IMM and check its
//! SHA-256 at the other end; a progress bar while it runs, the throughput at the end.
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use signal_hook::consts::{SIGINT, SIGTERM};
use xroce_tools::endpoint::verbs::{self as verbs_endpoint, EndpointSpec};
use xroce_tools::file::{self, FileOptions, FileSink};
use xroce_tools::options;
use xroce_tools::setup;

const EXAMPLES: &str = "\
Examples:
  # receiver first (writes into the current directory under the sender's file name):
  xroce file recv -d veth0
  # sender:
  xroce file send -d veth1 198.18.0.1 ./disk.img
  # choose the output path (a file, or a directory to receive into) and the chunking:
  xroce file recv -d veth0 -o /tmp/copy.img --chunk 4194304 --slots 4
  xroce file recv -d veth0 -o /srv/incoming/";

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
        /// Where to write: a file, or a directory to put the sender's file name in
        /// (default: the sender's file name in the current directory).
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
    #[command(flatten)]
    pub peer: super::peer::PeerArgs,
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

/// On SIGINT or SIGTERM, removes the receiver's temporary file and exits 128 + the signal
/// (130, 143), as a shell reports a process the signal ended. signal-hook delivers the
/// signal to this thread, outside the signal handler, where file I/O is allowed.
fn remove_on_signal(temp: &Path) -> anyhow::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| anyhow::anyhow!("installing the SIGINT/SIGTERM handler: {e}"))?;
    let temp = temp.to_path_buf();
    std::thread::Builder::new()
        .name("xroce-file-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                // After a commit the temporary file is the final one's old name: gone.
                if std::fs::remove_file(&temp).is_ok() {
                    eprintln!(
                        "xroce: interrupted; removed the partial file {}",
                        temp.display()
                    );
                }
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
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
    // The receiver's destination is checked (and its temporary file made) before any device
    // or socket, so a bad -o is reported at once, naming the path, not after a sender connects.
    let mut sink = match &args.action {
        Action::Recv { output, force, .. } => {
            let sink = FileSink::create(output.as_deref(), *force)?;
            remove_on_signal(sink.temp_path())?;
            Some(sink)
        }
        Action::Send { .. } => None,
    };
    let (dev, gid) = common.peer.device_and_gid()?;
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
                qp_type: xroce::engine::QpType::Rc,
                buf_len: opts.sender_buffer_len(),
                max_send_wr: 2 * opts.slots as u32 + 2,
                max_recv_wr: opts.slots as u32 + 1,
                driver: common.peer.driver,
                events: false,
                pcap: common.peer.pcap.clone(),
                progress: Default::default(),
                shards: 1,
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
            );
            progress.finish_and_clear();
            let outcome = outcome?;
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
            println!("receiver verified SHA-256: OK (the file is on the receiver's disk)");
            Ok(0)
        }
        Action::Recv { common, .. } => {
            let Some(sink) = sink.as_mut() else {
                anyhow::bail!("internal: the receiver has no destination");
            };
            let spec = EndpointSpec {
                qp_type: xroce::engine::QpType::Rc,
                buf_len: opts.receiver_buffer_len(),
                max_send_wr: opts.slots as u32 + 2,
                max_recv_wr: opts.slots as u32 + 1,
                driver: common.peer.driver,
                events: false,
                pcap: common.peer.pcap.clone(),
                progress: Default::default(),
                shards: 1,
            };
            let mut eps = verbs_endpoint::open(&dev, &gid, &spec, 1)?;
            let mut stream = setup::accept_one(common.port)?;
            let progress = bar(0);
            let result = file::recv(
                eps[0].as_mut(),
                &mut stream,
                sink,
                &opts,
                setup::random_psn(),
                &mut |done, total| {
                    progress.set_length(total);
                    progress.set_position(done);
                },
            );
            progress.finish_and_clear();
            // On any error the sink is dropped with the temporary file.
            let outcome = result?;
            if !outcome.verified {
                eprintln!("xroce: error: SHA-256 mismatch: the received data is corrupt; nothing was written");
                return Ok(2);
            }
            let dest = sink
                .destination()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            println!(
                "received {dest} ({} bytes) in {:.2} s = {:.1} MB/s, sha256 {} verified",
                outcome.bytes,
                outcome.elapsed.as_secs_f64(),
                outcome.megabytes_per_sec(),
                outcome.sha256
            );
            Ok(0)
        }
    }
}
