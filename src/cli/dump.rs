//! `xroce dump FILE`: decode every RoCEv2 frame of a pcap/pcapng file and verify its ICRC.
//!
//! Default output is one line per RoCE frame and a summary; `--json` prints one JSON object
//! per RoCE frame on stdout (the summary goes to stderr); `--explain` draws every header of
//! each RoCE frame field by field. Frames that are not RoCEv2 (the tools' TCP exchange, ARP)
//! are counted, not reported as errors. Exit status 0 when the whole file was read.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use xroce::analysis::{CaptureSummary, Output};
use xroce::capture::CaptureReader;

/// Arguments of `xroce dump`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A pcap or pcapng capture (e.g. tests/fixtures/rxe_rc_pingpong.pcap): Ethernet, Linux
    /// cooked (`tcpdump -i any`: SLL, SLL2) or raw IP link types.
    pub file: PathBuf,
    /// One JSON object per RoCE frame on stdout (summary on stderr).
    #[arg(long, conflicts_with = "explain")]
    pub json: bool,
    /// Teach: draw every header of each RoCE frame with offsets, bytes and meaning.
    #[arg(long)]
    pub explain: bool,
}

/// Runs the command; returns the exit status.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let reader = CaptureReader::open(&args.file).context("cannot dump")?;
    let mut summary = CaptureSummary::default();
    let output = if args.json {
        Output::Json
    } else if args.explain {
        Output::Explain
    } else {
        Output::Line
    };
    let mut first_ts: Option<Duration> = None;
    let mut failure = None;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for item in reader {
        let frame = match item {
            Ok(f) => f,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let t0 = *first_ts.get_or_insert(frame.timestamp);
        let rel = frame.timestamp.saturating_sub(t0);
        let text = summary.frame(&frame, rel, output);
        if let Some(text) = text {
            if !write_or_stop(&mut out, &text)? {
                return Ok(0);
            }
        }
    }
    let report = summary.report();
    if args.json {
        eprint!("{report}");
    } else if !write_or_stop(&mut out, &report)? {
        return Ok(0);
    }
    if !write_or_stop(&mut out, "")? {
        return Ok(0);
    }
    match failure {
        Some(e) => Err(anyhow::Error::new(e)
            .context("capture is damaged; summary covers the frames before the damage")),
        None => Ok(0),
    }
}

/// Writes and flushes; `Ok(false)` when the reader went away (`xroce dump F | head`).
fn write_or_stop(out: &mut impl std::io::Write, text: &str) -> anyhow::Result<bool> {
    let result =
        out.write_all(text.as_bytes()).and_then(
            |()| {
                if text.is_empty() {
                    out.flush()
                } else {
                    Ok(())
                }
            },
        );
    match result {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}
