//! What the three stand-ins' tests share (each crate's `tests/standin.rs` includes this file
//! with `#[path]`): building the stand-ins, the directory of soname links programs find them
//! through, reading symbol tables with binutils, the stub table of a crate's `src/lib.rs`,
//! and the checks themselves, each given the facts of one library ([`Lib`]).
//!
//! Tools and Debian packages: gcc and binutils always; perftest (`/usr/bin/ib_*`),
//! python3-pyverbs, rdma-core's libraries (ibverbs-providers, librdmacm1) and headers
//! (libibverbs-dev, librdmacm-dev) for the checks against them. A missing one is a visible
//! skip, and a failure under `XROCE_CI=1` (scripts/setup.sh installs them all).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The facts of one stand-in.
pub struct Lib {
    /// The soname programs ask for: `libmlx5.so.1`.
    pub soname: &'static str,
    /// The cdylib cargo writes: `libxroce_mlx5.so`.
    pub file: &'static str,
    /// The prefix of the library's version nodes: `MLX5_`.
    pub node_prefix: &'static str,
    /// The crate's `src/lib.rs` (its `c_stubs!` table).
    pub source: &'static str,
    /// The headers that declare the library's functions.
    pub headers: &'static [&'static str],
}

/// The sonames of all three stand-ins and the file each is built as.
pub const ALL: [(&str, &str); 3] = [
    ("libmlx5.so.1", "libxroce_mlx5.so"),
    ("libefa.so.1", "libxroce_efa.so"),
    ("librdmacm.so.1", "libxroce_rdmacm.so"),
];

/// The real libraries, for comparison.
pub const SYSTEM_LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The Python that has Debian's pyverbs (not whatever `python3` is first on PATH).
pub const PYTHON: &str = "/usr/bin/python3";

fn ci() -> bool {
    std::env::var("XROCE_CI").is_ok_and(|v| v == "1")
}

/// `true` if `what` is there; otherwise a visible `SKIPPED` line and `false`, or under
/// `XROCE_CI=1` a failure.
pub fn have(test: &str, ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    assert!(
        !ci(),
        "{test}: needs {what}, and XROCE_CI=1 forbids skipping (scripts/setup.sh installs it)"
    );
    let _ = writeln!(
        std::io::stderr().lock(),
        "SKIPPED: {test}: needs {what} (scripts/setup.sh installs it)"
    );
    false
}

/// Runs `cmd`, panicking if it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The built stand-ins and a directory of links named by soname to them.
pub struct Built {
    /// `target/<profile>`.
    pub profile_dir: PathBuf,
    /// `libmlx5.so.1 -> <profile_dir>/libxroce_mlx5.so`, ...: what goes first on
    /// `LD_LIBRARY_PATH`.
    pub links: PathBuf,
}

impl Built {
    /// The stand-in file of `lib`.
    pub fn path(&self, lib: &Lib) -> PathBuf {
        self.profile_dir.join(lib.file)
    }
}

/// Builds the three stand-ins (cargo does not build a cdylib-only package for its own
/// integration tests, nor the other two at all) with the test's own profile and target
/// directory, once per test binary, and makes the directory of links.
pub fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        // The test binary is <target>/<profile dir>/deps/<name>-<hash>.
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps");
        let target = profile_dir.parent().expect("target/");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev",
            Some(other) => other,
            None => panic!("profile directory of {}", exe.display()),
        };
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = run(Command::new(cargo)
            .args(["build", "--quiet", "--profile", profile, "--target-dir"])
            .arg(target)
            .args(["-p", "xroce-standin-mlx5", "-p", "xroce-standin-efa"])
            .args(["-p", "xroce-rdmacm"])
            .current_dir(env!("CARGO_MANIFEST_DIR")));
        assert!(
            out.status.success(),
            "cargo build of the stand-ins: {}",
            text(&out.stderr)
        );
        // Under target/<profile>, the same links every time: each is made under a temporary
        // name and renamed over the old one, so concurrent test binaries do not trip on it.
        let links = profile_dir.join("standin-links");
        std::fs::create_dir_all(&links).expect("make the links directory");
        for (soname, file) in ALL {
            let target = profile_dir.join(file);
            assert!(target.is_file(), "{} was built", target.display());
            let tmp = links.join(format!(".{soname}.{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(&target, &tmp).expect("link a soname");
            std::fs::rename(&tmp, links.join(soname)).expect("put the link in place");
        }
        Built {
            profile_dir: profile_dir.to_path_buf(),
            links,
        }
    })
}

/// One dynamic symbol: name, version node, and whether the version is the default one
/// (`name@@V`, what a program linked now binds) rather than a compatibility one (`name@V`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sym {
    pub name: String,
    pub version: String,
    pub default: bool,
}

/// The functions `file` defines (`defined`) or imports (`!defined`), from `objdump -T`.
/// Versions objdump puts in parentheses are non-default (for definitions) or references.
pub fn dynamic_functions(file: &Path, defined: bool) -> Vec<Sym> {
    let out = run(Command::new("objdump").arg("-T").arg(file));
    assert!(
        out.status.success(),
        "objdump -T {}: {}",
        file.display(),
        text(&out.stderr)
    );
    let mut syms = Vec::new();
    for line in text(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        // address flags... DF section size version name
        let Some(df) = f.iter().position(|&w| w == "DF") else {
            continue;
        };
        let undefined = f.get(df + 1) == Some(&"*UND*");
        if undefined == defined || f.len() < df + 5 {
            continue;
        }
        let version = f[f.len() - 2];
        let name = f[f.len() - 1];
        let default = !version.starts_with('(');
        syms.push(Sym {
            name: name.to_string(),
            version: version.trim_matches(|c| c == '(' || c == ')').to_string(),
            default,
        });
    }
    syms
}

/// `readelf -d`'s SONAME of `file`.
pub fn soname(file: &Path) -> Option<String> {
    let out = run(Command::new("readelf").arg("-d").arg(file));
    text(&out.stdout)
        .lines()
        .find(|l| l.contains("(SONAME)"))
        .and_then(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
}

/// The names of the version definitions of `file` (`readelf -V`), without the file's own
/// base entry.
pub fn version_definitions(file: &Path) -> BTreeSet<String> {
    let out = run(Command::new("readelf").arg("-V").arg("--wide").arg(file));
    let all = text(&out.stdout);
    let defs = all
        .split("Version definition section")
        .nth(1)
        .expect("a version definition section");
    let defs = defs.split("Version needs section").next().unwrap_or(defs);
    defs.lines()
        .filter(|l| l.contains("Flags:") && !l.contains("BASE"))
        .filter_map(|l| Some(l.split("Name:").nth(1)?.trim().to_string()))
        .collect()
}

/// Whether a dynamic object file asks for `soname` (`objdump -p`'s NEEDED).
pub fn needs(file: &Path, soname: &str) -> bool {
    let out = run(Command::new("objdump").arg("-p").arg(file));
    text(&out.stdout).lines().any(|l| {
        l.trim_start().starts_with("NEEDED") && l.split_whitespace().last() == Some(soname)
    })
}

/// perftest's binaries, `/usr/bin/ib_*` (ib_write_bw, ...).
pub fn perftest_binaries() -> Vec<PathBuf> {
    let mut bins: Vec<PathBuf> = std::fs::read_dir("/usr/bin")
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                        n.starts_with("ib_") && (n.ends_with("_bw") || n.ends_with("_lat"))
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    bins.sort();
    bins
}

/// Where Debian's python3-pyverbs lives.
pub const PYVERBS: &str = "/usr/lib/python3/dist-packages/pyverbs";

/// Every extension module (`.so`) of pyverbs.
pub fn pyverbs_modules() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "so") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new(PYVERBS), &mut out);
    out.sort();
    out
}

/// The Python module name of a pyverbs extension file:
/// `.../pyverbs/providers/mlx5/mlx5dv.cpython-311-x86_64-linux-gnu.so` ->
/// `pyverbs.providers.mlx5.mlx5dv`.
pub fn module_name(file: &Path) -> String {
    let rel = file
        .strip_prefix(Path::new(PYVERBS).parent().unwrap())
        .expect("under dist-packages");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    parts.push(last.split('.').next().unwrap().to_string());
    parts.join(".")
}

/// One row of a crate's `c_stubs!` table.
#[derive(Debug, Clone)]
pub struct Stub {
    pub name: String,
    pub version: String,
    /// `Null`, `Errno`, ... or `Str`.
    pub kind: String,
    /// `Str("...")`'s text.
    pub text: Option<String>,
}

/// The `why` and the rows of the `c_stubs!` table in `source`: a `"NODE" {` line opens a
/// version node, each `name: Kind,` line is a row, `}` closes the node.
pub fn stub_table(source: &str) -> (String, Vec<Stub>) {
    let start = source.find("c_stubs! {").expect("a c_stubs! table");
    let body = &source[start..];
    let why = body
        .split("why: \"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("c_stubs!'s why")
        .to_string();
    let mut rows = Vec::new();
    let mut version: Option<String> = None;
    for line in body.lines().skip(1) {
        let line = line.split("//").next().unwrap().trim();
        if line.is_empty() {
            continue;
        }
        if let Some(node) = line.strip_suffix('{') {
            version = Some(node.trim().trim_matches('"').to_string());
        } else if line == "}" {
            if version.take().is_none() {
                break; // the end of the table
            }
        } else {
            let (name, kind) = line
                .trim_end_matches(',')
                .split_once(':')
                .unwrap_or_else(|| panic!("a table row: {line:?}"));
            let kind = kind.trim();
            let (kind, text) = match kind.strip_prefix("Str(\"") {
                Some(rest) => ("Str", Some(rest.trim_end_matches("\")").to_string())),
                None => (kind, None),
            };
            rows.push(Stub {
                name: name.trim().to_string(),
                version: version.clone().expect("a row inside a version node"),
                kind: kind.to_string(),
                text,
            });
        }
    }
    (why, rows)
}

/// Compiles `source` with gcc into `dir/name`, with `extra` arguments after the source.
pub fn gcc(dir: &Path, name: &str, source: &str, extra: &[&std::ffi::OsStr]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).expect("write the C source");
    let exe = dir.join(name);
    let out = run(Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(extra));
    assert!(out.status.success(), "gcc {name}.c: {}", text(&out.stderr));
    exe
}

fn have_gcc(test: &str) -> bool {
    let ok = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    have(test, ok, "gcc")
}

/// A scratch directory for one test.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xroce-standin-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make a scratch directory");
    dir
}

// ---- the checks ----

/// The stand-in's soname is the real one, and it defines every version node the real library
/// defines (or, without the real library, at least the nodes its table uses).
pub fn check_soname_and_nodes(lib: &Lib) {
    let file = built().path(lib);
    assert_eq!(
        soname(&file).as_deref(),
        Some(lib.soname),
        "{}",
        file.display()
    );
    let ours = version_definitions(&file);
    let (_, rows) = stub_table(lib.source);
    for row in &rows {
        assert!(
            ours.contains(&row.version),
            "node {} defined: {ours:?}",
            row.version
        );
    }
    let real = Path::new(SYSTEM_LIBDIR).join(lib.soname);
    if have(
        "soname_and_version_nodes",
        real.exists(),
        &format!("the real {}", real.display()),
    ) {
        let theirs = version_definitions(&real);
        assert!(!theirs.is_empty());
        assert_eq!(
            ours,
            theirs,
            "version nodes of {} and {}",
            file.display(),
            real.display()
        );
    }
}

/// The imports of `files` from `lib` (by version node prefix), each with the files that
/// import it.
fn imports(files: &[PathBuf], lib: &Lib) -> BTreeMap<(String, String), Vec<String>> {
    let mut wanted: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for f in files {
        for s in dynamic_functions(f, false) {
            if s.version.starts_with(lib.node_prefix) {
                let who = f.file_name().unwrap().to_string_lossy().into_owned();
                wanted.entry((s.name, s.version)).or_default().push(who);
            }
        }
    }
    wanted
}

/// Every `symbol@version` that perftest's binaries and pyverbs' modules import from the
/// library is exported by the stand-in under that version. `at_least` is how many distinct
/// imports there must be (so an empty parse cannot pass).
pub fn check_exports_cover_imports(lib: &Lib, perftest_at_least: usize, pyverbs_at_least: usize) {
    let test = "exports_what_perftest_and_pyverbs_import";
    let bins = perftest_binaries();
    let mods = pyverbs_modules();
    let ok_bins = have(
        test,
        !bins.is_empty(),
        "perftest (/usr/bin/ib_*_bw, ib_*_lat)",
    );
    let ok_mods = have(
        test,
        !mods.is_empty(),
        &format!("python3-pyverbs ({PYVERBS})"),
    );
    let exported: BTreeSet<(String, String)> = dynamic_functions(&built().path(lib), true)
        .into_iter()
        .map(|s| (s.name, s.version))
        .collect();
    for (ok, files, at_least, what) in [
        (ok_bins, &bins, perftest_at_least, "perftest"),
        (ok_mods, &mods, pyverbs_at_least, "pyverbs"),
    ] {
        if !ok {
            continue;
        }
        let wanted = imports(files, lib);
        assert!(
            wanted.len() >= at_least,
            "{what} imports {} symbols from {}, expected at least {at_least}: {wanted:?}",
            wanted.len(),
            lib.soname
        );
        let missing: Vec<String> = wanted
            .iter()
            .filter(|(k, _)| !exported.contains(*k))
            .map(|((n, v), who)| format!("{n}@{v} (imported by {})", who.join(", ")))
            .collect();
        assert!(missing.is_empty(), "{} lacks: {missing:#?}", lib.soname);
        println!(
            "{what}: {} imports from {}, all exported",
            wanted.len(),
            lib.soname
        );
    }
}

/// The stand-in exports exactly the functions of the real library, each under the same
/// version and with the same default-ness, plus only its private `xroce_*` names.
pub fn check_exports_match_real_library(lib: &Lib) {
    let real = Path::new(SYSTEM_LIBDIR).join(lib.soname);
    if !have(
        "exports_what_the_real_library_exports",
        real.exists(),
        &format!("the real {}", real.display()),
    ) {
        return;
    }
    let ours: BTreeSet<Sym> = dynamic_functions(&built().path(lib), true)
        .into_iter()
        .filter(|s| !s.name.starts_with("xroce_"))
        .collect();
    let theirs: BTreeSet<Sym> = dynamic_functions(&real, true).into_iter().collect();
    assert!(theirs.len() >= 6, "parsed the real library: {theirs:?}");
    let lacking: Vec<&Sym> = theirs.difference(&ours).collect();
    let extra: Vec<&Sym> = ours.difference(&theirs).collect();
    assert!(lacking.is_empty(), "{} lacks {lacking:#?}", lib.soname);
    assert!(
        extra.is_empty(),
        "{} has more than the real one: {extra:#?}",
        lib.soname
    );
}

/// The C return type of each function `headers` declare, from gcc's `-aux-info` (the
/// prototypes as gcc sees them), e.g. `mlx5dv_is_supported` -> `_Bool`.
fn return_types(dir: &Path, headers: &[&str]) -> BTreeMap<String, String> {
    let src: String = headers
        .iter()
        .map(|h| format!("#include <{h}>\n"))
        .collect();
    std::fs::write(dir.join("h.c"), src).unwrap();
    let out = run(Command::new("gcc")
        .arg("-aux-info")
        .arg(dir.join("aux.txt"))
        .args(["-c", "-o"])
        .arg(dir.join("h.o"))
        .arg(dir.join("h.c")));
    assert!(out.status.success(), "gcc -aux-info: {}", text(&out.stderr));
    let aux = std::fs::read_to_string(dir.join("aux.txt")).unwrap();
    let mut types = BTreeMap::new();
    for line in aux.lines() {
        // /* /usr/include/infiniband/efadv.h:56:NC */ extern int efadv_query_device (...);
        let Some(decl) = line.split("*/ ").nth(1) else {
            continue;
        };
        let decl = decl.trim_start_matches("extern ");
        let Some(head) = decl.split(" (").next() else {
            continue;
        };
        let name_at = head
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = head.split_at(name_at);
        types.insert(name.to_string(), ty.trim().to_string());
    }
    types
}

/// Whether a stub kind fits a C return type.
fn kind_fits(kind: &str, ty: &str) -> bool {
    match kind {
        "Null" => ty.ends_with('*'),
        "Str" => ty.ends_with('*') && ty.contains("char"),
        "Errno" | "NegErrno" | "MinusOne" | "NotThisVendorErrno" => ty == "int",
        "SsizeMinusOne" => matches!(ty, "ssize_t" | "size_t" | "off_t"),
        "False" | "NotThisVendorFalse" => ty == "_Bool" || ty == "bool",
        "Zero16" => matches!(ty, "__be16" | "uint16_t" | "__u16"),
        "Void" => ty == "void",
        _ => false,
    }
}

/// Every row of the table names a function the headers declare, and its kind fits the
/// declared return type (a pointer is `Null`, an `int` one of the int kinds, ...).
pub fn check_kinds_match_headers(lib: &Lib) {
    let test = "kinds_match_the_headers";
    let present = lib
        .headers
        .iter()
        .all(|h| Path::new("/usr/include").join(h).exists());
    if !have(test, present, &format!("the headers {:?}", lib.headers)) || !have_gcc(test) {
        return;
    }
    let dir = scratch(&format!("{}-headers", lib.node_prefix));
    let types = return_types(&dir, lib.headers);
    let (_, rows) = stub_table(lib.source);
    let wrong: Vec<String> = rows
        .iter()
        .filter_map(|r| match types.get(&r.name) {
            None => Some(format!("{}: not declared in {:?}", r.name, lib.headers)),
            Some(ty) if !kind_fits(&r.kind, ty) => {
                Some(format!("{}: {} does not fit `{ty}`", r.name, r.kind))
            }
            Some(_) => None,
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A C program `dlopen`s the stand-in and calls every function of the table twice (through
/// `dlvsym` with the row's version, with no arguments: the stubs read none). Each call sets
/// errno to EOPNOTSUPP and returns its kind's value; stderr has the function's line once.
pub fn check_every_stub_fails(lib: &Lib) {
    let test = "every_stub_fails_as_its_table_says";
    if !have_gcc(test) {
        return;
    }
    let (why, rows) = stub_table(lib.source);
    let dir = scratch(&format!("{}-calls", lib.node_prefix));
    let exe = gcc(&dir, "call_all", CALL_ALL, &["-ldl".as_ref()]);
    let mut cmd = Command::new(&exe);
    cmd.arg(built().path(lib));
    for r in &rows {
        cmd.args([&r.name, &r.version, &r.kind]);
    }
    let out = run(&mut cmd);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "call_all: {stdout}\n{stderr}");
    let mut results: BTreeMap<String, Vec<(i64, i32, Option<String>)>> = BTreeMap::new();
    for line in stdout.lines() {
        let f: Vec<&str> = line.splitn(4, ' ').collect();
        assert!(f.len() >= 3, "call_all line {line:?}");
        results.entry(f[0].to_string()).or_default().push((
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f.get(3).map(|s| s.to_string()),
        ));
    }
    const EOPNOTSUPP: i32 = 95;
    for r in &rows {
        let calls = results.get(&r.name).unwrap_or_else(|| {
            panic!(
                "{}@{} was not found or not called: {stdout}",
                r.name, r.version
            )
        });
        assert_eq!(calls.len(), 2, "{}: {calls:?}", r.name);
        for &(ret, errno, ref s) in calls {
            assert_eq!(errno, EOPNOTSUPP, "{}: errno", r.name);
            let ok = match r.kind.as_str() {
                "Null" => ret == 0,
                "Errno" => ret as i32 == EOPNOTSUPP,
                "NegErrno" => ret as i32 == -EOPNOTSUPP,
                "MinusOne" => ret as i32 == -1,
                "SsizeMinusOne" => ret == -1,
                "False" | "NotThisVendorFalse" => ret as u8 == 0,
                "NotThisVendorErrno" => ret as i32 == EOPNOTSUPP,
                "Zero16" => ret as u16 == 0,
                "Void" => true,
                "Str" => ret != 0 && s.as_deref() == r.text.as_deref(),
                other => panic!("unknown kind {other}"),
            };
            assert!(ok, "{} ({}) returned {ret:#x} {s:?}", r.name, r.kind);
        }
        // A vendor query answers "not mine" silently, as rdma-core's library does for
        // another vendor's device; every other stub says once that it was called.
        let silent = r.kind.starts_with("NotThisVendor");
        let line = format!("xroce: {} is not supported: {why}", r.name);
        let times = stderr.lines().filter(|l| *l == line).count();
        assert_eq!(
            times,
            usize::from(!silent),
            "{line:?} on stderr {} (two calls): {stderr}",
            if silent { "never" } else { "once" }
        );
    }
    let loud = rows
        .iter()
        .filter(|r| !r.kind.starts_with("NotThisVendor"))
        .count();
    assert_eq!(
        stderr.lines().count(),
        loud,
        "nothing else on stderr: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The C side of [`check_every_stub_fails`]: argv is the library, then name, version, kind
/// triples; prints `name return errno [string]` per call.
const CALL_ALL: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 2;
	}
	for (int i = 2; i + 2 < argc; i += 3) {
		long (*fn)(void) = (long (*)(void))dlvsym(lib, argv[i], argv[i + 1]);
		if (!fn)
			continue;
		for (int call = 0; call < 2; call++) {
			errno = 0;
			long ret = fn();
			int err = errno;
			if (strcmp(argv[i + 2], "Str") == 0 && ret)
				printf("%s %ld %d %s\n", argv[i], ret, err, (const char *)ret);
			else
				printf("%s %ld %d\n", argv[i], ret, err);
		}
	}
	return 0;
}
"#;

/// A C program linked against the stand-in (so the link editor records the soname and the
/// symbol versions, as it did for perftest) runs with the links directory first on
/// `LD_LIBRARY_PATH`; it prints what it checks and exits 0 only if every check held. The
/// stand-in's lines are on stderr, once per function.
pub fn check_linked_program(lib: &Lib, source: &str, expect_stderr: &[&str]) {
    let test = "c_program_linked_against_it";
    if !have_gcc(test) {
        return;
    }
    let b = built();
    let dir = scratch(&format!("{}-linked", lib.node_prefix));
    let link = b.links.join(lib.soname);
    let exe = gcc(&dir, "linked", source, &[link.as_os_str()]);
    assert!(needs(&exe, lib.soname), "the program needs {}", lib.soname);
    let out = run(Command::new(&exe).env("LD_LIBRARY_PATH", &b.links));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
    for line in expect_stderr {
        assert_eq!(
            stderr.lines().filter(|l| l == line).count(),
            1,
            "{line:?} once on stderr: {stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `LD_DEBUG=files` output says the loader ran the initialisers of `file`: it was loaded.
fn loaded(ld_debug: &str, file: &Path) -> bool {
    let want = format!("calling init: {}", file.display());
    ld_debug.lines().any(|l| l.trim_end().ends_with(&want))
}

/// Every perftest binary that needs the library, run as `<bin> --help` with the links
/// directory first on `LD_LIBRARY_PATH`, loads (BIND_NOW: every import resolved), prints its
/// usage and exits as it does with rdma-core's libraries; `LD_DEBUG=files` shows the loader
/// took the stand-in. The real libibverbs stays: it loads fine and is not used by `--help`.
pub fn check_perftest_loads(lib: &Lib) {
    let test = "perftest_loads_the_standin";
    let bins: Vec<PathBuf> = perftest_binaries()
        .into_iter()
        .filter(|b| needs(b, lib.soname))
        .collect();
    if !have(
        test,
        !bins.is_empty(),
        &format!("perftest binaries that need {}", lib.soname),
    ) {
        return;
    }
    let b = built();
    for bin in &bins {
        let reference = run(Command::new(bin).arg("--help"));
        let out = run(Command::new(bin)
            .arg("--help")
            .env("LD_LIBRARY_PATH", &b.links)
            .env("LD_DEBUG", "files"));
        let stdout = text(&out.stdout);
        let stderr = text(&out.stderr);
        let what = format!("{} --help", bin.display());
        assert!(
            out.status.code().is_some(),
            "{what}: killed: {:?}",
            out.status
        );
        // perftest's `--help` exit code (1, in 4.5) with rdma-core's libraries, if they load.
        let reference_loads =
            !text(&reference.stderr).contains("error while loading shared libraries");
        if reference_loads {
            assert_eq!(
                out.status.code(),
                reference.status.code(),
                "{what}: exit code, stand-ins vs rdma-core"
            );
        } else {
            assert_ne!(out.status.code(), Some(127), "{what}: the loader gave up");
        }
        assert!(stdout.contains("Usage:"), "{what}: {stdout}");
        for bad in [
            "symbol lookup error",
            "not found",
            "cannot open shared object",
        ] {
            assert!(!stderr.contains(bad), "{what}: {bad}: {stderr}");
        }
        assert!(
            loaded(&stderr, &b.links.join(lib.soname)),
            "{what} loaded the stand-in {}: {stderr}",
            lib.soname
        );
        assert!(
            !stderr.contains("is not supported"),
            "{what}: --help calls no stub: {stderr}"
        );
    }
    println!(
        "{} perftest binaries load {} from {}",
        bins.len(),
        lib.soname,
        b.links.display()
    );
}

/// Every pyverbs module that needs the library imports (Python dlopens it with RTLD_NOW, and
/// the modules are BIND_NOW) with the links directory first on `LD_LIBRARY_PATH`, and the
/// loader took the stand-in.
pub fn check_pyverbs_imports(lib: &Lib) {
    let test = "pyverbs_modules_import";
    let mods: Vec<String> = pyverbs_modules()
        .iter()
        .filter(|m| needs(m, lib.soname))
        .map(|m| module_name(m))
        .collect();
    let python = Path::new(PYTHON).exists();
    if !have(
        test,
        !mods.is_empty() && python,
        &format!("python3-pyverbs modules that need {}", lib.soname),
    ) {
        return;
    }
    let b = built();
    let script = format!(
        "import {}\nprint('imported', {})",
        mods.join(", "),
        mods.len()
    );
    let out = run(Command::new(PYTHON)
        .args(["-c", &script])
        .env("LD_LIBRARY_PATH", &b.links)
        .env("LD_DEBUG", "files"));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "import {mods:?}: {stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("imported {}", mods.len())),
        "{stdout}"
    );
    assert!(
        loaded(&stderr, &b.links.join(lib.soname)),
        "python loaded the stand-in {}: {stderr}",
        lib.soname
    );
    println!("pyverbs modules importing with {}: {mods:?}", lib.soname);
}

/// The checks every stand-in gets, as tests of the crate that calls it: `lib` is its [`Lib`],
/// `perftest`/`pyverbs` the least number of symbols each imports from it, `linked` the C
/// program of `check_linked_program` and `said` the lines it must print.
#[macro_export]
macro_rules! standin_tests {
    ($lib:expr, imports: $perftest:expr, $pyverbs:expr, linked: $linked:expr, said: $said:expr $(,)?) => {
        #[test]
        fn soname_and_version_nodes() {
            support::check_soname_and_nodes(&$lib);
        }

        #[test]
        fn exports_what_perftest_and_pyverbs_import() {
            support::check_exports_cover_imports(&$lib, $perftest, $pyverbs);
        }

        #[test]
        fn exports_what_the_real_library_exports() {
            support::check_exports_match_real_library(&$lib);
        }

        #[test]
        fn kinds_match_the_headers() {
            support::check_kinds_match_headers(&$lib);
        }

        #[test]
        fn every_stub_fails_as_its_table_says() {
            support::check_every_stub_fails(&$lib);
        }

        #[test]
        fn c_program_linked_against_it() {
            support::check_linked_program(&$lib, $linked, $said);
        }

        #[test]
        fn perftest_loads_the_standin() {
            support::check_perftest_loads(&$lib);
        }

        #[test]
        fn pyverbs_modules_import() {
            support::check_pyverbs_imports(&$lib);
        }
    };
}
