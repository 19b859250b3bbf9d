//! A UD send whose frame the driver refuses (here: larger than the driver takes) completes
//! with an error, not Success, and the refusal is counted: no success for a datagram that
//! never left.
use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use xroce::driver::mem::MemDriver;
use xroce::driver::{Driver, DriverError, DriverInfo, RxMeta};
use xroce::verbs::*;

/// A driver that refuses frames longer than `max`.
struct Refusing {
    inner: MemDriver,
    max: usize,
}

impl Driver for Refusing {
    fn send(&mut self, frame: &[u8]) -> Result<(), DriverError> {
        if frame.len() > self.max {
            return Err(DriverError::FrameTooLarge {
                len: frame.len(),
                max: self.max,
            });
        }
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
        self.inner.recv(max, on_frame)
    }
    fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        self.inner.wait_fd()
    }
    fn info(&self) -> DriverInfo {
        self.inner.info()
    }
}

#[test]
fn a_ud_send_the_driver_refuses_is_not_a_success() {
    let macs = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
    let ips: [IpAddr; 2] = [[198, 18, 0, 1].into(), [198, 18, 0, 2].into()];
    let (da, db, _link) =
        MemDriver::pair(macs[0].0, macs[1].0, &mem_link_config(1500, 0.0, 1)).unwrap();
    let identity = |i: usize| DeviceIdentity {
        name: format!("avemit-tx{i}"),
        mac: macs[i],
        mtu: 1500,
        addrs: vec![ips[i]],
    };
    let refusing = Refusing {
        inner: da,
        max: 600,
    };
    let a = Device::with_driver(Box::new(refusing), identity(0), DeviceConfig::default()).unwrap();
    let b = Device::with_driver(Box::new(db), identity(1), DeviceConfig::default()).unwrap();
    a.add_static_neighbour(ips[1], macs[1]);
    b.add_static_neighbour(ips[0], macs[0]);
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(16, None).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    qp.ready_ud(0x1111_1111, 0).unwrap();
    let mr = pd.reg_mr(1024, Access::LOCAL_WRITE).unwrap();
    let gb = b.query_gid(b.ipv4_gid_index().unwrap()).unwrap();
    let ah = pd
        .create_ah(&AhAttr::new(gb, a.ipv4_gid_index().unwrap() as u8))
        .unwrap();
    let send = |wr_id: u64, len: u32| {
        qp.post_send(&SendWr {
            wr_id,
            op: WrOp::Send,
            sg_list: vec![mr.sge(0, len).unwrap()],
            flags: SendFlags::SIGNALED,
            ud: Some(UdDest {
                av: ah.av(),
                remote_qpn: 0x99,
                remote_qkey: 0x1111_1111,
            }),
        })
        .unwrap();
    };
    send(1, 64); // fits: a success
    let wcs = cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(wcs[0].status, WcStatus::Success);
    send(2, 1000); // the driver refuses the frame
    let wcs = cq.wait(1, Duration::from_secs(10)).unwrap();
    assert_eq!(wcs.len(), 1, "the refused send completes");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (2, WcStatus::LocQpOpErr));
    let c = a.counters();
    assert_eq!(c.emit_failed, 1);
    let cause = a.last_emit_error().unwrap();
    assert!(
        cause.contains("refused") && cause.contains("600"),
        "{cause}"
    );
    assert_eq!(
        a.progress_stats()
            .tx_errors
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(qp.state().unwrap(), QpState::Err);
}
