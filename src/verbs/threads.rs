//! Threads the library starts inside an application's process.

use std::io;
use std::thread::JoinHandle;

/// Starts `body` on a thread named `name` and returns once that thread is running: its
/// thread-local storage set up and its first allocation made.
///
/// Why wait: in a library loaded with `dlopen` (libibverbs under Open MPI's and libfabric's
/// plugins) a new thread's first touch of thread-local storage allocates, and glibc's first
/// allocation on a new thread makes its arena with `mmap` and `munmap`. Open MPI's memory
/// hooks and libfabric's memhooks monitor rewrite the first bytes of libc's `munmap` in place,
/// from the program's own thread, a few calls after it opened the device; a thread of ours
/// still starting then runs half-written code and dies (SIGSEGV in `__munmap`). Finishing
/// the start while the program's thread waits in our call keeps ours out of that window.
pub(crate) fn spawn_settled<F, T>(name: String, body: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel::<()>(1);
    let handle = std::thread::Builder::new().name(name).spawn(move || {
        // The channel's send touches thread-local state; the box is the first allocation.
        let first = std::hint::black_box(Box::new(0u64));
        drop(first);
        let _ = started_tx.send(());
        body()
    })?;
    // An error means the thread ended before sending, which only a panic can do: its join
    // handle tells the owner.
    let _ = started_rx.recv();
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_after_the_thread_started_and_runs_its_body() {
        let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = started.clone();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let handle = spawn_settled("xroce-settled".into(), move || {
            go_rx.recv().unwrap();
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::current().name().map(str::to_string)
        })
        .unwrap();
        // The body has not run yet (it waits for `go`), yet the thread has started: it has
        // named itself, which a new thread does first thing.
        assert!(!started.load(std::sync::atomic::Ordering::SeqCst));
        let names: Vec<String> = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .collect();
        assert!(
            names.iter().any(|n| n.trim() == "xroce-settled"),
            "{names:?}"
        );
        go_tx.send(()).unwrap();
        assert_eq!(handle.join().unwrap().as_deref(), Some("xroce-settled"));
        assert!(started.load(std::sync::atomic::Ordering::SeqCst));
    }
}
