//! The target agent of `xroce conform` (`tools/src/conform/agent.py`, issue 16), driven by its Rust
//! client: two agents, each running pyverbs on xroce's libibverbs.so.1 in a namespace of its
//! own (`xroce run`), joined by a veth pair over AF_XDP. Through the agents alone the test
//! connects an RC QP pair and checks SEND with immediate, WRITE, READ, both atomics and the
//! memory they touch, then an RDMA WRITE with a wrong rkey: the requester's completion
//! (remote access error, a class C responder error: IBTA 9.9.3.1, Table 63) and its QP in the
//! error state, and the target's memory untouched. Bad requests are refusals, not a dead
//! agent.
//!
//! Needs root and python3-pyverbs; under `XROCE_CI=1` a missing one fails, elsewhere it skips
//! visibly.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{veth_pair, xroce_run};
use xroce::engine::WrOp;
use xroce_tools::conform::{AgentClient, AgentError, ConnectParams};

const WAIT: Duration = Duration::from_secs(10);

struct Agent {
    child: Child,
    socket: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        common::child::stop(&mut self.child);
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn start_agent(ns: &xroce::netns::Netns, ifname: &str, dir: &Path) -> Agent {
    let script = dir.join("agent.py");
    std::fs::write(&script, xroce_tools::conform::AGENT_PY).unwrap();
    let socket = dir.join(format!("agent-{ifname}.sock"));
    let program: Vec<String> = [
        "/usr/bin/python3",
        script.to_str().unwrap(),
        "--device",
        &format!("xroce_{ifname}"),
        "--gid-index",
        "1",
        "--unix",
        socket.to_str().unwrap(),
        "--once",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let child = xroce_run(ns, ifname, &[], &program)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the agent");
    Agent { child, socket }
}

fn connect(agent: &mut Agent) -> AgentClient {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = agent.child.try_wait() {
            panic!("the agent exited ({status}) before it listened");
        }
        match AgentClient::unix(&agent.socket, WAIT) {
            Ok(c) => return c,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => panic!("cannot reach the agent at {}: {e}", agent.socket.display()),
        }
    }
}

fn ready(test: &str) -> bool {
    if !common::privileged_or_skip(test) {
        return false;
    }
    if !common::pyverbs_or_skip(test, "pyverbs.qp") {
        return false;
    }
    common::ensure_abi_libraries();
    true
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn two_agents_connect_and_run_every_operation() {
    let test = "two_agents_connect_and_run_every_operation";
    if !ready(test) {
        return;
    }
    let link = veth_pair(67, 1500);
    let dir = tempfile::tempdir().unwrap();
    let mut agent_a = start_agent(&link.a, &link.a_if, dir.path());
    let mut agent_b = start_agent(&link.b, &link.b_if, dir.path());
    let mut a = connect(&mut agent_a);
    let mut b = connect(&mut agent_b);

    let t0 = Instant::now();
    let hello_a = a.hello().unwrap();
    let hello_b = b.hello().unwrap();
    assert_eq!(hello_a.device, format!("xroce_{}", link.a_if));
    assert_eq!(
        hello_a.gid,
        format!("0000:0000:0000:0000:0000:ffff:{}", gid_tail(&link.a_ip))
    );
    assert_eq!(hello_b.active_mtu, 1024);

    // Unknown commands, bad arguments and unknown objects are refusals; the agent lives on.
    for (cmd, args) in [
        ("no_such_command", serde_json::json!({})),
        ("create_qp", serde_json::json!({ "type": "xrc" })),
        (
            "read_mem",
            serde_json::json!({ "mr": 99, "offset": 0, "len": 1 }),
        ),
        (
            "reg_mr",
            serde_json::json!({ "size": 64, "access": ["everything"] }),
        ),
    ] {
        match a.call(cmd, args) {
            Err(AgentError::Refused { .. }) => {}
            other => panic!("{cmd}: want a refusal, got {other:?}"),
        }
    }

    let qa = a.create_qp(false).unwrap();
    let qb = b.create_qp(false).unwrap();
    let all = [
        "local_write",
        "remote_write",
        "remote_read",
        "remote_atomic",
    ];
    let ma = a.reg_mr(8192, &all).unwrap();
    let mb = b.reg_mr(8192, &all).unwrap();
    let (psn_a, psn_b) = (0x12_3456, 0xff_fff0); // B's PSNs wrap past 2^24 - 1
    a.connect(
        &qa,
        &ConnectParams::new(qb.qpn, hello_b.gid.clone(), psn_b, psn_a),
    )
    .unwrap();
    b.connect(
        &qb,
        &ConnectParams::new(qa.qpn, hello_a.gid.clone(), psn_a, psn_b),
    )
    .unwrap();
    assert_eq!(a.qp_state(&qa).unwrap(), "rts");
    assert_eq!(b.qp_state(&qb).unwrap(), "rts");

    // SEND with immediate, 3000 bytes (three packets at MTU 1024).
    let message: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
    a.write_mem(&ma, 0, &message).unwrap();
    b.post_recv(&qb, 7, &mb, 0, 4096).unwrap();
    a.post_send(
        &qa,
        1,
        WrOp::SendWithImm { imm: 0xfeed_beef },
        &ma,
        0,
        message.len(),
    )
    .unwrap();
    let wa = a.poll(&qa, 1, WAIT).unwrap();
    let wb = b.poll(&qb, 1, WAIT).unwrap();
    assert_eq!(
        (
            wa[0].wr_id,
            wa[0].status_name.as_str(),
            wa[0].opcode.as_str()
        ),
        (1, "IBV_WC_SUCCESS", "send")
    );
    assert_eq!(
        (
            wb[0].wr_id,
            wb[0].opcode.as_str(),
            wb[0].byte_len,
            wb[0].imm
        ),
        (7, "recv", 3000, 0xfeed_beef)
    );
    assert_eq!(b.read_mem(&mb, 0, message.len()).unwrap(), message);

    // WRITE into B at 4096, READ it back from there into A at 4096.
    let pattern: Vec<u8> = (0..2048u32).map(|i| (i % 253) as u8 ^ 0x5a).collect();
    a.write_mem(&ma, 0, &pattern).unwrap();
    let remote = |off: u64| (mb.addr + off, mb.rkey);
    let (addr, rkey) = remote(4096);
    a.post_send(
        &qa,
        2,
        WrOp::Write {
            remote_addr: addr,
            rkey,
        },
        &ma,
        0,
        pattern.len(),
    )
    .unwrap();
    a.post_send(
        &qa,
        3,
        WrOp::Read {
            remote_addr: addr,
            rkey,
        },
        &ma,
        4096,
        pattern.len(),
    )
    .unwrap();
    let wa = a.poll(&qa, 2, WAIT).unwrap();
    assert_eq!(
        wa.iter()
            .map(|w| (w.wr_id, w.status_name.as_str()))
            .collect::<Vec<_>>(),
        [(2, "IBV_WC_SUCCESS"), (3, "IBV_WC_SUCCESS")]
    );
    assert_eq!(b.read_mem(&mb, 4096, pattern.len()).unwrap(), pattern);
    assert_eq!(a.read_mem(&ma, 4096, pattern.len()).unwrap(), pattern);

    // Atomics on B's 8 bytes at 7168: fetch-and-add, then compare-and-swap.
    b.write_mem(&mb, 7168, &40u64.to_le_bytes()).unwrap();
    let (addr, rkey) = remote(7168);
    a.post_send(
        &qa,
        4,
        WrOp::FetchAdd {
            remote_addr: addr,
            rkey,
            add: 2,
        },
        &ma,
        6144,
        8,
    )
    .unwrap();
    a.post_send(
        &qa,
        5,
        WrOp::CompareSwap {
            remote_addr: addr,
            rkey,
            compare: 42,
            swap: 1000,
        },
        &ma,
        6152,
        8,
    )
    .unwrap();
    let wa = a.poll(&qa, 2, WAIT).unwrap();
    assert!(
        wa.iter().all(|w| w.status_name == "IBV_WC_SUCCESS"),
        "{wa:?}"
    );
    assert_eq!(
        a.read_mem(&ma, 6144, 16).unwrap(),
        [40u64.to_le_bytes(), 42u64.to_le_bytes()].concat()
    );
    assert_eq!(b.read_mem(&mb, 7168, 8).unwrap(), 1000u64.to_le_bytes());

    // A WRITE with a wrong rkey: B NAKs it (remote access error), A's WR completes with
    // IBV_WC_REM_ACCESS_ERR and its QP goes to the error state; B's memory is untouched.
    let before = b.read_mem(&mb, 0, 64).unwrap();
    a.write_mem(&ma, 0, &[0xee; 64]).unwrap();
    a.post_send(
        &qa,
        6,
        WrOp::Write {
            remote_addr: mb.addr,
            rkey: mb.rkey ^ 0x100,
        },
        &ma,
        0,
        64,
    )
    .unwrap();
    let wa = a.poll(&qa, 1, WAIT).unwrap();
    assert_eq!(
        (wa[0].wr_id, wa[0].status_name.as_str()),
        (6, "IBV_WC_REM_ACCESS_ERR")
    );
    assert_eq!(a.qp_state(&qa).unwrap(), "err");
    assert_eq!(b.read_mem(&mb, 0, 64).unwrap(), before);

    eprintln!("agents answered everything in {:?}", t0.elapsed());
    a.bye().unwrap();
    b.bye().unwrap();
}

/// The last two groups of an IPv4-mapped GID as the agent prints them (`c612:0001`).
fn gid_tail(ip: &std::net::Ipv4Addr) -> String {
    let o = ip.octets();
    format!("{:02x}{:02x}:{:02x}{:02x}", o[0], o[1], o[2], o[3])
}
