//! `xroce dump FILE`: decode every RoCEv2 frame of a pcap/pcapng file and verify its ICRC.
//!
//! Default output is one line per RoCE frame and a summary; `--json` prints one JSON object
//! per RoCE frame on stdout (the summary goes to stderr); `--explain` draws every header of
//! each RoCE frame field by field. Frames that are not RoCEv2 (the tools' TCP exchange, ARP)
//! are counted, not reported as errors. Exit status 0 when the whole file was read.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use xroce::capture::CaptureReader;
use xroce_tools::analysis::{CaptureSummary, Output};

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
    /// Also draw a ladder diagram into this SVG file: the endpoints as columns, each RoCE
    /// frame an arrow with its opcode, PSN and AETH (NAKs, resends and bad ICRCs stand out).
    #[arg(long, value_name = "FILE.svg")]
    pub ladder: Option<PathBuf>,
    /// The most frames the ladder draws (the rest are counted in a note).
    #[arg(long, default_value_t = 2000, requires = "ladder",
          value_parser = clap::value_parser!(u32).range(1..=200_000))]
    pub ladder_max: u32,
}

/// Runs the command; returns the exit status.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let reader = CaptureReader::open(&args.file).context("cannot dump")?;
    let mut summary = CaptureSummary::default();
    if args.ladder.is_some() {
        summary = summary.with_ladder(args.ladder_max as usize);
    }
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
    if let (Some(path), Some(ladder)) = (&args.ladder, summary.ladder()) {
        let title = format!("xroce dump --ladder {}", args.file.display());
        std::fs::write(path, ladder.to_svg(&title))
            .with_context(|| format!("cannot write the ladder to {}", path.display()))?;
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
