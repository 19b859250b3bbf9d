//! The device's asynchronous events (`ibv_get_async_event`): a queue with a pollable fd,
//! fed by the engine's events (QP fatal, CQ error, SQ drained, and whatever else the engine
//! raises: the queue is generic over [`Event`]) and by the port's link watcher (port
//! active, port error).
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::driver::wait_readable;
use crate::engine::Event;
use crate::netdev::{LinkChange, LinkWatch};

use super::{drain, lock, Runtime};
use crate::verbs::error::{Result, VerbsError};

/// The only port of a device.
pub const PORT: u8 = 1;

/// Events waiting for the application, and a socket pair whose read end is readable while
/// any wait (one byte written per event, drained when the queue empties).
#[derive(Debug)]
pub(crate) struct AsyncQueue {
    events: Mutex<VecDeque<Event>>,
    rx: UnixDatagram,
    tx: UnixDatagram,
}

impl AsyncQueue {
    pub fn new() -> Result<AsyncQueue> {
        let (rx, tx) = UnixDatagram::pair().map_err(|source| VerbsError::Io {
            context: "creating the asynchronous event fd",
            source,
        })?;
        // Only the write end: the read end is the fd programs see, blocking until they say
        // otherwise (rdma-core's channel fds are).
        tx.set_nonblocking(true).map_err(|source| VerbsError::Io {
            context: "making the asynchronous event fd non-blocking",
            source,
        })?;
        Ok(AsyncQueue {
            events: Mutex::new(VecDeque::new()),
            rx,
            tx,
        })
    }

    pub fn push(&self, event: Event) {
        lock(&self.events).push_back(event);
        // A full socket buffer is readable already.
        let _ = self.tx.send(&[1]);
    }

    /// Makes the fd readable without an event: waiters look again (the device stopped).
    pub fn wake(&self) {
        let _ = self.tx.send(&[1]);
    }

    pub fn pop(&self) -> Option<Event> {
        let mut events = lock(&self.events);
        let event = events.pop_front();
        if events.is_empty() {
            // Under the lock: a push after this drain writes a new byte.
            drain(&self.rx);
        }
        event
    }

    /// The read end (readable while an event waits).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.rx.as_fd()
    }

    /// Blocks until the fd is readable or `timeout` passes.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        wait_readable(&[self.rx.as_fd()], timeout).map_err(|source| VerbsError::Io {
            context: "waiting for an asynchronous event",
            source,
        })?;
        Ok(())
    }
}

/// The port's link watcher thread: turns the interface's link notifications into
/// [`Event::PortActive`] and [`Event::PortError`] on changes of whether it can carry frames.
/// `stop` (a byte written to its peer) ends it.
pub(crate) fn watch_link(
    shared: Arc<Runtime>,
    mut watch: LinkWatch,
    stop: UnixDatagram,
    mut active: bool,
) {
    while !shared.stop.load(Ordering::SeqCst) {
        if let Err(e) = wait_readable(&[watch.fd(), stop.as_fd()], None) {
            tracing::warn!(device = %shared.name, error = %e, "link watcher stops");
            return;
        }
        let changes = match watch.read() {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!(device = %shared.name, error = %e, "link watcher stops");
                return;
            }
        };
        for change in changes {
            let now = match change {
                LinkChange::Active(now) => now,
                LinkChange::Removed => false,
                // Missed notifications: ask for the state itself.
                LinkChange::Lost => crate::netdev::query(&shared.netdev.name)
                    .map(|info| info.is_active())
                    .unwrap_or(false),
            };
            if now != active {
                active = now;
                tracing::info!(device = %shared.name, active, "port state changed");
                shared.async_events.push(if active {
                    Event::PortActive(PORT)
                } else {
                    Event::PortError(PORT)
                });
            }
        }
    }
}
