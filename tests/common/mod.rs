//! Helpers shared by the integration tests (include with `mod common;`).
#![allow(dead_code)]

pub mod child;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xroce::netns::Netns;

/// `true` if the test may go on; `false` (after a visible "SKIPPED" line) if it must skip
/// for lack of root. Under `XROCE_CI=1` a missing privilege fails the test instead.
pub fn privileged_or_skip(test: &str) -> bool {
    match xroce::netns::require_privileges(test) {
        Ok(go) => go,
        Err(msg) => panic!("{msg}"),
    }
}

/// Prints `SKIPPED: <test>: <why>` where the user sees it. libtest captures `print!` and
/// `eprint!` of passing tests and shows them only on failure, so the line is written to the
/// stderr handle itself, which the capture does not reach.
pub fn report_skip(test: &str, why: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED: {test}: {why}");
}

/// The arguments to `setpriv` (util-linux) that run the command after them as user nobody,
/// with no groups and no capabilities: how a test run as root shows what a user gets.
pub const SETPRIV_AS_NOBODY: [&str; 6] = [
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
    "--inh-caps=-all",
];

/// `true` if Debian's python3-pyverbs can import `module` (`pyverbs.cmid`, `pyverbs.qp`);
/// else a visible skip, or a failure under `XROCE_CI=1`.
#[allow(dead_code)]
pub fn pyverbs_or_skip(test: &str, module: &str) -> bool {
    let found = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        let why = "needs python3-pyverbs (scripts/setup.sh installs it)";
        if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
            panic!("{test}: {why}; XROCE_CI=1 forbids skipping");
        }
        report_skip(test, why);
    }
    found
}

/// Runs the test `name` of this test binary again in a child process (with `env` set and
/// `env_remove` removed) and returns what it wrote to stderr, after asserting it passed.
/// Used to prove that a skip is visible in the harness's normal, captured output.
pub fn rerun_self(name: &str, env: &[(&str, &str)], env_remove: &[&str]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    for k in env_remove {
        cmd.env_remove(k);
    }
    let out = cmd.output().expect("re-run this test binary");
    assert!(
        out.status.success(),
        "{name} failed when re-run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Path of the `xroce` binary built for this test run. The binary is the tools package's
/// (`tools/`): only its tests have one; a provider test asking for it is a test in the wrong
/// package.
pub fn xroce_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_xroce") {
        Some(path) => PathBuf::from(path),
        None => panic!("the xroce binary is the tools package's: move this test to tools/tests"),
    }
}

/// The repository's root (the workspace's, where `Cargo.lock` is), from a test of either
/// package: the provider's (the root) or the tools' (`tools/`).
pub fn repo_root() -> &'static std::path::Path {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|dir| dir.join("Cargo.lock").is_file())
        .unwrap_or(manifest)
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of a hex string.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A helper child with its stdout read line by line.
pub struct Helper {
    /// The child process.
    pub child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Helper {
    /// Run this test binary's `helper` test as `role` inside `ns`.
    pub fn spawn(ns: &Netns, role: &str, env: &[(&str, String)]) -> Helper {
        Self::spawn_cmd(ns.command(std::env::current_exe().unwrap()), role, env)
    }

    /// Run `cmd` (this test binary, possibly wrapped) as helper `role`.
    pub fn spawn_cmd(mut cmd: Command, role: &str, env: &[(&str, String)]) -> Helper {
        cmd.args(["--exact", "helper", "--nocapture", "--test-threads=1"])
            .env("XROCE_DRIVER_HELPER", role)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn helper");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Helper {
            child,
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Wait for a line starting with `prefix` (returns it), or panic with what was seen.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        self.try_expect(prefix, timeout)
            .unwrap_or_else(|why| panic!("{why}"))
    }

    /// Wait for a line starting with `prefix`; on an ERROR line or a timeout, say what the
    /// helper printed.
    pub fn try_expect(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    // libtest prints "test helper ... " before the helper's first line.
                    let line = line.trim_start_matches("test helper ... ").to_string();
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return Ok(line);
                    }
                    if line.starts_with("ERROR") && !prefix.starts_with("ERROR") {
                        return Err(format!(
                            "helper failed: {line}\nall output: {:#?}",
                            self.seen
                        ));
                    }
                }
                Err(_) => {
                    return Err(format!(
                        "no {prefix:?} line within {timeout:?}; helper said: {:#?}",
                        self.seen
                    ))
                }
            }
        }
    }

    /// Everything the helper prints within `wait` (for a failure report about its peer).
    pub fn drain_output(&mut self, wait: Duration) -> Vec<String> {
        let deadline = Instant::now() + wait;
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            self.seen.push(line);
        }
        self.seen.clone()
    }

    /// Wait (up to 20 s) for a successful exit.
    pub fn wait(mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "helper exited with {st}: {:#?}", self.seen);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("helper did not exit: {:#?}", self.seen);
    }
}

/// Wait for `prefix` from both helpers of a pair; a side that fails often does so because its
/// peer did first, so a failure reports what both printed.
pub fn expect_both(
    client: &mut Helper,
    server: &mut Helper,
    prefix: &str,
    timeout: Duration,
) -> (String, String) {
    let c = client.try_expect(prefix, timeout).unwrap_or_else(|why| {
        let said = server.drain_output(Duration::from_secs(2));
        panic!("client: {why}\nserver said: {said:#?}")
    });
    let s = server.try_expect(prefix, timeout).unwrap_or_else(|why| {
        let said = client.drain_output(Duration::from_secs(2));
        panic!("server: {why}\nclient said: {said:#?}")
    });
    (c, s)
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The drop-in C libraries' files beside the `xroce` binary, by soname.
pub const ABI_LIBRARIES: [(&str, &str); 4] = [
    ("libibverbs.so.1", "libxroce_ibverbs.so"),
    ("libmlx5.so.1", "libxroce_mlx5.so"),
    ("libefa.so.1", "libxroce_efa.so"),
    ("librdmacm.so.1", "libxroce_rdmacm.so"),
];

/// The newest modification time of the sources the C libraries are built from.
fn newest_source() -> std::time::SystemTime {
    fn walk(path: &std::path::Path, newest: &mut std::time::SystemTime) {
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        if meta.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                return;
            }
            for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
                walk(&entry.path(), newest);
            }
        } else if let Ok(m) = meta.modified() {
            *newest = (*newest).max(m);
        }
    }
    let root = repo_root();
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    for part in ["src", "abi", "bpf", "build.rs", "Cargo.toml", "Cargo.lock"] {
        walk(&root.join(part), &mut newest);
    }
    newest
}

/// Makes sure the C libraries beside the `xroce` binary are built from the current sources.
/// They are other packages of the workspace, which a test of this package does not make
/// cargo build (`cargo test --test X`); the full build CI runs first makes them, and then
/// this does nothing. Otherwise it runs `cargo build --lib` for the test's profile (the
/// workspace's libraries, as the full build builds them, so neither rebuilds the other's).
pub fn ensure_abi_libraries() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        // A test binary is target/<profile>/deps/<test>-<hash>: the libraries are two up.
        let profile_dir = std::env::current_exe()
            .expect("the test's own path")
            .parent()
            .and_then(|deps| deps.parent())
            .expect("target/<profile>")
            .to_path_buf();
        let sources = newest_source();
        let fresh = ABI_LIBRARIES.iter().all(|(_, file)| {
            std::fs::metadata(profile_dir.join(file))
                .and_then(|m| m.modified())
                .is_ok_and(|built| built >= sources)
        });
        if !fresh {
            let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => "dev".to_string(),
                Some(other) => other.to_string(),
                None => panic!("profile of {}", profile_dir.display()),
            };
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let out = Command::new(cargo)
                .args(["build", "--lib", "--quiet", "--profile", &profile])
                .current_dir(repo_root())
                .stdin(Stdio::null())
                .output()
                .expect("run cargo build");
            assert!(
                out.status.success(),
                "cargo build --lib --profile {profile}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for (_, file) in ABI_LIBRARIES {
            let lib = profile_dir.join(file);
            assert!(lib.is_file(), "{} was built", lib.display());
        }
        profile_dir
    })
    .clone()
}

/// The drop-in C libraries (see [`ensure_abi_libraries`]) and a directory of links named by
/// soname (`libibverbs.so.1`, and the stand-ins `libmlx5.so.1`, `libefa.so.1`,
/// `librdmacm.so.1`) to put first on `LD_LIBRARY_PATH`.
pub fn abi_libraries() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let profile_dir = ensure_abi_libraries();
        let links = profile_dir.join("abi-links");
        std::fs::create_dir_all(&links).expect("make the links directory");
        for (soname, file) in ABI_LIBRARIES {
            let lib = profile_dir.join(file);
            // Under a temporary name, then renamed over the old link: test binaries running
            // at once do not see a missing link.
            let tmp = links.join(format!(".{soname}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&lib, &tmp).expect("link a soname");
            std::fs::rename(&tmp, links.join(soname)).expect("put the link in place");
        }
        links
    })
    .clone()
}

/// A veth pair between two fresh namespaces, addressed 198.18.`net`.1 (A) and .2 (B), each
/// the other's static neighbour.
pub fn veth_pair(net: u8, mtu: u32) -> xroce::netns::VethLink {
    let link = xroce::netns::VethLink::create(&xroce::netns::LinkConfig {
        mtu,
        a_ip: std::net::Ipv4Addr::new(198, 18, net, 1),
        b_ip: std::net::Ipv4Addr::new(198, 18, net, 2),
        ipv6: false,
        queues: 1,
    })
    .expect("namespaces and veth pair");
    link.add_static_neighbours().expect("static neighbours");
    link
}

/// `xroce run -d IFACE [extra] -- PROGRAM ARGS` inside `ns`, output captured, none of the
/// caller's `XROCE_*` settings passed on.
pub fn xroce_run(ns: &Netns, ifname: &str, extra: &[String], program: &[String]) -> Command {
    let mut cmd = ns.command(xroce_bin());
    cmd.args(["run", "-d", ifname])
        .args(extra)
        .arg("--")
        .args(program)
        .env_remove("XROCE_LIB_DIR")
        .env_remove("XROCE_NETDEV")
        .env_remove("XROCE_DRIVER")
        .env_remove("XROCE_PROGRESS")
        .env_remove("XROCE_PCAP")
        .env_remove("XROCE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Whether `program` is an executable file in a directory of `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// `true` if the test may go on: root, and every `(program, Debian package)` on PATH; then
/// the ABI libraries are built. Otherwise a visible skip, or a failure under `XROCE_CI=1`.
pub fn programs_ready(test: &str, programs: &[(&str, &str)]) -> bool {
    if !privileged_or_skip(test) {
        return false;
    }
    let missing: Vec<String> = programs
        .iter()
        .filter(|(p, _)| !on_path(p))
        .map(|(p, pkg)| format!("{p} ({pkg})"))
        .collect();
    if !missing.is_empty() {
        let why = format!(
            "needs {} (scripts/setup.sh installs them)",
            missing.join(", ")
        );
        if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
            panic!("{test}: {why}; XROCE_CI=1 forbids skipping");
        }
        report_skip(test, &why);
        return false;
    }
    ensure_abi_libraries();
    true
}

/// What is missing to compile a C program that includes `header` (from Debian's `package`):
/// gcc, or the header on gcc's search path; `None` when both are there.
pub fn missing_c_header(header: &str, package: &str) -> Option<String> {
    let gcc = Command::new("gcc")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !gcc.is_ok_and(|s| s.success()) {
        return Some("gcc is not installed (apt-get install gcc; scripts/setup.sh)".into());
    }
    // Preprocess an include of the header: the same search path the compile uses.
    let mut child = Command::new("gcc")
        .args(["-E", "-x", "c", "-o", "/dev/null", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gcc ran a moment ago");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().unwrap();
        let _ = stdin.write_all(format!("#include <{header}>\n").as_bytes());
    }
    if !child.wait().is_ok_and(|s| s.success()) {
        return Some(format!(
            "{package} is not installed: no <{header}> (apt-get install {package}; \
             scripts/setup.sh)"
        ));
    }
    None
}
