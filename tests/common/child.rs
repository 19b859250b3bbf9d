//! Child processes of the tests: waiting with a deadline, stopping, what they printed.
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// Waits for `child` until `deadline`; past it, kills the child and fails the test with
/// what it printed.
pub fn wait(mut child: Child, deadline: Instant, what: &str) -> Output {
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "{what} did not finish in time\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Ends a child that overran its deadline: SIGTERM first (`xroce run` passes it on to the
/// program, which SIGKILL could not), then SIGKILL.
pub fn stop(child: &mut Child) {
    let pid = rustix::process::Pid::from_child(child);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
}

/// Waits for `child` until `deadline`; `Err` (with what it printed) if it had to be
/// [`stop`]ped.
pub fn wait_or_stop(mut child: Child, deadline: Instant) -> Result<Output, Output> {
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return Ok(child.wait_with_output().expect("output")),
            None if Instant::now() > deadline => {
                stop(&mut child);
                return Err(child.wait_with_output().expect("output"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// What a child printed: its stdout, then its stderr.
pub fn printed(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
