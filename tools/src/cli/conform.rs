//! `xroce conform`: the RoCE conformance suite against a target driven by its agent.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Parser;
use xroce_tools::conform::report::{self, html_report, summary_line, table_line};
use xroce_tools::conform::{catalogue, AgentClient, Expectations, Peer, Windows};

#[derive(Parser, Debug)]
#[command(after_help = "\
AGENT_ADDRESS is where the target agent listens: HOST:PORT (TCP) or unix:PATH.
Start it on the target host with pyverbs: python3 agent.py --device DEV --listen 0.0.0.0:PORT
(`xroce conform --print-agent > agent.py` writes it). Exit status: 0 when every case's verdict
is what the target's expectations say (every case conforms, without --target), 1 otherwise.")]
pub struct Args {
    /// The interface towards the target (default: the one the kernel routes it through).
    #[arg(short = 'd', long = "ib-dev", value_name = "IFACE")]
    pub iface: Option<String>,
    /// Expectations to hold the results against: rxe, xroce, or a file.
    #[arg(long)]
    pub target: Option<String>,
    /// Cases to run: comma-separated names or parts of names, * as a wildcard.
    #[arg(long, value_name = "PATTERN")]
    pub cases: Option<String>,
    /// One JSON object per case on stdout, then one with the summary.
    #[arg(long)]
    pub json: bool,
    /// Write the HTML report (tables and a ladder diagram per case) here.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Write each case's capture (CASE.pcap) and ladder diagram (CASE.svg) here.
    #[arg(long, value_name = "DIR")]
    pub captures: Option<PathBuf>,
    /// How long to wait for an answer that must come, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub answer_ms: u64,
    /// Silence that counts as "nothing was sent", in milliseconds.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    pub quiet_ms: u64,
    /// List the cases with their rules and exit.
    #[arg(long)]
    pub list: bool,
    /// Print the target agent (agent.py) and exit.
    #[arg(long)]
    pub print_agent: bool,
    /// The target agent's address.
    #[arg(required_unless_present_any = ["list", "print_agent"])]
    pub agent_address: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let all = catalogue();
    if args.print_agent {
        print!("{}", xroce_tools::conform::AGENT_PY);
        return Ok(0);
    }
    let cases: Vec<_> = all
        .into_iter()
        .filter(|c| report::selected(c.name, args.cases.as_deref()))
        .collect();
    if args.list {
        for c in &cases {
            println!("{:<30} {}\n{:<30} {}", c.name, c.summary, "", c.rule);
        }
        return Ok(0);
    }
    if cases.is_empty() {
        bail!(
            "--cases {:?} selects no case (xroce conform --list shows them)",
            args.cases.unwrap_or_default()
        );
    }
    let expectations = match &args.target {
        Some(t) => Expectations::load(t).map_err(anyhow::Error::msg)?,
        None => Expectations {
            name: "every case conforms".into(),
            ..Default::default()
        },
    };
    let unknown = expectations.unknown_cases(&catalogue());
    if !unknown.is_empty() {
        bail!(
            "expectations '{}' name cases the catalogue does not have: {}",
            expectations.name,
            unknown.join(", ")
        );
    }
    let address = args.agent_address.as_deref().unwrap_or_default();
    let timeout = Duration::from_secs(30);
    let mut agent = match address.strip_prefix("unix:") {
        Some(path) => AgentClient::unix(std::path::Path::new(path), timeout),
        None => AgentClient::tcp(address, timeout),
    }
    .with_context(|| format!("the target agent at {address}"))?;
    let hello = agent.hello().context("the agent's hello")?;
    let target_ip = hello
        .gid
        .parse::<std::net::Ipv6Addr>()
        .ok()
        .and_then(|g| g.to_ipv4_mapped())
        .with_context(|| {
            format!(
                "the target's GID {} (index {}) is not an IPv4 RoCEv2 GID; start the agent with --gid-index of one",
                hello.gid, hello.gid_index
            )
        })?;
    let mut peer = open_peer(target_ip, args.iface.as_deref())?;
    let peer_name = format!("peer {}", peer.local.ip);
    let target_name = format!("{} {}", hello.device, target_ip);
    if !args.json {
        println!(
            "xroce conform: {} case(s) against {} (agent {address}), peer on {}, expectations: {}",
            cases.len(),
            target_name,
            peer.driver_info(),
            expectations.name
        );
    }
    let windows = Windows {
        answer: Duration::from_millis(args.answer_ms),
        quiet: Duration::from_millis(args.quiet_ms),
    };
    if let Some(dir) = &args.captures {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let json = args.json;
    let results = report::run_cases(&mut peer, &mut agent, &cases, &expectations, windows, |r| {
        if json {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            println!("{}", table_line(r));
            for f in r.failures() {
                println!("      {f}");
            }
            if let Some(e) = &r.error {
                println!("      error: {e}");
            }
        }
    })?;
    let _ = agent.bye();
    if let Some(dir) = &args.captures {
        for r in &results {
            report::write_pcap(&dir.join(format!("{}.pcap", r.name)), &r.frames)
                .with_context(|| format!("writing {}'s capture", r.name))?;
            std::fs::write(
                dir.join(format!("{}.svg", r.name)),
                r.ladder(&peer_name, &target_name).to_svg(&r.name),
            )?;
        }
    }
    if let Some(path) = &args.html {
        let title = format!("xroce conform: {target_name} ({})", expectations.name);
        std::fs::write(
            path,
            html_report(&title, &results, &expectations, &peer_name, &target_name),
        )
        .with_context(|| format!("writing {}", path.display()))?;
    }
    let summary = summary_line(&results, &expectations);
    let changed: Vec<&str> = results
        .iter()
        .filter(|r| !r.as_expected)
        .map(|r| r.name.as_str())
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({ "summary": summary, "target": target_name,
                "expectations": expectations.name, "differ": changed })
        );
    } else {
        println!("{summary}");
        if !changed.is_empty() {
            println!("differ from the expectations: {}", changed.join(", "));
        }
    }
    Ok(if changed.is_empty() { 0 } else { 1 })
}

#[cfg(feature = "xdp")]
fn open_peer(target: std::net::Ipv4Addr, iface: Option<&str>) -> anyhow::Result<Peer> {
    let peer = Peer::open_xdp(target, Duration::from_secs(3))
        .with_context(|| format!("the scripted peer towards {target}"))?;
    if let Some(want) = iface {
        let info = peer.driver_info();
        if !info.starts_with(&format!("{want} ")) {
            bail!("{target} is reached through {info}, not -d {want}");
        }
    }
    Ok(peer)
}

#[cfg(not(feature = "xdp"))]
fn open_peer(_target: std::net::Ipv4Addr, _iface: Option<&str>) -> anyhow::Result<Peer> {
    bail!("this xroce was built without the xdp feature: the scripted peer needs AF_XDP")
}
