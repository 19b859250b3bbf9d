//! `xroce mr-check` (lab-mr.py's exchange) over the real stack on two devices joined in
//! memory: xroce against itself over a lossy link, and the client's three checks each made
//! to fail by a fake server that lies in exactly one way. No root needed.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use sha2::{Digest, Sha256};
use xroce::verbs::{mem_link_config, Device, DeviceConfig, MemLink};
use xroce_tools::checks::mr::{self as mr_check, MrCheckOptions};
use xroce_tools::endpoint::verbs::{open_on, DriverChoice, EndpointSpec};
use xroce_tools::endpoint::{ConnectParams, RemoteInfo, ToolEndpoint};
use xroce_tools::json_line::{gid_from_hex, gid_hex, hex};

fn devices(loss: f64) -> (Device, Device, MemLink) {
    Device::mem_pair(&mem_link_config(1500, loss, 11), DeviceConfig::default()).unwrap()
}

fn endpoint(dev: &Device, size: usize) -> Box<dyn ToolEndpoint> {
    let spec = EndpointSpec {
        qp_type: xroce::engine::QpType::Rc,
        buf_len: size,
        max_send_wr: 8,
        max_recv_wr: 1,
        driver: DriverChoice::Xdp,
        events: false,
        pcap: None,
        progress: Default::default(),
        shards: 1,
    };
    let gid = dev.ipv4_gid_index().unwrap();
    open_on(dev, gid, &spec, 1).unwrap().pop().unwrap()
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn sha(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn opts(size: usize) -> MrCheckOptions {
    MrCheckOptions {
        size,
        chunk: 1 << 20,
        depth: 4,
        mtu: 1024,
        stall_timeout: Duration::from_secs(20),
    }
}

#[test]
fn xroce_against_itself_over_a_lossy_link() {
    let size = (3 << 20) + 777; // not a multiple of the chunk: the last WR is short
    let (a, b, _link) = devices(0.01);
    let (mut srv_ep, mut cli_ep) = (endpoint(&a, size), endpoint(&b, size));
    let (sa, sb) = UnixStream::pair().unwrap();
    let initial = pattern(size, 1);
    let fresh = pattern(size, 2);
    let o = opts(size);
    let (o2, init2) = (o.clone(), initial.clone());
    let server = std::thread::spawn(move || {
        let mut sa = sa;
        mr_check::server(srv_ep.as_mut(), &mut sa, &o2, 0x10, &init2).map(|out| (out, srv_ep))
    });
    let mut sb = sb;
    let done = mr_check::client(cli_ep.as_mut(), &mut sb, &o, 0x20, &fresh).unwrap();
    let (served, srv_ep) = server.join().unwrap().unwrap();
    assert_eq!(done.size, size);
    assert_eq!(served.initial_sha256, sha(&initial));
    assert_eq!(served.written_sha256, vec![sha(&fresh)]);
    // The server's memory holds the client's bytes, every one of them.
    let mut now = vec![0u8; size];
    srv_ep.read_local(0, &mut now).unwrap();
    assert!(now == fresh, "server MR differs from what the client wrote");
}

/// How the fake server misbehaves.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Lie {
    /// Announces a digest that is not its content's.
    InitialDigest,
    /// Reports a wrong digest after the WRITE.
    WrittenDigest,
    /// Changes one byte after the WRITE but reports the digest from before (the READ back
    /// must catch it byte for byte).
    FlipAfterWrite(usize),
    /// Announces a smaller MR than the client asks for.
    ShortMr,
    /// Announces its MR at a VA so close to `u64::MAX` that the client's second chunk
    /// address wraps.
    VaNearTop,
}

/// A server written against the documented lines (Python's spacing, as lab-mr.py sends
/// them), lying as told. Returns when the client hangs up.
fn fake_server(mut ep: Box<dyn ToolEndpoint>, sock: UnixStream, size: usize, lie: Lie) {
    let initial = pattern(size, 3);
    ep.write_local(0, &initial).unwrap();
    let mut reader = BufReader::new(sock.try_clone().unwrap());
    let mut sock = sock;
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let hello: serde_json::Value = serde_json::from_str(&line).unwrap();
    let remote = RemoteInfo {
        qpn: hello["qpn"].as_u64().unwrap() as u32,
        psn: hello["psn"].as_u64().unwrap() as u32,
        gid: gid_from_hex(hello["gid"].as_str().unwrap()).unwrap(),
    };
    let mut params = ConnectParams::rc_pingpong(0x77, 1024, 0);
    params.max_rd_atomic = 1;
    ep.connect(&remote, &params).unwrap();
    let local = ep.local();
    let digest = if lie == Lie::InitialDigest {
        sha(b"something else")
    } else {
        sha(&initial)
    };
    let len = if lie == Lie::ShortMr { size / 2 } else { size };
    writeln!(
        sock,
        "{{\"qpn\": {}, \"psn\": 119, \"gid\": \"{}\", \"addr\": {}, \"rkey\": {}, \"len\": {len}, \"sha256\": \"{digest}\"}}",
        local.qpn,
        gid_hex(&local.gid),
        if lie == Lie::VaNearTop {
            u64::MAX - 100
        } else {
            local.buf_addr
        },
        local.rkey
    )
    .unwrap();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let msg: serde_json::Value = serde_json::from_str(&line).unwrap();
        if msg["op"] == "written" {
            let mut now = vec![0u8; size];
            ep.read_local(0, &mut now).unwrap();
            let mut digest = sha(&now);
            match lie {
                Lie::WrittenDigest => digest = sha(&initial),
                Lie::FlipAfterWrite(at) => {
                    ep.write_local(at, &[now[at] ^ 0x40]).unwrap();
                }
                _ => {}
            }
            writeln!(sock, "{{\"sha256\": \"{digest}\"}}").unwrap();
        }
    }
}

fn client_against(lie: Lie) -> String {
    let size = 2 << 20;
    let (a, b, _link) = devices(0.0);
    let (srv_ep, mut cli_ep) = (endpoint(&a, size), endpoint(&b, size));
    let (sa, mut sb) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || fake_server(srv_ep, sa, size, lie));
    let err = mr_check::client(
        cli_ep.as_mut(),
        &mut sb,
        &opts(size),
        0x30,
        &pattern(size, 4),
    )
    .expect_err("the client must catch the lie")
    .to_string();
    drop(sb);
    server.join().unwrap();
    err
}

#[test]
fn client_catches_a_read_that_differs_from_the_announced_content() {
    let err = client_against(Lie::InitialDigest);
    assert!(err.contains("READ returned different bytes"), "{err}");
}

#[test]
fn client_catches_a_server_memory_that_differs_after_the_write() {
    let err = client_against(Lie::WrittenDigest);
    assert!(
        err.contains("after the WRITE the server's MR differs"),
        "{err}"
    );
}

#[test]
fn client_catches_one_changed_byte_in_the_read_back() {
    let err = client_against(Lie::FlipAfterWrite(1_234_567));
    assert!(err.contains("first at byte 1234567"), "{err}");
}

#[test]
fn client_refuses_a_server_mr_smaller_than_the_size() {
    let err = client_against(Lie::ShortMr);
    assert!(
        err.contains("the server registered 1048576 bytes, we asked for 2097152: use the same --size on both sides"),
        "{err}"
    );
}

#[test]
fn client_wraps_a_server_va_near_the_top_and_reports_the_refused_read() {
    // Chunk 1 is at VA u64::MAX - 100 + 1 MiB: wrapped (the VA is opaque), not an
    // overflow panic, and the server's responder refuses both addresses.
    let err = client_against(Lie::VaNearTop);
    assert!(
        err.contains("RDMA READ of the chunk at offset 0 failed with"),
        "{err}"
    );
}

/// A real server and a real client with different --size: each says so in those terms.
fn sizes(server_size: usize, client_size: usize) -> (String, String) {
    let (a, b, _link) = devices(0.0);
    let (mut srv_ep, mut cli_ep) = (endpoint(&a, server_size), endpoint(&b, client_size));
    let (sa, mut sb) = UnixStream::pair().unwrap();
    let server = std::thread::spawn(move || {
        let mut sa = sa;
        let initial = pattern(server_size, 6);
        mr_check::server(srv_ep.as_mut(), &mut sa, &opts(server_size), 0x10, &initial)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    });
    let client = mr_check::client(
        cli_ep.as_mut(),
        &mut sb,
        &opts(client_size),
        0x20,
        &pattern(client_size, 7),
    )
    .map(|_| ())
    .unwrap_err()
    .to_string();
    drop(sb);
    (server.join().unwrap(), client)
}

#[test]
fn a_different_size_on_each_side_is_named_not_taken_for_corruption() {
    for (srv, cli) in [(2 << 20, 1 << 20), (1 << 20, 2 << 20)] {
        let (server, client) = sizes(srv, cli);
        assert_eq!(
            client,
            format!("the server registered {srv} bytes, we asked for {cli}: use the same --size on both sides")
        );
        assert_eq!(
            server,
            format!("the client asked for {cli} bytes, we registered {srv}: use the same --size on both sides")
        );
    }
}

#[test]
fn server_refuses_an_unknown_request_and_bad_options() {
    let size = 1 << 16;
    let (a, b, _link) = devices(0.0);
    let (mut srv_ep, cli_ep) = (endpoint(&a, size), endpoint(&b, size));
    let (mut sa, mut sb) = UnixStream::pair().unwrap();
    let local = cli_ep.local();
    writeln!(
        sb,
        "{{\"qpn\": {}, \"psn\": 1, \"gid\": \"{}\", \"addr\": 0, \"rkey\": 0, \"len\": {size}}}\n{{\"op\": \"explode\"}}",
        local.qpn,
        gid_hex(&local.gid)
    )
    .unwrap();
    let err = mr_check::server(srv_ep.as_mut(), &mut sa, &opts(size), 5, &pattern(size, 5))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown request \"explode\""), "{err}");
    // A buffer smaller than --size, and a zero size, are refused before any exchange.
    let err = mr_check::server(srv_ep.as_mut(), &mut sa, &opts(size * 2), 5, &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("smaller than --size"), "{err}");
    assert!(opts(0).validate().is_err());
}
