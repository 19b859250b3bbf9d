//! When a device's progress thread stops (its driver fails, or it panics), every caller that
//! waits on it learns so with `DeviceStopped` and the cause, within a bound: a caller blocked
//! in `get_cq_event(None)`, one in `Device::get_async_event(None)`, one in a `Cq::wait` loop,
//! and every later post or poll.
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xroce::driver::mem::MemDriver;
use xroce::driver::{Driver, DriverError, DriverInfo, RxMeta};
use xroce::verbs::*;

/// How long a blocked caller may take to learn that the device stopped.
const BOUND: Duration = Duration::from_secs(5);

/// A driver that fails (or panics) once it has received `frames_left` frames.
struct FailAfter {
    inner: MemDriver,
    frames_left: usize,
    panic: bool,
}

impl Driver for FailAfter {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        self.inner.send(frame)
    }
    fn flush(&mut self) -> Result<(), DriverError> {
        self.inner.flush()
    }
    fn recv(
        &mut self,
        max: usize,
        on_frame: &mut dyn FnMut(&[u8], RxMeta),
    ) -> Result<usize, DriverError> {
        if self.frames_left == 0 {
            if self.panic {
                panic!("injected fault in the receive path");
            }
            return Err(DriverError::Config {
                reason: "injected receive failure".into(),
            });
        }
        let n = self.inner.recv(max.min(self.frames_left), on_frame)?;
        self.frames_left -= n;
        Ok(n)
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.wait_fd()
    }
    fn info(&self) -> DriverInfo {
        self.inner.info()
    }
}

struct Side {
    dev: Device,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    channel: CompletionChannel,
}

fn side(dev: Device) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let channel = dev.create_comp_channel().unwrap();
    let cq = dev.create_cq(64, Some(&channel)).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    let mr = pd
        .reg_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    Side {
        dev,
        _pd: pd,
        cq,
        qp,
        mr,
        channel,
    }
}

/// Device `a` (whose driver fails after `frames` received frames) connected to `b`.
fn pair(frames: usize, panic: bool) -> (Side, Side, MemLink) {
    let macs = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
    let ips: [IpAddr; 2] = [[198, 18, 0, 1].into(), [198, 18, 0, 2].into()];
    let (da, db, link) =
        MemDriver::pair(macs[0].0, macs[1].0, &mem_link_config(1500, 0.0, 1)).unwrap();
    let identity = |i: usize| DeviceIdentity {
        name: format!("avemit{i}"),
        mac: macs[i],
        mtu: 1500,
        addrs: vec![ips[i]],
    };
    let failing = FailAfter {
        inner: da,
        frames_left: frames,
        panic,
    };
    let dev_a =
        Device::with_driver(Box::new(failing), identity(0), DeviceConfig::default()).unwrap();
    let dev_b = Device::with_driver(Box::new(db), identity(1), DeviceConfig::default()).unwrap();
    dev_a.add_static_neighbour(ips[1], macs[1]);
    dev_b.add_static_neighbour(ips[0], macs[0]);
    let (a, b) = (side(dev_a), side(dev_b));
    for (me, peer) in [(&a, &b), (&b, &a)] {
        let g = me.dev.ipv4_gid_index().unwrap();
        let pg = peer.dev.ipv4_gid_index().unwrap();
        me.qp
            .connect_rc(
                &RcPeer {
                    qpn: peer.qp.qp_num(),
                    psn: 0,
                    gid: peer.dev.query_gid(pg).unwrap(),
                },
                &RcOptions {
                    sgid_index: g as u8,
                    ..RcOptions::default()
                },
            )
            .unwrap();
    }
    (a, b, link)
}

/// `b` writes into `a` until `a` has received more than `frames` frames.
fn kill_a_with_traffic(a: &Side, b: &Side, frames: usize) {
    for i in 0..=frames as u64 {
        b.qp.post_send(&SendWr {
            wr_id: i,
            op: WrOp::Write {
                remote_addr: a.mr.addr(),
                rkey: a.mr.rkey(),
            },
            sg_list: vec![b.mr.sge(0, 16).unwrap()],
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .unwrap();
    }
}

fn assert_stopped(err: &VerbsError, cause: &str) {
    match err {
        VerbsError::DeviceStopped { device, reason } => {
            assert_eq!(device, "xroce_avemit0");
            assert!(reason.contains(cause), "{reason}");
        }
        other => panic!("expected DeviceStopped, got {other}"),
    }
}

fn blocked_callers_learn_the_cause(panic: bool, cause: &str) {
    let (a, b, _link) = pair(2, panic);
    a.cq.req_notify(false).unwrap();
    // One caller blocked in get_cq_event with no timeout, one in a long Cq::wait.
    let (tx, rx) = mpsc::channel();
    let channel = a.channel.clone();
    let tx_event = tx.clone();
    std::thread::spawn(move || {
        let _ = tx_event.send(("get_cq_event", channel.get_cq_event(None).map(|_| ())));
    });
    let dev = a.dev.clone();
    let tx_async = tx.clone();
    std::thread::spawn(move || {
        let _ = tx_async.send(("get_async_event", dev.get_async_event(None).map(|_| ())));
    });
    let cq = a.cq.clone();
    std::thread::spawn(move || {
        let _ = tx.send(("Cq::wait", cq.wait(1, Duration::from_secs(600)).map(|_| ())));
    });
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    kill_a_with_traffic(&a, &b, 2);
    for _ in 0..3 {
        let (who, result) = rx
            .recv_timeout(BOUND)
            .unwrap_or_else(|_| panic!("a blocked caller still waits {BOUND:?} after the stop"));
        let err = result.expect_err(who);
        assert_stopped(&err, cause);
    }
    assert!(start.elapsed() < BOUND);
    assert!(a.dev.stopped_reason().unwrap().contains(cause));
    // Every later call says so too, instead of queueing work nobody will do.
    let err =
        a.qp.post_send(&SendWr {
            wr_id: 99,
            op: WrOp::Send,
            sg_list: vec![],
            flags: SendFlags::SIGNALED,
            ud: None,
        })
        .unwrap_err();
    assert_stopped(&err, cause);
    assert_stopped(&a.cq.poll_one().unwrap_err(), cause);
    assert_stopped(
        &a.channel
            .get_cq_event(Some(Duration::from_secs(60)))
            .unwrap_err(),
        cause,
    );
    assert_stopped(
        &a.dev
            .get_async_event(Some(Duration::from_secs(60)))
            .unwrap_err(),
        cause,
    );
    // A channel created after the stop (with no CQ at all) does not wait either.
    let late = a.dev.create_comp_channel().unwrap();
    assert_stopped(&late.get_cq_event(None).unwrap_err(), cause);
    // The peer is unaffected.
    assert_eq!(b.dev.stopped_reason(), None);
}

#[test]
fn a_driver_error_wakes_callers_blocked_on_the_device() {
    blocked_callers_learn_the_cause(false, "injected receive failure");
}

#[test]
fn a_panic_in_the_progress_thread_wakes_callers_blocked_on_the_device() {
    blocked_callers_learn_the_cause(true, "panicked: injected fault in the receive path");
}
