//! `xroce run` without root and without the real library: its errors (before the program
//! starts), the directory of soname links and the environment the program gets, the exit
//! status passed through, and signals forwarded. Libraries are stood in for by empty files
//! in a directory given with `XROCE_LIB_DIR`; the programs are shell commands, which load
//! no libibverbs.
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn xroce() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xroce"));
    cmd.env_remove("XROCE_NETDEV")
        .env_remove("XROCE_DRIVER")
        .env_remove("XROCE_PROGRESS")
        .env_remove("XROCE_SHARDS")
        .env_remove("XROCE_PCAP");
    cmd
}

/// A directory with (empty) library files of these names.
fn lib_dir(files: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::write(dir.path().join(f), b"").unwrap();
    }
    dir
}

fn run_in(lib: &Path, args: &[&str]) -> Output {
    xroce()
        .env("XROCE_LIB_DIR", lib)
        .arg("run")
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn the_program_gets_the_link_directory_and_the_options_as_environment() {
    let lib = lib_dir(&[
        "libxroce_ibverbs.so",
        "libxroce_mlx5.so",
        "libxroce_efa.so",
        "libxroce_rdmacm.so",
    ]);
    let pcap = tempfile::tempdir().unwrap();
    let pcap_file = pcap.path().join("c.pcap");
    let script = r#"d=${LD_LIBRARY_PATH%%:*}; echo "dir=$d"; echo "rest=${LD_LIBRARY_PATH#*:}"
        for l in libibverbs.so.1 libmlx5.so.1 libefa.so.1 librdmacm.so.1; do
          echo "$l -> $(readlink "$d/$l")"; done
        echo "NETDEV=$XROCE_NETDEV DRIVER=$XROCE_DRIVER PROGRESS=$XROCE_PROGRESS SHARDS=$XROCE_SHARDS PCAP=$XROCE_PCAP"
        echo "args=$*""#;
    let out = xroce()
        .env("XROCE_LIB_DIR", lib.path())
        .env("LD_LIBRARY_PATH", "/opt/a:/opt/b")
        .args([
            "run",
            "-d",
            "lo",
            "--driver",
            "udp",
            "--progress",
            "busy-poll",
            "--shards",
            "2",
        ])
        .arg("--pcap")
        .arg(&pcap_file)
        .args(["--", "sh", "-c", script, "sh", "-d", "x y"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(!stderr.contains("warning"), "all stand-ins there: {stderr}");
    let real = lib.path().canonicalize().unwrap();
    for (soname, file) in [
        ("libibverbs.so.1", "libxroce_ibverbs.so"),
        ("libmlx5.so.1", "libxroce_mlx5.so"),
        ("libefa.so.1", "libxroce_efa.so"),
        ("librdmacm.so.1", "libxroce_rdmacm.so"),
    ] {
        let line = format!("{soname} -> {}", real.join(file).display());
        assert!(stdout.contains(&line), "{line}\n{stdout}");
    }
    assert!(stdout.contains("rest=/opt/a:/opt/b\n"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "NETDEV=lo DRIVER=udp PROGRESS=busy-poll SHARDS=2 PCAP={}\n",
            pcap_file.display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("args=-d x y\n"), "{stdout}");
    // The directory is private to the run and gone after it.
    let dir = stdout.lines().find_map(|l| l.strip_prefix("dir=")).unwrap();
    assert!(
        Path::new(dir)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("xroce-run-"),
        "{dir}"
    );
    assert!(!Path::new(dir).exists(), "{dir} left behind");

    // Without options the program's environment is left as it was.
    let out = xroce()
        .env("XROCE_LIB_DIR", lib.path())
        .env("XROCE_DRIVER", "udp")
        .args([
            "run",
            "sh",
            "-c",
            "echo \"N=$XROCE_NETDEV D=$XROCE_DRIVER\"",
        ])
        .output()
        .unwrap();
    assert_eq!(text(&out.stdout), "N= D=udp\n", "{}", text(&out.stderr));
}

#[test]
fn missing_stand_ins_are_a_warning_and_a_missing_library_an_error() {
    let lib = lib_dir(&["libxroce_ibverbs.so"]);
    let out = run_in(lib.path(), &["--", "true"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: stand-ins not in")
            && stderr.contains("libxroce_mlx5.so (libmlx5.so.1)")
            && stderr.contains("libxroce_efa.so (libefa.so.1)")
            && stderr.contains("libxroce_rdmacm.so (librdmacm.so.1)"),
        "{stderr}"
    );

    let empty = lib_dir(&["libxroce_mlx5.so"]);
    let marker = empty.path().join("started");
    let out = run_in(empty.path(), &["--", "touch", marker.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "xroce: error: libxroce_ibverbs.so not found; looked in {} (XROCE_LIB_DIR)",
            empty.path().display()
        )),
        "{stderr}"
    );
    assert!(!marker.exists(), "the program ran");

    // Without XROCE_LIB_DIR: next to the executable (where cargo builds the library), then
    // the install directory; the message names both when neither has it.
    let out = xroce()
        .env_remove("XROCE_LIB_DIR")
        .args([
            "run",
            "--",
            "sh",
            "-c",
            "readlink ${LD_LIBRARY_PATH%%:*}/libibverbs.so.1",
        ])
        .output()
        .unwrap();
    let exe_dir = PathBuf::from(env!("CARGO_BIN_EXE_xroce"))
        .parent()
        .unwrap()
        .to_path_buf();
    if exe_dir.join("libxroce_ibverbs.so").is_file() {
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout).trim(),
            exe_dir
                .canonicalize()
                .unwrap()
                .join("libxroce_ibverbs.so")
                .display()
                .to_string()
        );
    } else if !Path::new("/usr/local/lib/xroce/libxroce_ibverbs.so").is_file() {
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "looked in {} (next to the xroce executable), /usr/local/lib/xroce (the install directory)",
                exe_dir.display()
            )),
            "{stderr}"
        );
    }
}

#[test]
fn bad_options_and_programs_fail_before_the_program_runs() {
    let lib = lib_dir(&["libxroce_ibverbs.so"]);
    let marker = lib.path().join("started");
    let touch = ["touch", marker.to_str().unwrap()];
    let cases: [(&[&str], i32, &str); 5] = [
        (
            &["-d", "xroce-nope0", "--"],
            1,
            "xroce: error: -d xroce-nope0: no such network interface here (interfaces: lo",
        ),
        (
            &["-d", "lo,xroce-nope1", "--"],
            1,
            "-d xroce-nope1: no such network interface here",
        ),
        (
            &["--driver", "mem", "--"],
            2,
            "invalid value 'mem' for '--driver <DRIVER>'",
        ),
        (
            &["--progress", "spin", "--"],
            2,
            "[possible values: wakeup, busy-poll]",
        ),
        (
            &["--pcap", "/nonexistent-dir/x.pcap", "--"],
            1,
            "--pcap /nonexistent-dir/x.pcap: directory /nonexistent-dir does not exist",
        ),
    ];
    for (opts, code, message) in cases {
        let args = [opts, &touch[..]].concat();
        let out = run_in(lib.path(), &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(!marker.exists(), "{args:?}: the program ran");
    }
    // No program at all.
    let out = run_in(lib.path(), &["-d", "lo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("<PROGRAM>"),
        "{}",
        text(&out.stderr)
    );
    // A program that does not exist, or cannot be executed: named, with the shell's codes.
    let out = run_in(lib.path(), &["--", "xroce-no-such-program", "-a"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains(
            "xroce: error: xroce-no-such-program: program not found (not a file, and not on PATH)"
        ),
        "{}",
        text(&out.stderr)
    );
    let not_exec = lib.path().join("data.txt");
    std::fs::write(&not_exec, "x").unwrap();
    let out = run_in(lib.path(), &["--", not_exec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("{}: cannot execute", not_exec.display())),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn the_exit_status_is_the_programs() {
    let lib = lib_dir(&["libxroce_ibverbs.so"]);
    for (script, code) in [
        ("exit 0", 0),
        ("exit 7", 7),
        ("kill -TERM $$", 128 + 15),
        ("kill -KILL $$", 128 + 9),
    ] {
        let out = run_in(lib.path(), &["--", "sh", "-c", script]);
        assert_eq!(out.status.code(), Some(code), "{script}");
    }
}

#[test]
fn signals_are_forwarded_and_the_directory_removed() {
    let lib = lib_dir(&["libxroce_ibverbs.so"]);
    for (signal, name) in [
        (rustix::process::Signal::TERM, "TERM"),
        (rustix::process::Signal::INT, "INT"),
    ] {
        let script = format!(
            "trap 'echo got {name}; exit 5' {name}; echo \"ready ${{LD_LIBRARY_PATH%%:*}}\"; \
             while :; do sleep 0.05; done"
        );
        let mut child = xroce()
            .env("XROCE_LIB_DIR", lib.path())
            .args(["run", "--", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next().unwrap().unwrap();
        let dir = PathBuf::from(ready.strip_prefix("ready ").unwrap());
        assert!(dir.join("libibverbs.so.1").exists(), "{ready}");
        rustix::process::kill_process(rustix::process::Pid::from_child(&child), signal).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("SIG{name} was not forwarded: the program still runs");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(lines.next().unwrap().unwrap(), format!("got {name}"));
        assert_eq!(status.code(), Some(5), "SIG{name}");
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
