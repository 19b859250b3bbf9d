//! The engines people scale with, unmodified, on xroce's `libibverbs.so.1` and
//! `librdmacm.so.1`, between two network namespaces joined by a veth pair, over AF_XDP, at MTU
//! 1500 and at MTU 9000 (issue 28; docs/engines.md):
//!
//! - UCX (Debian's ucx-utils 1.13): `ucx_info -d` lists xroce's device with `rc_verbs` and
//!   `ud_verbs`; `ucx_perftest` `tag_lat`, `tag_bw`, `ucp_put_bw` over
//!   `UCX_TLS=rc_verbs,ud_verbs` and over `ud_verbs` alone.
//! - libfabric (libfabric-bin 1.17): `fi_pingpong -e rdm` over `verbs;ofi_rxm` and
//!   `verbs;ofi_rxd`, and `-e dgram` over `verbs`, every message checked (`-c`).
//! - MPI: the project's own `tests/engines/mpi_check.c` (8-byte ping-pong, 1 MiB both ways
//!   checked byte for byte, a bandwidth run, a ring, two allreduces, a barrier), built here with
//!   Open MPI's and MPICH's `mpicc`, with 2 ranks (one per namespace) and 4 (two per namespace,
//!   through `xroce relay` in each): Open MPI 4.1 over `--mca pml ucx`, over `--mca pml cm --mca
//!   mtl ofi` with `FI_PROVIDER` `verbs;ofi_rxm` and `verbs;ofi_rxd`, and MPICH 4.0 (Debian
//!   builds it `ch4:ucx`); and Open MPI over TCP alone (`--mca btl tcp,self --mca pml ob1`,
//!   without xroce) as the baseline.
//!
//! The launchers start the ranks of the namespace they run in themselves; for the other
//! namespace they call `tests/engines/netns-rsh` as their `ssh`, which runs the command there
//! with `ip netns exec` under `xroce run -d <veth>`. `mpirun`/`mpiexec.hydra` itself runs in
//! namespace A under `xroce run`. Every MPI case also checks that the data crossed the veth
//! (its byte counters), so a job that found a shared-memory path between the namespaces (UCX
//! sees one machine: the same boot id) cannot pass unnoticed: UCX is restricted to
//! `self,rc_verbs,ud_verbs` and Open MPI to `--mca btl self`.
//!
//! The two MTUs run side by side, each on its own veth pair, its cases one after another
//! (`XROCE_ENGINES_SERIAL=1` runs the MTUs one after the other, for quieter numbers). Each case
//! has a deadline (a hang fails it, and every process left in the namespaces is killed); the
//! test reports every failing case, and prints a table of the numbers measured, before it
//! fails. Needs root and the Debian packages of scripts/setup.sh; under `XROCE_CI=1` a
//! missing privilege or program fails, elsewhere it skips visibly.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{veth_pair, xroce_bin};
use xroce::netns::{Netns, VethLink};

/// Programs every case needs, with the Debian package that has them.
const PROGRAMS: [(&str, &str); 9] = [
    ("ucx_info", "ucx-utils"),
    ("ucx_perftest", "ucx-utils"),
    ("fi_pingpong", "libfabric-bin"),
    ("mpirun.openmpi", "openmpi-bin"),
    ("mpicc.openmpi", "libopenmpi-dev"),
    ("mpiexec.hydra", "mpich"),
    ("mpicc.mpich", "libmpich-dev"),
    ("ss", "iproute2"),
    ("gcc", "gcc"),
];

/// UCX's transports for the MPI cases: the verbs ones and `self`, never shared memory or TCP
/// (both namespaces are one machine to UCX; its shared-memory transports would reach across).
const UCX_MPI_TLS: &str = "self,rc_verbs,ud_verbs";

/// `mpi_check`'s arguments: 500 ping-pongs, 10 windows of 4 x 1 MiB.
const MPI_ARGS: [&str; 6] = ["-l", "500", "-b", "10", "-w", "4"];

/// Bytes that must at least cross the veth from A during an MPI case: the 1 MiB message and
/// the bandwidth run (11 windows of 4 MiB, the first a warm-up).
const MPI_MIN_BYTES: u64 = 45 * 1024 * 1024;

fn ready(test: &str) -> bool {
    common::programs_ready(test, &PROGRAMS)
}

fn engines_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("tests/engines")
}

/// A scratch directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(xroce::netns::unique_name(&format!("xroce-{tag}-")));
        std::fs::create_dir_all(&dir).expect("make a scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `mpi_check.c` built with Open MPI's and with MPICH's `mpicc`.
struct Programs {
    ompi: PathBuf,
    mpich: PathBuf,
    rsh: PathBuf,
}

fn build_programs(dir: &Path) -> Result<Programs, String> {
    let src = engines_dir().join("mpi_check.c");
    let mut built = Vec::new();
    for (cc, name) in [
        ("mpicc.openmpi", "mpi_check_ompi"),
        ("mpicc.mpich", "mpi_check_mpich"),
    ] {
        let out_path = dir.join(name);
        let out = Command::new(cc)
            .args(["-O2", "-Wall", "-o"])
            .arg(&out_path)
            .arg(&src)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run {cc}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cc} {}: {}",
                src.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        built.push(out_path);
    }
    let mpich = built.pop().expect("two programs");
    let ompi = built.pop().expect("two programs");
    Ok(Programs {
        ompi,
        mpich,
        rsh: engines_dir().join("netns-rsh"),
    })
}

/// One MTU's veth pair and what its cases share.
struct Lane<'a> {
    link: VethLink,
    mtu: u32,
    scratch: Scratch,
    programs: &'a Programs,
    cases_run: std::cell::Cell<u32>,
}

/// What a finished (or stopped) command printed.
struct Ran {
    ok: bool,
    stopped: bool,
    status: String,
    out: String,
}

impl Ran {
    fn describe(&self, what: &str) -> String {
        let how = if self.stopped {
            "stopped at its deadline".to_string()
        } else {
            self.status.clone()
        };
        format!("--- {what}: {how}\n{}", tail(&self.out, 60))
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(n);
    let mut s = String::new();
    if from > 0 {
        s.push_str(&format!("[... {from} lines before]\n"));
    }
    s.push_str(&lines[from..].join("\n"));
    s
}

/// A child whose output goes to a file (a pipe could be held open by a grandchild, such as an
/// orted that outlives its mpirun, and hang the reader).
struct Running {
    child: std::process::Child,
    log: PathBuf,
}

impl<'a> Lane<'a> {
    fn new(net: u8, mtu: u32, programs: &'a Programs) -> Lane<'a> {
        Lane {
            link: veth_pair(net, mtu),
            mtu,
            scratch: Scratch::new(&format!("engines{mtu}")),
            programs,
            cases_run: std::cell::Cell::new(0),
        }
    }

    fn a_ip(&self) -> String {
        self.link.a_ip.to_string()
    }

    fn dev(&self, side_a: bool) -> String {
        format!(
            "xroce_{}",
            if side_a {
                &self.link.a_if
            } else {
                &self.link.b_if
            }
        )
    }

    /// `program` in namespace A (`side_a`) or B, under `xroce run -d <veth>` unless `plain`.
    fn command(&self, side_a: bool, plain: bool, program: &[&str]) -> Command {
        self.command_with(
            side_a,
            if plain { Run::Plain } else { Run::OnDevice },
            program,
        )
    }

    fn command_with(&self, side_a: bool, how: Run, program: &[&str]) -> Command {
        let (ns, ifname) = if side_a {
            (&self.link.a, &self.link.a_if)
        } else {
            (&self.link.b, &self.link.b_if)
        };
        let mut cmd = match how {
            Run::Plain => {
                let mut c = ns.command(program[0]);
                c.args(&program[1..]);
                c
            }
            Run::OnDevice => {
                let mut c = ns.command(xroce_bin());
                c.args(["run", "-d", ifname, "--"]).args(program);
                c
            }
            Run::AsUserRuns => {
                let mut c = ns.command(xroce_bin());
                c.args(["run", "--"]).args(program);
                c
            }
        };
        for var in [
            "XROCE_LIB_DIR",
            "XROCE_NETDEV",
            "XROCE_DRIVER",
            "XROCE_PROGRESS",
            "XROCE_PCAP",
            "XROCE_LOG",
            "UCX_TLS",
            "UCX_NET_DEVICES",
            "FI_PROVIDER",
        ] {
            cmd.env_remove(var);
        }
        cmd.stdin(Stdio::null());
        cmd
    }

    fn spawn(&self, mut cmd: Command, what: &str) -> Running {
        let n = self.cases_run.get() + 1;
        self.cases_run.set(n);
        let log = self.scratch.0.join(format!("out-{n}.log"));
        let file = File::create(&log).expect("create a log file");
        cmd.stdout(file.try_clone().expect("dup the log file"))
            .stderr(file);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Running { child, log }
    }

    /// Waits for `r` until `deadline`; past it, SIGTERM (which `xroce run` and mpirun pass
    /// on), then SIGKILL.
    fn finish(&self, mut r: Running, deadline: Instant) -> Ran {
        let mut stopped = false;
        let status = loop {
            match r.child.try_wait().expect("try_wait") {
                Some(st) => break st,
                None if Instant::now() > deadline => {
                    stopped = true;
                    common::child::stop(&mut r.child);
                    break r.child.wait().expect("wait");
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let out = std::fs::read(&r.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Ran {
            ok: status.success() && !stopped,
            stopped,
            status: status.to_string(),
            out,
        }
    }

    fn run(&self, cmd: Command, what: &str, secs: u64) -> Ran {
        let r = self.spawn(cmd, what);
        self.finish(r, Instant::now() + Duration::from_secs(secs))
    }

    /// Kills every process still in the lane's namespaces (all of them started by this test).
    fn sweep(&self) {
        for ns in [&self.link.a, &self.link.b] {
            let Ok(out) = xroce::netns::ip(&["netns", "pids", ns.name()]) else {
                continue;
            };
            for pid in String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
        // Let the kernel free the AF_XDP sockets before the next case attaches.
        std::thread::sleep(Duration::from_millis(200));
    }

    /// Waits until something listens on TCP `port` in `ns`.
    fn wait_listen(ns: &Netns, port: u16, deadline: Instant) -> bool {
        while Instant::now() < deadline {
            let listening = ns
                .command("ss")
                .args(["-Hltn", &format!("sport = :{port}")])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("LISTEN"));
            if listening {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Bytes the veth of A has sent so far.
    fn a_tx_bytes(&self) -> u64 {
        self.link
            .a
            .command("cat")
            .arg(format!(
                "/sys/class/net/{}/statistics/tx_bytes",
                self.link.a_if
            ))
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(0)
    }

    /// `xroce relay -d <veth>` in both namespaces, for several processes per interface.
    fn relays(&self) -> Result<Relays, String> {
        let mut relays = Relays(Vec::new());
        for (ns, ifname) in [
            (&self.link.a, &self.link.a_if),
            (&self.link.b, &self.link.b_if),
        ] {
            let mut cmd = ns.command(xroce_bin());
            cmd.args(["relay", "-d", ifname]).stdin(Stdio::null());
            let r = self.spawn(cmd, "xroce relay");
            let deadline = Instant::now() + Duration::from_secs(10);
            let log = r.log.clone();
            relays.0.push(r);
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains("serving @") {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(format!("xroce relay -d {ifname} did not start:\n{text}"));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(relays)
    }
}

/// Relays that stop when dropped.
struct Relays(Vec<Running>);

impl Drop for Relays {
    fn drop(&mut self) {
        for r in &mut self.0 {
            common::child::stop(&mut r.child);
            let _ = r.child.wait();
        }
    }
}

/// A case's outcome: `Ok(numbers)` or `Err(why)`.
type Outcome = Result<String, String>;

/// The numbers of a `ucx_perftest` `Final:` row: iterations, latency (50th percentile,
/// average, overall, in us), bandwidth (average, overall, MB/s), message rate (average,
/// overall).
fn perftest_final(text: &str) -> Option<Vec<f64>> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Final:"))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums.len() >= 8).then_some(nums)
}

/// `ucx_info -d` in A lists the xroce device with `rc_verbs` and `ud_verbs`.
fn ucx_info(lane: &Lane) -> Outcome {
    let ran = lane.run(
        lane.command(true, false, &["ucx_info", "-d"]),
        "ucx_info -d",
        60,
    );
    if !ran.ok {
        return Err(ran.describe("ucx_info -d"));
    }
    let dev = lane.dev(true);
    // The memory domain's section runs until the next one.
    let section = ran
        .out
        .split("# Memory domain: ")
        .find(|s| s.starts_with(&format!("{dev}\n")))
        .ok_or_else(|| format!("no memory domain {dev}:\n{}", tail(&ran.out, 80)))?;
    let mut missing = Vec::new();
    for tl in ["rc_verbs", "ud_verbs"] {
        let found = section
            .split("#      Transport: ")
            .any(|t| t.starts_with(&format!("{tl}\n")) && t.contains(&format!("Device: {dev}:1")));
        if !found {
            missing.push(tl);
        }
    }
    if !missing.is_empty() {
        return Err(format!("{dev} has no {missing:?}:\n{section}"));
    }
    Ok(format!("{dev}: rc_verbs, ud_verbs"))
}

/// `ucx_perftest` server in A, client in B.
fn ucx_perftest(lane: &Lane, tls: &str, test: &str, size: &str, iters: &str) -> Outcome {
    let port = "13337";
    let deadline = Instant::now() + Duration::from_secs(90);
    let with_env = |mut cmd: Command, side_a: bool| {
        cmd.env("UCX_TLS", tls)
            .env("UCX_NET_DEVICES", format!("{}:1", lane.dev(side_a)));
        cmd
    };
    let server = lane.spawn(
        with_env(
            lane.command(true, false, &["ucx_perftest", "-p", port]),
            true,
        ),
        "ucx_perftest server",
    );
    if !Lane::wait_listen(&lane.link.a, 13337, deadline) {
        let s = lane.finish(server, Instant::now());
        return Err(s.describe("server (never listened)"));
    }
    let a = lane.a_ip();
    let client = lane.spawn(
        with_env(
            lane.command(
                false,
                false,
                &[
                    "ucx_perftest",
                    &a,
                    "-p",
                    port,
                    "-t",
                    test,
                    "-s",
                    size,
                    "-n",
                    iters,
                ],
            ),
            false,
        ),
        "ucx_perftest client",
    );
    let c = lane.finish(client, deadline);
    let s = lane.finish(server, deadline + Duration::from_secs(5));
    let fin = perftest_final(&c.out);
    match (c.ok && s.ok, fin) {
        (true, Some(n)) => Ok(if test.ends_with("_lat") {
            format!("{size} B: {:.2} us typical, {:.2} us average", n[1], n[3])
        } else {
            format!("{size} B: {:.1} MB/s", n[5])
        }),
        _ => Err(format!(
            "{}\n{}",
            c.describe("client (needs a Final: row)"),
            s.describe("server")
        )),
    }
}

/// `fi_pingpong` server in A, client in B; both must print the `=ITERS` row of `size`.
fn fi_pingpong(lane: &Lane, prov: &str, ep: &str, size: &str, row: &str) -> Outcome {
    let deadline = Instant::now() + Duration::from_secs(90);
    let opts = ["-p", prov, "-e", ep, "-I", "100", "-S", size, "-c"];
    let mut server_args = vec!["fi_pingpong"];
    server_args.extend(opts);
    let server = lane.spawn(
        lane.command(true, false, &server_args),
        "fi_pingpong server",
    );
    if !Lane::wait_listen(&lane.link.a, 47592, deadline) {
        let s = lane.finish(server, Instant::now());
        return Err(s.describe("server (never listened)"));
    }
    let a = lane.a_ip();
    let mut client_args = server_args.clone();
    client_args.push(&a);
    let client = lane.spawn(
        lane.command(false, false, &client_args),
        "fi_pingpong client",
    );
    let c = lane.finish(client, deadline);
    let s = lane.finish(server, deadline + Duration::from_secs(5));
    let has_row = |t: &str| {
        t.lines()
            .find(|l| l.starts_with(&format!("{row} ")) && l.contains("=100"))
            .map(str::to_string)
    };
    match (c.ok && s.ok, has_row(&c.out), has_row(&s.out)) {
        (true, Some(line), Some(_)) => {
            // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
            let w: Vec<&str> = line.split_whitespace().collect();
            Ok(format!(
                "{row}: {} us/xfer, {} MB/s",
                w.get(6).unwrap_or(&"?"),
                w.get(5).unwrap_or(&"?")
            ))
        }
        _ => Err(format!(
            "{}\n{}",
            c.describe(&format!("client (needs a `{row} 100 =100` row)")),
            s.describe("server")
        )),
    }
}

/// How a program is started in its namespace.
#[derive(Clone, Copy)]
enum Run {
    /// Without xroce.
    Plain,
    /// `xroce run -d <the namespace's veth> --`.
    OnDevice,
    /// `xroce run --`, as the one documented step: every Ethernet interface that is up.
    AsUserRuns,
}

/// How an MPI case runs.
#[derive(Clone, Copy)]
enum Mpi {
    /// Open MPI as a user runs it on xroce: `xroce run -- mpirun` and no MCA setting that
    /// names a PML or a device: `xroce run` makes Open MPI take UCX on xroce's device and start
    /// the other host's `orted` under `xroce run` (netns-rsh adds nothing: plain `ip netns
    /// exec`).
    OmpiAsUserRuns,
    /// MPICH as a user runs it on xroce: `xroce run -- mpiexec.hydra`, whose ranks on the other
    /// host get `mpiexec`'s environment (xroce's `LD_LIBRARY_PATH` among it) from hydra
    /// itself (netns-rsh adds nothing: plain `ip netns exec`).
    MpichAsUserRuns,
    /// Open MPI, `--mca pml ucx`.
    OmpiUcx,
    /// Open MPI, `--mca pml cm --mca mtl ofi`, `FI_PROVIDER` as given.
    OmpiOfi(&'static str),
    /// MPICH (ch4:ucx) through hydra.
    Mpich,
    /// Open MPI over TCP, no xroce: the baseline.
    OmpiTcp,
}

/// `mpi_check` with `ranks` ranks, `ranks / 2` in each namespace (rank 0 in A, rank 1 in B).
fn mpi_case(lane: &Lane, engine: Mpi, ranks: u32) -> Outcome {
    let a = lane.a_ip();
    let b = lane.link.b_ip.to_string();
    let n = ranks.to_string();
    let plain = matches!(engine, Mpi::OmpiTcp);
    // netns-rsh plays ssh only: the launch agent xroce run set brings xroce to the ranks.
    let rsh_plain = plain || matches!(engine, Mpi::OmpiAsUserRuns | Mpi::MpichAsUserRuns);
    let hostfile = lane.scratch.0.join("hosts");
    let per_host = ranks / 2;
    std::fs::write(
        &hostfile,
        format!("{a} slots={per_host}\n{b} slots={per_host}\n"),
    )
    .expect("write the host file");
    let hostfile = hostfile.to_string_lossy().into_owned();
    let rsh = lane.programs.rsh.to_string_lossy().into_owned();
    let ompi = lane.programs.ompi.to_string_lossy().into_owned();
    let mpich = lane.programs.mpich.to_string_lossy().into_owned();
    let mut argv: Vec<String> = Vec::new();
    let push =
        |argv: &mut Vec<String>, words: &[&str]| argv.extend(words.iter().map(|w| w.to_string()));
    match engine {
        Mpi::Mpich | Mpi::MpichAsUserRuns => {
            push(&mut argv, &["mpiexec.hydra"]);
            if matches!(engine, Mpi::Mpich) {
                // hydra would hand every rank mpiexec's environment, A's xroce settings
                // included; each rank keeps its own proxy's (netns-rsh's xroce run).
                push(&mut argv, &["-genvnone"]);
            }
            // Only what keeps UCX off the namespaces' shared memory, and the ssh stand-in.
            push(
                &mut argv,
                &[
                    "-genv",
                    "UCX_TLS",
                    UCX_MPI_TLS,
                    "-launcher",
                    "ssh",
                    "-launcher-exec",
                    &rsh,
                    "-hosts",
                    &format!("{a},{b}"),
                    "-n",
                    &n,
                    &mpich,
                ],
            );
        }
        _ => {
            // --bind-to none: both "hosts" are this machine's cores; Open MPI would bind
            // each host's first rank to core 0, both on one core, spinning in turn.
            push(
                &mut argv,
                &[
                    "mpirun.openmpi",
                    "--hostfile",
                    &hostfile,
                    "-np",
                    &n,
                    "--map-by",
                    "node",
                    "--bind-to",
                    "none",
                    "--mca",
                    "plm_rsh_agent",
                    &rsh,
                ],
            );
            match engine {
                Mpi::OmpiUcx => push(
                    &mut argv,
                    &[
                        "--mca",
                        "pml",
                        "ucx",
                        "--mca",
                        "btl",
                        "self",
                        "-x",
                        &format!("UCX_TLS={UCX_MPI_TLS}"),
                    ],
                ),
                // Only what keeps UCX off the shared memory the two namespaces share (one
                // machine to UCX); nothing that names xroce, a device or a PML.
                Mpi::OmpiAsUserRuns => push(
                    &mut argv,
                    &[
                        "--mca",
                        "btl",
                        "self",
                        "-x",
                        &format!("UCX_TLS={UCX_MPI_TLS}"),
                    ],
                ),
                Mpi::OmpiOfi(prov) => push(
                    &mut argv,
                    &[
                        "--mca",
                        "pml",
                        "cm",
                        "--mca",
                        "mtl",
                        "ofi",
                        "--mca",
                        "btl",
                        "self",
                        "-x",
                        &format!("FI_PROVIDER={prov}"),
                    ],
                ),
                _ => push(
                    &mut argv,
                    &["--mca", "pml", "ob1", "--mca", "btl", "tcp,self"],
                ),
            }
            argv.push(ompi);
        }
    }
    // benches/engines.sh asks for longer runs (more ping-pongs and windows) this way.
    let bench_args = std::env::var("XROCE_ENGINES_MPI_ARGS").ok();
    match &bench_args {
        Some(words) => argv.extend(words.split_whitespace().map(str::to_string)),
        None => push(&mut argv, &MPI_ARGS),
    }
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    let how = match engine {
        Mpi::OmpiTcp => Run::Plain,
        Mpi::OmpiAsUserRuns | Mpi::MpichAsUserRuns => Run::AsUserRuns,
        _ => Run::OnDevice,
    };
    let mut cmd = lane.command_with(true, how, &words);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("XROCE_BIN", xroce_bin())
        .env(
            "XROCE_RSH_HOSTS",
            format!(
                "{a}={}:{} {b}={}:{}",
                lane.link.a.name(),
                lane.link.a_if,
                lane.link.b.name(),
                lane.link.b_if
            ),
        )
        .env("XROCE_RSH_PLAIN", if rsh_plain { "1" } else { "0" })
        .env_remove("XROCE_RSH_RUN_OPTS")
        .env_remove("XROCE_RSH_LOG");
    let _relays = if ranks > 2 && !plain {
        Some(lane.relays()?)
    } else {
        None
    };
    let before = lane.a_tx_bytes();
    let ran = lane.run(cmd, "mpi_check", 120);
    let sent = lane.a_tx_bytes().saturating_sub(before);
    let want = format!("mpi_check ok ranks={ranks} ");
    let Some(line) = ran.out.lines().find(|l| l.starts_with(&want)) else {
        return Err(ran.describe(&format!("{} (needs a `{want}...` line)", words.join(" "))));
    };
    if !ran.ok {
        return Err(ran.describe("mpi_check printed its line but did not exit 0"));
    }
    if sent < MPI_MIN_BYTES {
        return Err(format!(
            "only {sent} bytes left A's veth (at least {MPI_MIN_BYTES} expected): the ranks \
             did not talk across the namespaces\n{}",
            tail(&ran.out, 20)
        ));
    }
    let numbers = line.trim_start_matches(want.trim_end()).trim().to_string();
    Ok(format!("{numbers} ({} MiB on the veth)", sent >> 20))
}

type Case<'a> = (String, Box<dyn Fn(&Lane) -> Outcome + Send + Sync + 'a>);

fn cases() -> Vec<Case<'static>> {
    let mut v: Vec<Case<'static>> = vec![("ucx_info -d".into(), Box::new(ucx_info))];
    for tls in ["rc_verbs,ud_verbs", "ud_verbs"] {
        for (test, size, iters) in [
            ("tag_lat", "8", "2000"),
            ("tag_bw", "65536", "400"),
            ("ucp_put_bw", "65536", "400"),
        ] {
            v.push((
                format!("ucx_perftest -t {test} UCX_TLS={tls}"),
                Box::new(move |l: &Lane| ucx_perftest(l, tls, test, size, iters)),
            ));
        }
    }
    v.push((
        "fi_pingpong -e rdm verbs;ofi_rxm".into(),
        Box::new(|l: &Lane| fi_pingpong(l, "verbs;ofi_rxm", "rdm", "65536", "64k")),
    ));
    v.push((
        "fi_pingpong -e rdm verbs;ofi_rxd".into(),
        Box::new(|l: &Lane| fi_pingpong(l, "verbs;ofi_rxd", "rdm", "65536", "64k")),
    ));
    v.push((
        "fi_pingpong -e dgram verbs".into(),
        Box::new(|l: &Lane| fi_pingpong(l, "verbs", "dgram", "1024", "1k")),
    ));
    v.push((
        "MPI Open MPI TCP baseline, 2 ranks".into(),
        Box::new(|l: &Lane| mpi_case(l, Mpi::OmpiTcp, 2)),
    ));
    v.push((
        "MPI Open MPI under xroce run, no MCA choice, 2 ranks".into(),
        Box::new(|l: &Lane| mpi_case(l, Mpi::OmpiAsUserRuns, 2)),
    ));
    v.push((
        "MPI MPICH under xroce run, hydra's environment, 2 ranks".into(),
        Box::new(|l: &Lane| mpi_case(l, Mpi::MpichAsUserRuns, 2)),
    ));
    for ranks in [2, 4] {
        v.push((
            format!("MPI Open MPI pml ucx, {ranks} ranks"),
            Box::new(move |l: &Lane| mpi_case(l, Mpi::OmpiUcx, ranks)),
        ));
        for prov in ["verbs;ofi_rxm", "verbs;ofi_rxd"] {
            v.push((
                format!("MPI Open MPI mtl ofi {prov}, {ranks} ranks"),
                Box::new(move |l: &Lane| mpi_case(l, Mpi::OmpiOfi(prov), ranks)),
            ));
        }
        v.push((
            format!("MPI MPICH ch4:ucx, {ranks} ranks"),
            Box::new(move |l: &Lane| mpi_case(l, Mpi::Mpich, ranks)),
        ));
    }
    v
}

/// Runs every case (or those whose name contains `XROCE_ENGINES_ONLY`) on `lane`, one
/// after another; returns (name, outcome, seconds).
fn run_lane(lane: &Lane, cases: &[Case<'_>]) -> Vec<(String, Outcome, f64)> {
    let only = std::env::var("XROCE_ENGINES_ONLY").ok();
    let mut results = Vec::new();
    for (name, case) in cases {
        if only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let t0 = Instant::now();
        let label = format!("MTU {}: {name}", lane.mtu);
        let outcome = case(lane);
        lane.sweep();
        let secs = t0.elapsed().as_secs_f64();
        match &outcome {
            Ok(n) => println!("engines: {label}: ok ({secs:.1} s) {n}"),
            Err(_) => println!("engines: {label}: FAILED ({secs:.1} s)"),
        }
        results.push((label, outcome, secs));
    }
    results
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn engines_run_unmodified_on_xroce() {
    let test = "engines_run_unmodified_on_xroce";
    if !ready(test) {
        return;
    }
    let build = Scratch::new("engines-build");
    let programs = build_programs(&build.0).unwrap_or_else(|e| panic!("{test}: {e}"));
    let cases = cases();
    let serial = std::env::var("XROCE_ENGINES_SERIAL").is_ok_and(|v| v == "1");
    let mtus = [(90u8, 1500u32), (91, 9000)];
    let mut results = Vec::new();
    if serial {
        for (net, mtu) in mtus {
            let lane = Lane::new(net, mtu, &programs);
            results.extend(run_lane(&lane, &cases));
        }
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = mtus
                .iter()
                .map(|&(net, mtu)| {
                    let (programs, cases) = (&programs, &cases);
                    s.spawn(move || {
                        let lane = Lane::new(net, mtu, programs);
                        run_lane(&lane, cases)
                    })
                })
                .collect();
            for h in handles {
                results.extend(h.join().expect("a lane panicked"));
            }
        });
    }
    println!("\nengines: summary");
    for (label, outcome, secs) in &results {
        match outcome {
            Ok(n) => println!("  ok      {label} ({secs:.1} s): {n}"),
            Err(_) => println!("  FAILED  {label} ({secs:.1} s)"),
        }
    }
    let failed: Vec<String> = results
        .iter()
        .filter_map(|(label, outcome, _)| {
            outcome.as_ref().err().map(|e| format!("=== {label}\n{e}"))
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{test}: {} of {} cases failed:\n{}",
        failed.len(),
        results.len(),
        failed.join("\n")
    );
}
