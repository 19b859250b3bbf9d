//! Versioned C symbols from a Rust `cdylib`, for xroce's drop-in C libraries.
//!
//! glibc's loader checks every `symbol@VERSION` a program imports: Debian's verbs programs
//! ask for `ibv_get_device_list@IBVERBS_1.1`, `ibv_query_gid_type@IBVERBS_PRIVATE_34`, and
//! refuse to start if a version node is missing. rustc hands the linker its own anonymous
//! version script, which cannot be combined with one that lists symbols, so the recipe is:
//! - the library's version script declares the version nodes *empty*
//!   ([`link_versioned`], from `build.rs`);
//! - each function is exported under a private name, `xroce_<name>`, and an assembler
//!   `.symver` directive makes `<name>@@VERSION` (the default version) an alias of it
//!   ([`c_export!`]); [`c_alias!`] adds further, non-default versions of the same symbol.
//!
//! Needs a linker that honours `.symver` with rustc's script: rust-lld, the default for
//! x86_64 Linux since Rust 1.90 (GNU ld refuses the combination).

use std::fmt::Write as _;
use std::path::PathBuf;

pub mod stub;

/// Exports `fn name` as the C symbol `name@@VERSION` (and, under its private name,
/// `xroce_name`).
///
/// ```ignore
/// c_export! { "IBVERBS_1.1";
///     /// Returns the devices.
///     pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device { .. }
/// }
/// ```
#[macro_export]
macro_rules! c_export {
    ($version:literal; $(
        $(#[$meta:meta])*
        pub unsafe extern "C" fn $name:ident ( $($arg:ident : $argty:ty),* $(,)? ) $(-> $ret:ty)? $body:block
    )*) => {$(
        $(#[$meta])*
        #[export_name = concat!("xroce_", stringify!($name))]
        pub unsafe extern "C" fn $name($($arg: $argty),*) $(-> $ret)? $body

        ::core::arch::global_asm!(concat!(
            ".symver xroce_", stringify!($name), ", ", stringify!($name), "@@", $version
        ));
    )*};
}

/// Gives an exported symbol one more, non-default version: `c_alias!(name, "VERSION")`
/// makes `name@VERSION` resolve to the same function (for programs linked against an
/// older or newer rdma-core that recorded another version of it).
#[macro_export]
macro_rules! c_alias {
    ($name:ident, $version:literal) => {
        ::core::arch::global_asm!(concat!(
            ".symver xroce_",
            stringify!($name),
            ", ",
            stringify!($name),
            "@",
            $version
        ));
    };
}

/// Exports a table of stubs: functions a program must find at load time but that xroce does
/// not provide. Each one, when called, says once on stderr `xroce: <name> is not supported:
/// <why>`, sets `errno` to `EOPNOTSUPP` and returns the failure value of its kind:
///
/// | kind | C return type | value |
/// |---|---|---|
/// | `Null` | a pointer | `NULL` |
/// | `Errno` | `int`, "0 or the value of errno" | `EOPNOTSUPP` |
/// | `NegErrno` | `int`, "-errno" | `-EOPNOTSUPP` |
/// | `MinusOne` | `int`, "-1 and errno" | `-1` |
/// | `SsizeMinusOne` | `ssize_t`, `size_t`, `off_t` | `-1` |
/// | `False` | `bool` | `false` |
/// | `NotThisVendorFalse` | `bool`, silently (a vendor query: "not mine") | `false` |
/// | `NotThisVendorErrno` | `int`, silently (a vendor query: "not mine") | `EOPNOTSUPP` |
/// | `Zero16` | `uint16_t` | `0` |
/// | `Void` | `void` | |
/// | `Str("text")` | `const char *` that is never NULL | the static string |
///
/// ```ignore
/// c_stubs! { why: "xroce's devices are not mlx5 devices";
///     "MLX5_1.0" { mlx5dv_query_device: Errno }
///     "MLX5_1.8" { mlx5dv_is_supported: False }
/// }
/// ```
///
/// Every stub is exported through [`c_export!`] under its table's version. A stub takes no
/// parameters: under the C calling conventions of the targets xroce builds for (x86_64 System
/// V, AArch64), the caller owns argument registers and stack, so a callee that ignores its
/// arguments is compatible with any parameter list.
#[macro_export]
macro_rules! c_stubs {
    (why: $why:expr; $( $version:literal { $( $name:ident : $kind:ident $( ( $text:literal ) )? ),* $(,)? } )*) => {
        $( $( $crate::__c_stub!($version, $why, $name, $kind $( ( $text ) )?); )* )*
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __c_stub {
    ($version:literal, $why:expr, $name:ident, Str ( $text:literal )) => {
        $crate::c_export! { $version;
            #[doc = concat!("Stub: reports `", stringify!($name), "` unsupported, returns \"", $text, "\".")]
            pub unsafe extern "C" fn $name() -> *const ::core::ffi::c_void {
                static SAID: ::core::sync::atomic::AtomicBool = ::core::sync::atomic::AtomicBool::new(false);
                $crate::stub::unsupported(&SAID, stringify!($name), $why);
                $crate::stub::static_str(concat!($text, "\0").as_bytes())
            }
        }
    };
    ($version:literal, $why:expr, $name:ident, $kind:ident) => {
        $crate::c_export! { $version;
            #[doc = concat!("Stub: reports `", stringify!($name), "` unsupported (", stringify!($kind), ").")]
            #[allow(clippy::unused_unit)]
            pub unsafe extern "C" fn $name() -> $crate::__stub_kind!(ty $kind) {
                static SAID: ::core::sync::atomic::AtomicBool = ::core::sync::atomic::AtomicBool::new(false);
                if $crate::__stub_says!($kind) {
                    $crate::stub::unsupported(&SAID, stringify!($name), $why);
                } else {
                    $crate::stub::quietly_unsupported();
                }
                $crate::__stub_kind!(val $kind)
            }
        }
    };
}

/// From a `build.rs`: links the crate's `cdylib` with soname `soname` and a version script
/// declaring `nodes` (each empty; [`c_export!`] puts the symbols in them), in that order.
pub fn link_versioned(soname: &str, nodes: &[&str]) {
    let mut script = String::new();
    for node in nodes {
        let _ = writeln!(script, "{node} {{ }};");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR is set for build scripts"));
    let path = out.join(format!("{soname}.map"));
    std::fs::write(&path, script).expect("write the version script into OUT_DIR");
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        path.display()
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}
