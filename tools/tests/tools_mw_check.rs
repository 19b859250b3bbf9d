//! `xroce mw-check` (lab-mw.py's exchange) over the real stack on two devices joined in
//! memory: xroce against itself, with and without loss (every step's refusal and the
//! server's memory are checked by the client itself). No root needed.
use std::os::unix::net::UnixStream;
use std::time::Duration;

use xroce::verbs::{mem_link_config, Device, DeviceConfig};
use xroce_tools::checks::mw::{self as mw_check, MwCheckOptions};

fn opts() -> MwCheckOptions {
    MwCheckOptions {
        size: 64 << 10,
        mtu: 1024,
        timeout: Duration::from_secs(20),
    }
}

fn run(loss: f64) {
    let (a, b, _link) =
        Device::mem_pair(&mem_link_config(1500, loss, 5), DeviceConfig::default()).unwrap();
    let (sa, sb) = UnixStream::pair().unwrap();
    let o = opts();
    let o2 = o.clone();
    let initial: Vec<u8> = (0..o.size).map(|i| (i * 7 + 3) as u8).collect();
    let server = std::thread::spawn(move || {
        let mut sa = sa;
        let gid = a.ipv4_gid_index().unwrap();
        mw_check::server(&a, gid, &mut sa, &o2, &initial)
    });
    let mut sb = sb;
    let gid = b.ipv4_gid_index().unwrap();
    let mut seed = 1u8;
    let mut fill = |buf: &mut [u8]| {
        seed = seed.wrapping_add(1);
        for (i, x) in buf.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(seed) ^ seed;
        }
    };
    let done = mw_check::client(&b, gid, &mut sb, &o, &mut fill).unwrap();
    let served = server.join().unwrap().unwrap();
    // READ W1, WRITE W2, WRITE W2 rebound, READ W1 rebound; four refusals.
    assert_eq!((done.accepted, done.refused), (4, 4));
    assert!(
        served.invalidated.is_some(),
        "the SEND_WITH_INV reached the server"
    );
    // Two WRITEs and four refusals, each followed by a look at the server's memory.
    assert_eq!(
        served.digests, 6,
        "the client checked the memory after every step"
    );
}

#[test]
fn xroce_against_itself() {
    run(0.0);
}

#[test]
fn xroce_against_itself_over_a_lossy_link() {
    run(0.02);
}
