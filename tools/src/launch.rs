//! The logic of `xroce run` (its arguments are in `tools/src/cli/run.rs`): a program started
//! on xroce's drop-in libraries, with the environment that makes it and the engines it loads
//! find xroce's devices.
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use xroce::netdev;
use xroce::verbs::ProgressMode;

use crate::endpoint::verbs::DriverChoice;

/// What `xroce run` was asked for (its arguments, parsed).
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The interfaces offered as devices (XROCE_NETDEV); empty: every Ethernet interface up.
    pub devices: Vec<String>,
    /// The frame driver (XROCE_DRIVER).
    pub driver: Option<DriverChoice>,
    /// How the background progress thread waits (XROCE_PROGRESS).
    pub progress: Option<ProgressMode>,
    /// Engine shards per device (XROCE_SHARDS).
    pub shards: Option<u32>,
    /// Where every frame goes (XROCE_PCAP).
    pub pcap: Option<PathBuf>,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

/// The library the program must get, and the stand-ins it may load at start-up: (file that
/// cargo builds, soname the program asks for, required).
pub const LIBRARIES: [(&str, &str, bool); 4] = [
    ("libxroce_ibverbs.so", "libibverbs.so.1", true),
    ("libxroce_mlx5.so", "libmlx5.so.1", false),
    ("libxroce_efa.so", "libefa.so.1", false),
    ("libxroce_rdmacm.so", "librdmacm.so.1", false),
];

/// Where the libraries are installed by default when neither `XROCE_LIB_DIR` nor the
/// executable's own directory has them.
pub const SYSTEM_LIB_DIR: &str = "/usr/local/lib/xroce";

/// Signals passed on to the program.
const FORWARDED: [i32; 3] = [
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
];

/// Why `xroce run` could not start the program.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// libxroce_ibverbs.so is in none of the places looked at.
    #[error(
        "libxroce_ibverbs.so not found; looked in {}; build it with `cargo build -p \
         xroce-ibverbs` (it lands next to the xroce executable) or set XROCE_LIB_DIR",
        describe_places(.looked)
    )]
    LibraryMissing {
        /// The directories looked in, each with why it was a candidate.
        looked: Vec<(PathBuf, &'static str)>,
    },
    /// `-d` names no interface of this network namespace.
    #[error("-d {name}: no such network interface here (interfaces: {known})")]
    NoSuchInterface {
        /// The name given.
        name: String,
        /// The interfaces that exist.
        known: String,
    },
    /// `-d` names an interface xroce cannot put a device on.
    #[error("-d {name}: {why}")]
    UnusableInterface {
        /// The name given.
        name: String,
        /// Why not.
        why: String,
    },
    /// `--pcap`'s directory does not exist.
    #[error("--pcap {}: directory {} does not exist", .file.display(), .dir.display())]
    PcapDirMissing {
        /// The file asked for.
        file: PathBuf,
        /// Its directory.
        dir: PathBuf,
    },
    /// The program is not on PATH / does not exist.
    #[error("{}: program not found (not a file, and not on PATH)", .0.to_string_lossy())]
    ProgramNotFound(OsString),
    /// No program was given.
    #[error("no program to run: give it after `--`")]
    NoProgram,
    /// The program exists but cannot be executed.
    #[error("{}: cannot execute: {source}", .program.to_string_lossy())]
    NotExecutable {
        /// The program.
        program: OsString,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file system or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl RunError {
    /// The exit status `xroce run` ends with for this error: 127 and 126 for a program that
    /// is missing or not executable (as a shell and env(1) do), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::ProgramNotFound(_) => 127,
            RunError::NotExecutable { .. } => 126,
            _ => 1,
        }
    }
}

fn describe_places(looked: &[(PathBuf, &'static str)]) -> String {
    looked
        .iter()
        .map(|(dir, why)| format!("{} ({why})", dir.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |source| RunError::Io { what, source }
}

/// The directories to look in, in order: `XROCE_LIB_DIR` alone if it is set (an explicit
/// choice is not second-guessed), else the executable's directory, then `lib/xroce` beside
/// the executable's `bin` (where the Debian package puts them: /usr/bin, /usr/lib/xroce),
/// then [`SYSTEM_LIB_DIR`].
pub fn candidate_dirs(
    lib_dir_env: Option<&OsStr>,
    exe: Option<&Path>,
) -> Vec<(PathBuf, &'static str)> {
    if let Some(dir) = lib_dir_env.filter(|d| !d.is_empty()) {
        return vec![(PathBuf::from(dir), "XROCE_LIB_DIR")];
    }
    let mut dirs = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        dirs.push((dir.to_path_buf(), "next to the xroce executable"));
        if let Some(prefix) = dir.parent().filter(|_| dir.ends_with("bin")) {
            dirs.push((prefix.join("lib/xroce"), "the package's directory"));
        }
    }
    dirs.push((PathBuf::from(SYSTEM_LIB_DIR), "the install directory"));
    dirs
}

/// The first candidate directory holding libxroce_ibverbs.so.
pub fn find_lib_dir(candidates: Vec<(PathBuf, &'static str)>) -> Result<PathBuf, RunError> {
    match candidates
        .iter()
        .find(|(dir, _)| dir.join(LIBRARIES[0].0).is_file())
    {
        Some((dir, _)) => Ok(dir.clone()),
        None => Err(RunError::LibraryMissing { looked: candidates }),
    }
}

/// The private directory of soname symlinks; removed when dropped.
#[derive(Debug)]
pub struct LinkDir {
    dir: tempfile::TempDir,
    /// Stand-ins that were not found (file names), for the warning.
    pub missing: Vec<&'static str>,
}

impl LinkDir {
    /// Makes the directory (mode 0700, under $TMPDIR) with a symlink per library found in
    /// `lib_dir`; libxroce_ibverbs.so must be there.
    pub fn create(lib_dir: &Path) -> Result<LinkDir, RunError> {
        let lib_dir = lib_dir
            .canonicalize()
            .map_err(io_err(format!("resolving {}", lib_dir.display())))?;
        let dir = tempfile::Builder::new()
            .prefix("xroce-run-")
            .tempdir()
            .map_err(io_err("creating the library directory"))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(format!("chmod 0700 {}", dir.path().display())))?;
        let mut missing = Vec::new();
        for (file, soname, required) in LIBRARIES {
            let target = lib_dir.join(file);
            if !target.is_file() {
                if required {
                    return Err(RunError::LibraryMissing {
                        looked: vec![(lib_dir, "the library directory")],
                    });
                }
                missing.push(file);
                continue;
            }
            let link = dir.path().join(soname);
            std::os::unix::fs::symlink(&target, &link).map_err(io_err(format!(
                "linking {} to {}",
                link.display(),
                target.display()
            )))?;
        }
        Ok(LinkDir { dir, missing })
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// `dir` in front of an existing `LD_LIBRARY_PATH` value.
pub fn prepend_path(dir: &Path, existing: Option<&OsStr>) -> OsString {
    let mut value = dir.as_os_str().to_os_string();
    if let Some(old) = existing.filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(old);
    }
    value
}

/// Checks the `-d` values against the interfaces of this namespace; returns the interface
/// names (the device name `xroce_<iface>` is accepted too). A down interface is a warning.
pub fn check_interfaces(names: &[String]) -> Result<Vec<String>, RunError> {
    let mut out = Vec::new();
    for typed in names {
        if typed.is_empty() {
            return Err(RunError::UnusableInterface {
                name: typed.clone(),
                why: "empty interface name".into(),
            });
        }
        let name = crate::setup::interface_name(typed);
        let info = match netdev::query(&name) {
            Ok(info) => info,
            Err(netdev::NetdevError::NoSuchInterface(_) | netdev::NetdevError::InvalidName(_)) => {
                return Err(RunError::NoSuchInterface {
                    name: typed.clone(),
                    known: netdev::list().unwrap_or_default().join(", "),
                })
            }
            Err(e) => {
                return Err(RunError::UnusableInterface {
                    name: typed.clone(),
                    why: e.to_string(),
                })
            }
        };
        if !info.is_active() {
            eprintln!(
                "xroce run: warning: {}",
                crate::setup::not_active_reason(&info)
            );
        }
        out.push(name);
    }
    Ok(out)
}

/// The environment the program gets (besides `LD_LIBRARY_PATH`), from the options.
pub fn xroce_env(
    netdevs: &[String],
    driver: Option<DriverChoice>,
    progress: Option<ProgressMode>,
    shards: Option<u32>,
    pcap: Option<&Path>,
) -> Vec<(&'static str, OsString)> {
    let mut env = Vec::new();
    if !netdevs.is_empty() {
        env.push(("XROCE_NETDEV", netdevs.join(",").into()));
    }
    if let Some(d) = driver {
        env.push(("XROCE_DRIVER", d.name().into()));
    }
    if let Some(p) = progress {
        env.push(("XROCE_PROGRESS", p.name().into()));
    }
    if let Some(n) = shards {
        env.push(("XROCE_SHARDS", n.to_string().into()));
    }
    if let Some(p) = pcap {
        env.push(("XROCE_PCAP", p.as_os_str().to_os_string()));
    }
    env
}

/// The folder of soname links beside the libraries in the Debian package (scripts/deb.sh).
pub const PACKAGED_LINKS: &str = "sonames";

/// The options of this `xroce run` that the processes an MPI launcher starts on other hosts
/// should get too. Not `-d`: another host's interfaces have names of their own (there the
/// device is every Ethernet interface that is up, or its own XROCE_NETDEV); not `--pcap`: one
/// file per host would be overwritten by every process.
fn forwarded_options(args: &RunOptions) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(d) = args.driver {
        out.push(format!("--driver={}", d.name()));
    }
    if let Some(p) = args.progress {
        out.push(format!("--progress={}", p.name()));
    }
    if let Some(n) = args.shards {
        out.push(format!("--shards={n}"));
    }
    out
}

/// What makes the engines choose xroce's device without settings of their own, unless the
/// user set the variable already:
/// - Open MPI 4.1 takes UCX only for devices whose kernel driver matches `mlx*`
///   (`opal_common_ucx_devices`, held against `/sys/class/infiniband/<dev>/device/driver`);
///   xroce's devices have no kernel driver, so the list becomes `any` (the transports still
///   have to be `rc_verbs`/`ud_verbs`, `opal_common_ucx_tls`), and `mpirun` alone picks `pml
///   ucx` as it would on a Mellanox NIC; Debian's Open MPI excludes `pml ucx` in its site
///   file (`/etc/openmpi/openmpi-mca-params.conf`: `pml = ^ucx`, for machines without RDMA),
///   so the PMLs become `ucx,ob1` (UCX first, ob1 where UCX finds no device);
/// - Open MPI starts an `orted` on every other host through ssh, outside this process: its
///   launch agent becomes `xroce run [these options] -- orted`, so the ranks there load
///   xroce's libraries too (with `xroce` at the same path on every host, as the package puts
///   it).
///
/// MPICH's hydra hands the ranks `mpiexec`'s environment itself, and UCX and libfabric find
/// the device as they find any (docs/engines.md).
pub fn engine_env(
    exe: Option<&Path>,
    forwarded: &[String],
    existing: impl Fn(&str) -> Option<OsString>,
) -> Vec<(&'static str, OsString)> {
    let mut env = Vec::new();
    if existing("OMPI_MCA_opal_common_ucx_devices").is_none()
        && existing("OMPI_MCA_pml_ucx_devices").is_none()
    {
        env.push(("OMPI_MCA_opal_common_ucx_devices", "any".into()));
    }
    if existing("OMPI_MCA_pml").is_none() {
        env.push(("OMPI_MCA_pml", "ucx,ob1".into()));
    }
    if let (Some(exe), None) = (exe, existing("OMPI_MCA_orte_launch_agent")) {
        let mut agent = OsString::from(exe.as_os_str());
        agent.push(" run");
        for option in forwarded {
            agent.push(" ");
            agent.push(option);
        }
        agent.push(" -- orted");
        env.push(("OMPI_MCA_orte_launch_agent", agent));
    }
    env
}

/// `--pcap FILE` made absolute, its directory checked.
pub fn check_pcap(file: &Path) -> Result<PathBuf, RunError> {
    let abs = std::path::absolute(file).map_err(io_err(format!("--pcap {}", file.display())))?;
    let dir = abs.parent().unwrap_or(Path::new("/")).to_path_buf();
    if !dir.is_dir() {
        return Err(RunError::PcapDirMissing {
            file: file.to_path_buf(),
            dir,
        });
    }
    Ok(abs)
}

/// The exit status of `xroce run` for the program's: its code, or 128 + the signal.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

pub fn launch(args: RunOptions) -> Result<i32, RunError> {
    // Everything is checked before the program starts.
    let netdevs = check_interfaces(&args.devices)?;
    let pcap = args.pcap.as_deref().map(check_pcap).transpose()?;
    let exe = std::env::current_exe().ok();
    let lib_dir_env = std::env::var_os("XROCE_LIB_DIR");
    let lib_dir = find_lib_dir(candidate_dirs(lib_dir_env.as_deref(), exe.as_deref()))?;
    let links = LinkDir::create(&lib_dir)?;
    // The package's link directory is the same path on every node, so a launcher that hands
    // its environment to the ranks of other hosts (MPICH's hydra does) hands them a path
    // that exists there; the private one exists only here, while this runs.
    let packaged_links = lib_dir.join(PACKAGED_LINKS);
    let library_path = if packaged_links.join(LIBRARIES[0].1).is_file() {
        packaged_links
    } else {
        links.path().to_path_buf()
    };
    if !links.missing.is_empty() {
        let list: Vec<String> = links
            .missing
            .iter()
            .map(|file| {
                let soname = LIBRARIES.iter().find(|l| l.0 == *file).map_or("", |l| l.1);
                format!("{file} ({soname})")
            })
            .collect();
        eprintln!(
            "xroce run: warning: stand-ins not in {}: {}; a program that loads one gets the \
             system's library, which may not start on xroce's libibverbs",
            lib_dir.display(),
            list.join(", ")
        );
    }
    let (program, program_args) = args.command.split_first().ok_or(RunError::NoProgram)?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(program_args);
    cmd.env(
        "LD_LIBRARY_PATH",
        prepend_path(
            &library_path,
            std::env::var_os("LD_LIBRARY_PATH").as_deref(),
        ),
    );
    let forwarded = forwarded_options(&args);
    for (key, value) in engine_env(exe.as_deref(), &forwarded, |k| std::env::var_os(k)) {
        cmd.env(key, value);
    }
    for (key, value) in xroce_env(
        &netdevs,
        args.driver,
        args.progress,
        args.shards,
        pcap.as_deref(),
    ) {
        cmd.env(key, value);
    }
    // Catch the signals before the child exists, so none is lost in between; while the
    // child runs they go to it (a terminal's Ctrl-C reaches it directly as well).
    let mut signals = signal_hook::iterator::Signals::new(FORWARDED)
        .map_err(io_err("installing the signal handlers"))?;
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(RunError::ProgramNotFound(program.clone()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(RunError::NotExecutable {
                program: program.clone(),
                source: e,
            })
        }
        Err(e) => {
            return Err(RunError::Io {
                what: format!("starting {}", program.to_string_lossy()),
                source: e,
            })
        }
    };
    let pid = rustix::process::Pid::from_child(&child);
    let handle = signals.handle();
    let forwarder = std::thread::spawn(move || {
        for sig in signals.forever() {
            if let Some(sig) = rustix::process::Signal::from_named_raw(sig) {
                // The child may have exited already (ESRCH): nothing to do then.
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    });
    let status = child.wait().map_err(io_err("waiting for the program"));
    handle.close();
    let _ = forwarder.join();
    drop(links);
    Ok(exit_code(status?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_follows_the_options() {
        assert!(xroce_env(&[], None, None, None, None).is_empty());
        let env = xroce_env(
            &["veth0".into(), "veth1".into()],
            Some(DriverChoice::Xdp),
            Some(ProgressMode::Wakeup),
            Some(2),
            Some(Path::new("/tmp/a.pcap")),
        );
        let get = |k: &str| env.iter().find(|e| e.0 == k).map(|e| e.1.clone());
        assert_eq!(get("XROCE_NETDEV"), Some("veth0,veth1".into()));
        assert_eq!(get("XROCE_DRIVER"), Some("xdp".into()));
        assert_eq!(get("XROCE_PROGRESS"), Some("wakeup".into()));
        assert_eq!(get("XROCE_SHARDS"), Some("2".into()));
        assert_eq!(get("XROCE_PCAP"), Some("/tmp/a.pcap".into()));
        assert_eq!(
            prepend_path(Path::new("/t/x"), Some(OsStr::new("/a:/b"))),
            "/t/x:/a:/b"
        );
        assert_eq!(
            prepend_path(Path::new("/t/x"), Some(OsStr::new(""))),
            "/t/x"
        );
        assert_eq!(prepend_path(Path::new("/t/x"), None), "/t/x");
    }

    #[test]
    fn open_mpi_is_told_about_xroce_unless_the_user_said_otherwise() {
        let none = |_: &str| None;
        let exe = Path::new("/usr/bin/xroce");
        let forwarded = vec!["--driver=relay".to_string()];
        let env = engine_env(Some(exe), &forwarded, none);
        assert_eq!(
            env,
            [
                ("OMPI_MCA_opal_common_ucx_devices", "any".into()),
                ("OMPI_MCA_pml", "ucx,ob1".into()),
                (
                    "OMPI_MCA_orte_launch_agent",
                    "/usr/bin/xroce run --driver=relay -- orted".into()
                ),
            ]
        );
        let users = |k: &str| {
            matches!(k, "OMPI_MCA_pml_ucx_devices" | "OMPI_MCA_pml").then(|| OsString::from("x"))
        };
        let env = engine_env(Some(exe), &[], users);
        assert_eq!(
            env,
            [(
                "OMPI_MCA_orte_launch_agent",
                "/usr/bin/xroce run -- orted".into()
            )]
        );
    }

    #[test]
    fn the_library_directory_is_looked_for_in_order() {
        let exe = Path::new("/opt/x/target/debug/xroce");
        let dirs = candidate_dirs(None, Some(exe));
        assert_eq!(
            dirs.iter().map(|d| d.0.clone()).collect::<Vec<_>>(),
            [
                PathBuf::from("/opt/x/target/debug"),
                PathBuf::from(SYSTEM_LIB_DIR)
            ]
        );
        let packaged = candidate_dirs(None, Some(Path::new("/usr/bin/xroce")));
        assert_eq!(
            packaged.iter().map(|d| d.0.clone()).collect::<Vec<_>>(),
            [
                PathBuf::from("/usr/bin"),
                PathBuf::from("/usr/lib/xroce"),
                PathBuf::from(SYSTEM_LIB_DIR)
            ]
        );
        let dirs = candidate_dirs(Some(OsStr::new("/lib/mine")), Some(exe));
        assert_eq!(dirs, [(PathBuf::from("/lib/mine"), "XROCE_LIB_DIR")]);
        let err = find_lib_dir(vec![
            (PathBuf::from("/nonexistent/a"), "XROCE_LIB_DIR"),
            (PathBuf::from("/nonexistent/b"), "the install directory"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with(
                "libxroce_ibverbs.so not found; looked in /nonexistent/a (XROCE_LIB_DIR), \
                 /nonexistent/b (the install directory); "
            ),
            "{err}"
        );
        let lib = tempfile::tempdir().unwrap();
        std::fs::write(lib.path().join("libxroce_ibverbs.so"), b"").unwrap();
        let found = find_lib_dir(vec![
            (
                PathBuf::from("/nonexistent/a"),
                "next to the xroce executable",
            ),
            (lib.path().to_path_buf(), "the install directory"),
        ])
        .unwrap();
        assert_eq!(found, lib.path());
    }

    #[test]
    fn the_link_directory_has_a_symlink_per_soname_and_goes_away() {
        let lib = tempfile::tempdir().unwrap();
        for file in [
            "libxroce_ibverbs.so",
            "libxroce_mlx5.so",
            "libxroce_rdmacm.so",
        ] {
            std::fs::write(lib.path().join(file), b"").unwrap();
        }
        let links = LinkDir::create(lib.path()).unwrap();
        let dir = links.path().to_path_buf();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["libibverbs.so.1", "libmlx5.so.1", "librdmacm.so.1"]);
        let real = lib.path().canonicalize().unwrap();
        assert_eq!(
            std::fs::read_link(dir.join("libibverbs.so.1")).unwrap(),
            real.join("libxroce_ibverbs.so")
        );
        assert_eq!(
            std::fs::read_link(dir.join("libmlx5.so.1")).unwrap(),
            real.join("libxroce_mlx5.so")
        );
        assert_eq!(links.missing, ["libxroce_efa.so"]);
        drop(links);
        assert!(!dir.exists(), "{} left behind", dir.display());
        // Without the library itself: an error naming the directory.
        std::fs::remove_file(lib.path().join("libxroce_ibverbs.so")).unwrap();
        let err = LinkDir::create(lib.path()).unwrap_err().to_string();
        assert!(err.contains(&real.display().to_string()), "{err}");
    }

    #[test]
    fn exit_status_is_the_programs_or_128_plus_the_signal() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
    }
}
