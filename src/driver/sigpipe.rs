//! SIGPIPE's default action for the `xroce` command, so that writing to a closed pipe
//! (`xroce sim --trace | head`) ends the process quietly, as it ends `ibv_devinfo` or
//! `ib_write_bw`. Rust's runtime ignores SIGPIPE before `main`, which turns every such write
//! into an `EPIPE` error and every `println!` into a panic.
//!
//! Sockets keep their errors: std's `TcpStream` and `UnixDatagram` send with `MSG_NOSIGNAL`,
//! so a peer that closed its TCP connection still surfaces as `BrokenPipe` to the tools.

/// Restores the default action of SIGPIPE (terminate, without a core dump or a message).
/// Call it first thing in `main`, before any thread exists.
///
/// Through libc: rustix has no safe call that sets a signal's disposition, and std's
/// `-Zon-broken-pipe` is not stable.
pub fn restore_default_sigpipe() {
    // Safety: `signal` with `SIG_DFL` installs no handler code, only the kernel's default
    // disposition; it touches no memory of ours and is called before the program spawns
    // threads, so no other thread is changing signal dispositions at the same time.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
