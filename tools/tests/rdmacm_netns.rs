//! Debian's unmodified rdmacm-utils (`rping`, `ucmatose`, `udaddy`) on xroce's
//! `librdmacm.so.1` and `libibverbs.so.1`, both sides, between two network namespaces joined
//! by a veth pair, over AF_XDP: every program runs through `xroce run -d <veth>` (the server
//! in namespace A, the client in B), so the CM protocol (REQ/REP/RTU, SIDR, DREQ/DREP) runs
//! on xroce's QP1 at both ends and the data on the QPs `rdma_create_qp` made.
//!
//! - `rping -v -V -C 10`: 10 pings, each an RDMA READ by the server and an RDMA WRITE back,
//!   verified by the client (`-V`); and `-q`, where both sides move their own QP with
//!   `rdma_init_qp_attr` and the client sends the RTU with `rdma_establish` after
//!   CONNECT_RESPONSE.
//! - `ucmatose -c 2 -C 10`: two RC connections on one event channel, sends both ways.
//! - `udaddy -C 10`: UD over SIDR (the client's AH from ESTABLISHED's `param.ud`).
//! - A client to a port nobody listens on: REJECTED with status 8 (invalid service ID,
//!   IBTA 12.6.7 table 112), as rxe's rdma_cm answers (docs/cm.md).
//! - `rdma_server` / `rdma_client`: synchronous endpoints (`rdma_create_ep`,
//!   `rdma_get_request`, calls that wait for their event), and ECONNREFUSED from a
//!   synchronous `rdma_connect` that is rejected.
//! - perftest's `-R` (connect through rdma_cm): `ib_send_bw` RC (`rdma_create_qp_ex` with
//!   send ops flags) and UD, `ib_read_bw`, `ib_write_lat`.
//! - python3-pyverbs' `CMID`: synchronous and on an event channel, RC and UD, a REJ with
//!   private data (`tests/py/cmid_peer.py`).
//! - A C program (built here against librdmacm-dev) checks what the fields and calls report:
//!   the channel fd's `O_NONBLOCK` (EAGAIN), `rdma_getaddrinfo`, `verbs`/`pd`/`port_num` shared
//!   by ids on one device, ports, the path record after ROUTE_RESOLVED, `rdma_get_devices`,
//!   `rdma_set_option`, a synchronous id, an active `rdma_create_ep`, and the refusals
//!   (RDMA_PS_IB, multicast, destroyed ids, events acked twice).
//!
//! A server is taken to be ready once its process runs a `xroce-cm-*` thread (the CM service
//! of its device starts when the listener binds). Each case has a deadline (a hang fails it),
//! and the test reports every failing case before it fails.
//!
//! Needs root and Debian's rdmacm-utils (and perftest for its test); under `XROCE_CI=1` a missing privilege or program
//! fails, elsewhere it skips visibly.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::child::{printed, stop, wait_or_stop};
use common::{veth_pair, xroce_run};
use xroce::netns::VethLink;

const PROGRAMS: [&str; 5] = ["rping", "ucmatose", "udaddy", "rdma_server", "rdma_client"];

/// Words in a program's output that mean something went wrong (an `xroce:` line is a call
/// xroce's libraries refused or failed).
const FAILURE_WORDS: [&str; 7] = [
    "xroce:",
    "xroce run: warning",
    "failed",
    "Failed",
    "error",
    "panicked",
    "No RDMA devices",
];

fn ready(test: &str) -> bool {
    let programs: Vec<(&str, &str)> = PROGRAMS.iter().map(|p| (*p, "rdmacm-utils")).collect();
    common::programs_ready(test, &programs)
}

/// Whether `pid` or one of its children runs a thread named `xroce-cm-*` (the CM service of
/// a device, started when an id binds to it).
fn cm_running(pid: u32) -> bool {
    let ppid_of = |p: &str| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        // pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let Ok(p) = name.parse::<u32>() else {
            return false;
        };
        if p != pid && ppid_of(&name) != Some(pid) {
            return false;
        }
        std::fs::read_dir(format!("/proc/{p}/task")).is_ok_and(|tasks| {
            tasks.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("xroce-cm-"))
            })
        })
    })
}

struct PairOutput {
    server: String,
    client: String,
}

/// `server` in A, then (once its CM runs) `client` in B. The client must succeed (or, with
/// `client_ok` false, fail); the server must succeed, unless `server_may_stay`: then it is
/// stopped once the client is done.
fn pair(
    link: &VethLink,
    server: &[String],
    client: &[String],
    client_ok: bool,
    server_may_stay: bool,
    secs: u64,
) -> Result<PairOutput, String> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut server_child = xroce_run(&link.a, &link.a_if, &[], server)
        .spawn()
        .expect("spawn xroce run (server)");
    let pid = server_child.id();
    while !cm_running(pid) {
        if let Ok(Some(_)) = server_child.try_wait() {
            let out = server_child.wait_with_output().expect("output");
            return Err(format!(
                "server {server:?} exited ({}) before its CM ran:\n{}",
                out.status,
                printed(&out)
            ));
        }
        if Instant::now() > deadline {
            stop(&mut server_child);
            let out = server_child.wait_with_output().expect("output");
            return Err(format!(
                "server {server:?}: not ready in {secs} s:\n{}",
                printed(&out)
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The listen follows the bind that started the thread. Give it time even on a loaded
    // 2-core machine: a REQ before the listen is refused (REJ 8), and perftest 4.5's
    // retry after that reuses the ids it destroyed (an abort in xroce's library then).
    std::thread::sleep(Duration::from_secs(2));
    let client_child = xroce_run(&link.b, &link.b_if, &[], client)
        .spawn()
        .expect("spawn xroce run (client)");
    let c_out = wait_or_stop(client_child, deadline);
    let s_deadline = if server_may_stay {
        Instant::now()
    } else {
        deadline + Duration::from_secs(5)
    };
    let s_out = wait_or_stop(server_child, s_deadline);
    let took = started.elapsed().as_secs_f64();
    let describe = |r: &Result<Output, Output>| match r {
        Ok(o) => format!("exit {}:\n{}", o.status, printed(o)),
        Err(o) => format!("stopped (deadline {secs} s):\n{}", printed(o)),
    };
    let server_fine = match &s_out {
        Ok(o) => o.status.success(),
        Err(_) => server_may_stay,
    };
    let client_fine = matches!(&c_out, Ok(o) if o.status.success() == client_ok);
    if server_fine && client_fine {
        let text = |r: &Result<Output, Output>| match r {
            Ok(o) | Err(o) => printed(o),
        };
        return Ok(PairOutput {
            server: text(&s_out),
            client: text(&c_out),
        });
    }
    Err(format!(
        "after {took:.1} s\n--- server {server:?}: {}\n--- client {client:?}: {}",
        describe(&s_out),
        describe(&c_out)
    ))
}

/// `text` has every one of `wanted` and none of `bad`.
fn check(who: &str, text: &str, wanted: &[String], bad: &[&str]) -> Result<(), String> {
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|w| !text.contains(w.as_str()))
        .collect();
    let found: Vec<&&str> = bad.iter().filter(|w| text.contains(**w)).collect();
    if missing.is_empty() && found.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{who}: missing {missing:?}, failure words {found:?} in:\n{text}"
        ))
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

type Case<'a> = (String, Box<dyn FnOnce() -> Result<(), String> + 'a>);

fn run_cases(test: &str, cases: Vec<Case<'_>>) {
    let mut failed = Vec::new();
    let total = cases.len();
    for (name, case) in cases {
        let t0 = Instant::now();
        let result = case();
        let secs = t0.elapsed().as_secs_f64();
        match result {
            Ok(()) => println!("{test}: {name}: ok ({secs:.1} s)"),
            Err(e) => {
                println!("{test}: {name}: FAILED ({secs:.1} s)");
                failed.push(format!("=== {name}\n{e}"));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{test}: {} of {total} cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// `rping` with `extra` options on both sides: every ping's data, both ways.
fn rping(link: &VethLink, extra: &[&str], count: usize) -> Result<(), String> {
    let a = link.a_ip.to_string();
    let n = count.to_string();
    let mut server = args(&["rping", "-s", "-v", "-C", &n, "-a", &a]);
    let mut client = args(&["rping", "-c", "-v", "-V", "-C", &n, "-a", &a]);
    server.extend(args(extra));
    client.extend(args(extra));
    let out = pair(link, &server, &client, true, false, 60)?;
    let last = count - 1;
    check(
        "client",
        &out.client,
        &[
            "ping data: rdma-ping-0: ".to_string(),
            format!("ping data: rdma-ping-{last}: "),
        ],
        &FAILURE_WORDS,
    )?;
    let pings = out.client.matches("ping data: rdma-ping-").count();
    if pings != count {
        return Err(format!(
            "client: {pings} pings, not {count}:\n{}",
            out.client
        ));
    }
    check(
        "server",
        &out.server,
        &[format!("server ping data: rdma-ping-{last}: ")],
        &FAILURE_WORDS,
    )
}

/// `rping` without `-v` (large buffers would fill the report): the client verifies each
/// ping (`-V`) and exits non-zero on a mismatch.
fn rping_quiet(link: &VethLink, extra: &[&str], count: usize) -> Result<(), String> {
    let a = link.a_ip.to_string();
    let n = count.to_string();
    let mut server = args(&["rping", "-s", "-C", &n, "-a", &a]);
    let mut client = args(&["rping", "-c", "-V", "-C", &n, "-a", &a]);
    server.extend(args(extra));
    client.extend(args(extra));
    let out = pair(link, &server, &client, true, false, 60)?;
    check("client", &out.client, &[], &FAILURE_WORDS)?;
    check("server", &out.server, &[], &FAILURE_WORDS)
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn rping_both_sides_on_xroce() {
    let test = "rping_both_sides_on_xroce";
    if !ready(test) {
        return;
    }
    let link = veth_pair(60, 1500);
    let l = &link;
    let cases: Vec<Case<'_>> = vec![
        (
            "rping -C 10 (QP made and moved by rdma_create_qp / the CM)".into(),
            Box::new(move || rping(l, &[], 10)),
        ),
        (
            "rping -q -C 10 (QP moved by the program: rdma_init_qp_attr, rdma_establish)".into(),
            Box::new(move || rping(l, &["-q"], 10)),
        ),
        (
            "rping -S 4096 -C 20 (multi-packet READ and WRITE)".into(),
            Box::new(move || rping_quiet(l, &["-S", "4096"], 20)),
        ),
        (
            "a REQ to a port nobody listens on is REJECTED, status 8".into(),
            Box::new(move || {
                let a = l.a_ip.to_string();
                let server = args(&["rping", "-s", "-C", "1", "-p", "7471", "-a", &a]);
                let client = args(&["rping", "-c", "-C", "1", "-p", "7472", "-a", &a]);
                let out = pair(l, &server, &client, false, true, 30)?;
                check(
                    "client",
                    &out.client,
                    &["cma event RDMA_CM_EVENT_REJECTED, error 8".to_string()],
                    &["xroce:", "panicked"],
                )
            }),
        ),
    ];
    run_cases(test, cases);
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn ucmatose_and_udaddy_on_xroce() {
    let test = "ucmatose_and_udaddy_on_xroce";
    if !ready(test) {
        return;
    }
    let link = veth_pair(61, 1500);
    let l = &link;
    let tool = |program: &'static str, opts: &'static [&'static str]| {
        move || -> Result<(), String> {
            let a = l.a_ip.to_string();
            let mut server = args(&[program]);
            server.extend(args(opts));
            let mut client = server.clone();
            client.extend(args(&["-s", &a]));
            let out = pair(l, &server, &client, true, false, 60)?;
            let done = ["test complete".to_string(), "return status 0".to_string()];
            check("server", &out.server, &done, &FAILURE_WORDS)?;
            check("client", &out.client, &done, &FAILURE_WORDS)
        }
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "ucmatose -c 2 -C 10 (two RC connections, one channel)".into(),
            Box::new(tool("ucmatose", &["-c", "2", "-C", "10"])),
        ),
        (
            "udaddy -C 10 (UD through SIDR)".into(),
            Box::new(tool("udaddy", &["-C", "10"])),
        ),
    ];
    run_cases(test, cases);
}

/// rdmacm-utils' `rdma_server` and `rdma_client`: synchronous endpoints (`rdma_create_ep`
/// both sides, `rdma_get_request`, calls that wait for their own event), the CQs and
/// completion channels `rdma_create_qp` makes (`rdma_get_recv_comp` waits on them), one
/// 16-byte SEND each way.
#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn rdma_server_and_client_on_xroce() {
    let test = "rdma_server_and_client_on_xroce";
    if !ready(test) {
        return;
    }
    let link = veth_pair(64, 1500);
    let l = &link;
    let cases: Vec<Case<'_>> = vec![
        (
            "rdma_server / rdma_client (a SEND each way)".into(),
            Box::new(move || {
                let a = l.a_ip.to_string();
                let server = args(&["rdma_server", "-s", &a, "-p", "7471"]);
                let client = args(&["rdma_client", "-s", &a, "-p", "7471"]);
                let out = pair(l, &server, &client, true, false, 60)?;
                let s_done = [
                    "rdma_server: start".to_string(),
                    "rdma_server: end 0".into(),
                ];
                let c_done = [
                    "rdma_client: start".to_string(),
                    "rdma_client: end 0".into(),
                ];
                check("server", &out.server, &s_done, &FAILURE_WORDS)?;
                check("client", &out.client, &c_done, &FAILURE_WORDS)
            }),
        ),
        (
            "rdma_client to a port nobody listens on: rdma_connect fails, ECONNREFUSED".into(),
            Box::new(move || {
                let a = l.a_ip.to_string();
                let server = args(&["rdma_server", "-s", &a, "-p", "7471"]);
                let client = args(&["rdma_client", "-s", &a, "-p", "7473"]);
                let out = pair(l, &server, &client, false, true, 30)?;
                check(
                    "client",
                    &out.client,
                    &["rdma_connect: Connection refused".to_string()],
                    &["panicked", "rdma_client: end 0"],
                )
            }),
        ),
    ];
    run_cases(test, cases);
}

/// python3-pyverbs' `CMID` (rdma-core's Python binding of librdmacm), unmodified, on xroce's
/// libraries both sides (`tests/py/cmid_peer.py`): synchronous ids with an RDMA WRITE and
/// READ through `rdma_post_write`/`rdma_post_read`, ids on an event channel (RC and UD
/// through SIDR, every event checked), and a REJ with private data.
#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn pyverbs_cmid_on_xroce() {
    let test = "pyverbs_cmid_on_xroce";
    if !ready(test) {
        return;
    }
    if !common::pyverbs_or_skip(test, "pyverbs.cmid") {
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/py/cmid_peer.py");
    let link = veth_pair(65, 1500);
    let l = &link;
    let mode = |mode: &'static str, client_ok: bool| {
        move || -> Result<(), String> {
            let a = l.a_ip.to_string();
            let peer = |role: &str| args(&["/usr/bin/python3", script, role, mode, &a]);
            let out = pair(l, &peer("server"), &peer("client"), client_ok, false, 60)?;
            for (who, text) in [("server", &out.server), ("client", &out.client)] {
                check(
                    who,
                    text,
                    &[format!("cmid_peer: {who} {mode} ok")],
                    &["xroce:", "Traceback", "panicked"],
                )?;
            }
            Ok(())
        }
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "sync: CMID from AddrInfo, get_request, RDMA WRITE and READ".into(),
            Box::new(mode("sync", true)),
        ),
        (
            "async: an event channel, every event checked, DISCONNECTED both sides".into(),
            Box::new(mode("async", true)),
        ),
        (
            "ud: RDMA_PS_UDP through SIDR, AHs from UD parameters and from a completion".into(),
            Box::new(mode("ud", true)),
        ),
        (
            "reject: REJECTED with the server's private data".into(),
            Box::new(mode("reject", true)),
        ),
    ];
    run_cases(test, cases);
}

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn perftest_over_rdma_cm() {
    let test = "perftest_over_rdma_cm";
    if !ready(test) {
        return;
    }
    for p in ["ib_send_bw", "ib_read_bw", "ib_write_lat"] {
        if !common::on_path(p) {
            let why = format!("needs {p} (apt-get install perftest)");
            if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
                panic!("{test}: {why}; XROCE_CI=1 forbids skipping");
            }
            common::report_skip(test, &why);
            return;
        }
    }
    let link = veth_pair(62, 1500);
    let l = &link;
    let perf = |opts: &'static [&'static str]| {
        move || -> Result<(), String> {
            let server = args(opts);
            let mut client = server.clone();
            client.push(l.a_ip.to_string());
            let mut out = pair(l, &server, &client, true, false, 60);
            if let Err(e) = &out {
                if PERFTEST_LISTEN_RACE.iter().any(|w| e.contains(w)) {
                    // Visible, and once only: a second refusal fails the case.
                    println!(
                        "{}: perftest's client connected its test QPs before its server \
                         listened (perftest 4.5-0.17's race, see PERFTEST_LISTEN_RACE); \
                         running the case once more",
                        opts.join(" ")
                    );
                    out = pair(l, &server, &client, true, false, 60);
                }
            }
            let out = out?;
            let wanted = [
                "rdma_cm QPs\t : ON".to_string(),
                "#bytes".to_string(),
                " 200 ".to_string(),
            ];
            check("server", &out.server, &wanted[1..], &FAILURE_WORDS)?;
            check("client", &out.client, &wanted, &FAILURE_WORDS)
        }
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "ib_send_bw -R (RC, rdma_create_qp_ex)".into(),
            Box::new(perf(&["ib_send_bw", "-R", "-n", "200"])),
        ),
        (
            "ib_send_bw -R -c UD (SIDR, AH from ESTABLISHED)".into(),
            Box::new(perf(&["ib_send_bw", "-R", "-c", "UD", "-n", "200"])),
        ),
        (
            "ib_read_bw -R".into(),
            Box::new(perf(&["ib_read_bw", "-R", "-n", "200"])),
        ),
        (
            "ib_write_lat -R".into(),
            Box::new(perf(&["ib_write_lat", "-R", "-n", "200"])),
        ),
    ];
    run_cases(test, cases);
}

/// What perftest 4.5-0.17 prints when its client's test-QP connect comes before the
/// server's `rdma_listen`: after the exchange on the first connection the server makes a
/// new listening id, while the client connects at once. The refusal is right (REJ reason 8,
/// invalid service ID, IBTA 12.6.7; SIDR_REP status 1 for UD, 12.11.2), and perftest's own
/// retry then reads the ids it has just destroyed (fixed in later perftest), which xroce's
/// librdmacm refuses with EINVAL. The kernel's CM answers too fast for the race to show;
/// on a loaded two-core machine it shows in about one run in thirty.
const PERFTEST_LISTEN_RACE: [&str; 2] = [
    "Event: RDMA_CM_EVENT_REJECTED; error: 8.",
    "Event: RDMA_CM_EVENT_UNREACHABLE; error: 1.",
];

/// A C program's view of the calls, run through `xroce run` in namespace A: the channel
/// fd's `O_NONBLOCK`, `rdma_getaddrinfo`, the fields an id reports after bind, resolve and
/// route (shared context and PD, port, path record), `rdma_get_devices`, options, refusals.
const ABI_PROGRAM: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

static int failed;
#define CHECK(cond) do { if (cond) printf("ok: %s\n", #cond); \
	else { printf("FAILED: %s (errno %d)\n", #cond, errno); failed = 1; } } while (0)

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e = NULL;
	if (poll(&p, 1, 5000) != 1 || rdma_get_cm_event(ch, &e))
		return NULL;
	return e;
}

int main(int argc, char **argv)
{
	const char *a = argv[1], *b = argv[2], *dev = argv[3];
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	struct rdma_cm_event *e = NULL;
	fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);

	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_TCP }, *rai;
	CHECK(rdma_getaddrinfo(a, "7471", &hints, &rai) == 0);
	CHECK(rai->ai_qp_type == IBV_QPT_RC && rai->ai_src_addr && !rai->ai_dst_addr);
	CHECK(ntohs(((struct sockaddr_in *)rai->ai_src_addr)->sin_port) == 7471);

	struct rdma_cm_id *listen = NULL, *id = NULL;
	CHECK(rdma_create_id(ch, &listen, (void *)0x1234, RDMA_PS_TCP) == 0);
	CHECK(listen->context == (void *)0x1234 && listen->channel == ch);
	CHECK(listen->ps == RDMA_PS_TCP && listen->qp_type == IBV_QPT_RC);
	CHECK(rdma_bind_addr(listen, rai->ai_src_addr) == 0);
	rdma_freeaddrinfo(rai);
	CHECK(rdma_get_src_port(listen) == htons(7471));
	CHECK(listen->verbs != NULL && listen->pd != NULL && listen->port_num == 1);
	CHECK(listen->verbs && strcmp(ibv_get_device_name(listen->verbs->device), dev) == 0);
	CHECK(listen->pd && listen->pd->context == listen->verbs);
	CHECK(rdma_listen(listen, 4) == 0);

	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	uint8_t tos = 32;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4) == -1 && errno == EINVAL);
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(7472) };
	inet_pton(AF_INET, b, &dst.sin_addr);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	e = next_event(ch);
	CHECK(e && e->event == RDMA_CM_EVENT_ADDR_RESOLVED && e->id == id && e->status == 0);
	CHECK(id->verbs == listen->verbs && id->pd == listen->pd);
	CHECK(rdma_get_dst_port(id) == htons(7472));
	CHECK(((struct sockaddr_in *)rdma_get_local_addr(id))->sin_addr.s_addr != 0);
	if (e)
		CHECK(rdma_ack_cm_event(e) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	e = next_event(ch);
	CHECK(e && e->event == RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK(id->route.num_paths == 1 && id->route.path_rec != NULL);
	CHECK(id->route.path_rec && id->route.path_rec->traffic_class == 32);
	CHECK(memcmp(&id->route.addr.addr.ibaddr.dgid.raw[10], "\xff\xff", 2) == 0);
	if (e)
		CHECK(rdma_ack_cm_event(e) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN);

	int n = 0;
	struct ibv_context **list = rdma_get_devices(&n);
	CHECK(list && n == 1 && list[0] == id->verbs && list[1] == NULL);
	rdma_free_devices(list);

	struct rdma_cm_id *ib = NULL;
	errno = 0;
	CHECK(rdma_create_id(ch, &ib, NULL, RDMA_PS_IB) == -1 && errno == EOPNOTSUPP);
	errno = 0;
	CHECK(rdma_join_multicast(id, (struct sockaddr *)&dst, NULL) == -1 && errno == EOPNOTSUPP);
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_CONNECT_REQUEST), "RDMA_CM_EVENT_CONNECT_REQUEST") == 0);

	/* A synchronous id (NULL channel): its own channel, and each call returns once its
	 * event came, kept in id->event. */
	struct rdma_cm_id *s = NULL;
	CHECK(rdma_create_id(NULL, &s, NULL, RDMA_PS_TCP) == 0);
	CHECK(s && s->channel != NULL && s->channel != ch);
	CHECK(rdma_resolve_addr(s, NULL, (struct sockaddr *)&dst, 2000) == 0);
	CHECK(s->event && s->event->event == RDMA_CM_EVENT_ADDR_RESOLVED && s->event->id == s);
	CHECK(rdma_resolve_route(s, 2000) == 0);
	CHECK(s->event && s->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK(s->route.num_paths == 1);
	struct rdma_cm_id *got = NULL;
	errno = 0;
	CHECK(rdma_get_request(listen, &got) == -1 && errno == EINVAL && got == NULL);
	CHECK(rdma_destroy_id(s) == 0);
	/* rdma_create_ep, active: address and route resolved before it returns. */
	struct rdma_addrinfo ep_hints = { .ai_port_space = RDMA_PS_TCP }, *ep_rai;
	CHECK(rdma_getaddrinfo(b, "7472", &ep_hints, &ep_rai) == 0);
	struct rdma_cm_id *ep = NULL;
	CHECK(rdma_create_ep(&ep, ep_rai, NULL, NULL) == 0);
	CHECK(ep && ep->route.num_paths == 1 && ep->verbs == listen->verbs && ep->qp == NULL);
	rdma_destroy_ep(ep);
	rdma_freeaddrinfo(ep_rai);

	/* Objects the program gave back are refused, not read: perftest 4.5-0.17 retries a
	 * rejected connect on ids it has destroyed. */
	struct rdma_cm_id *gone = NULL;
	CHECK(rdma_create_id(ch, &gone, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_destroy_id(gone) == 0);
	errno = 0;
	CHECK(rdma_resolve_route(gone, 2000) == -1 && errno == EINVAL);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == -1);
	CHECK(rdma_create_id(ch, &gone, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(gone, NULL, (struct sockaddr *)&dst, 2000) == 0);
	e = next_event(ch);
	CHECK(e && e->event == RDMA_CM_EVENT_ADDR_RESOLVED);
	if (e) {
		CHECK(rdma_ack_cm_event(e) == 0);
		errno = 0;
		CHECK(rdma_ack_cm_event(e) == -1 && errno == EINVAL);
	}
	CHECK(rdma_destroy_id(gone) == 0);

	CHECK(rdma_destroy_id(id) == 0);
	CHECK(rdma_destroy_id(listen) == 0);
	rdma_destroy_event_channel(ch);
	if (!failed)
		printf("all checks passed\n");
	return failed;
}
"#;

#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn a_c_program_sees_what_librdmacm_reports() {
    let test = "a_c_program_sees_what_librdmacm_reports";
    if !ready(test) {
        return;
    }
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let header = std::path::Path::new("/usr/include/rdma/rdma_cma.h").exists();
    if !gcc || !header {
        let why = "needs gcc and librdmacm-dev (scripts/setup.sh installs them)";
        if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
            panic!("{test}: {why}; XROCE_CI=1 forbids skipping");
        }
        common::report_skip(test, why);
        return;
    }
    let dir = tempfile::tempdir().expect("a scratch directory");
    let src = dir.path().join("abi.c");
    let exe = dir.path().join("abi");
    std::fs::write(&src, ABI_PROGRAM).unwrap();
    // Linked against rdma-core's libraries (what the link editor records); xroce run puts
    // xroce's first at run time.
    let out = Command::new("gcc")
        .args(["-std=gnu99", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .output()
        .expect("run gcc");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let link = veth_pair(63, 1500);
    let program = vec![
        exe.display().to_string(),
        link.a_ip.to_string(),
        link.b_ip.to_string(),
        format!("xroce_{}", link.a_if),
    ];
    let child = xroce_run(&link.a, &link.a_if, &[], &program)
        .spawn()
        .expect("spawn xroce run");
    let out = match wait_or_stop(child, Instant::now() + Duration::from_secs(30)) {
        Ok(o) => o,
        Err(o) => panic!("the program hung:\n{}", printed(&o)),
    };
    let text = printed(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("all checks passed"), "{text}");
    // The refusals say why, once each; nothing else failed.
    for name in [
        "rdma_create_id",
        "rdma_join_multicast",
        "rdma_get_request",
        "rdma_resolve_route",
        "rdma_ack_cm_event",
    ] {
        assert_eq!(
            text.lines()
                .filter(|l| l.starts_with(&format!("xroce: {name}")))
                .count(),
            1,
            "one line for {name}: {text}"
        );
    }
    assert_eq!(
        text.lines().filter(|l| l.starts_with("xroce:")).count(),
        7,
        "seven refusals (PS_IB, multicast, the TOS length, rdma_get_request on a listener \
         with a channel, a destroyed id, an id whose address is resolved already, an event \
         acked twice): {text}"
    );
}

/// libfabric's verbs provider (Debian's libfabric-bin) on xroce's libraries: `fi_info -p
/// verbs` finds xroce's device through librdmacm (`rdma_getaddrinfo`, `rdma_bind_addr` on the
/// interface's address and on 127.0.0.1) and libibverbs, for RC (FI_EP_MSG) and UD
/// (FI_EP_DGRAM); `fi_pingpong -e dgram -c` runs verified UD ping-pongs between the
/// namespaces. (`-e msg` does not run yet: fi_pingpong's server listens on 127.0.0.1;
/// docs/rdmacm.md.)
#[test]
#[cfg_attr(
    not(feature = "xdp"),
    ignore = "runs over AF_XDP: needs the `xdp` feature"
)]
fn libfabric_verbs_provider_on_xroce() {
    let test = "libfabric_verbs_provider_on_xroce";
    if !ready(test) {
        return;
    }
    if !common::on_path("fi_pingpong") || !common::on_path("fi_info") {
        let why = "needs fi_info and fi_pingpong (apt-get install libfabric-bin)";
        if std::env::var("XROCE_CI").is_ok_and(|v| v == "1") {
            panic!("{test}: {why}; XROCE_CI=1 forbids skipping");
        }
        common::report_skip(test, why);
        return;
    }
    let link = veth_pair(66, 1500);
    let l = &link;
    let a_dev = format!("xroce_{}", l.a_if);
    let b_dev = format!("xroce_{}", l.b_if);
    let cases: Vec<Case<'_>> = vec![
        (
            "fi_info -p verbs: xroce's device for FI_EP_MSG and FI_EP_DGRAM".into(),
            Box::new(|| {
                let out = xroce_run(&l.a, &l.a_if, &[], &args(&["fi_info", "-p", "verbs"]))
                    .output()
                    .expect("run fi_info");
                let text = printed(&out);
                if !out.status.success() {
                    return Err(format!("fi_info failed ({}):\n{text}", out.status));
                }
                for want in [
                    format!("domain: {a_dev}\n"),
                    "type: FI_EP_MSG".to_string(),
                    format!("domain: {a_dev}-dgram\n"),
                    "type: FI_EP_DGRAM".to_string(),
                ] {
                    if !text.contains(&want) {
                        return Err(format!("fi_info printed no {want:?}:\n{text}"));
                    }
                }
                Ok(())
            }),
        ),
        (
            "fi_pingpong -e dgram -c: 100 verified 1 KiB ping-pongs over UD".into(),
            Box::new(|| {
                let a = l.a_ip.to_string();
                let opts = |dev: &str| {
                    args(&[
                        "-p", "verbs", "-e", "dgram", "-d", dev, "-I", "100", "-S", "1024", "-c",
                    ])
                };
                let mut server = args(&["fi_pingpong"]);
                server.extend(opts(&format!("{a_dev}-dgram")));
                let mut client = args(&["fi_pingpong"]);
                client.extend(opts(&format!("{b_dev}-dgram")));
                client.push(a.clone());
                let deadline = Instant::now() + Duration::from_secs(60);
                let server_child = xroce_run(&l.a, &l.a_if, &[], &server)
                    .spawn()
                    .expect("spawn fi_pingpong server");
                // The server's control socket (TCP 47592) comes first; the client gives up
                // at once if nothing listens there yet.
                let listening = || {
                    l.a.command("ss")
                        .args(["-Hltn", "sport = :47592"])
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("LISTEN"))
                };
                while !listening() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let client_child = xroce_run(&l.b, &l.b_if, &[], &client)
                    .spawn()
                    .expect("spawn fi_pingpong client");
                let c_out = wait_or_stop(client_child, deadline);
                let s_out = wait_or_stop(server_child, deadline + Duration::from_secs(5));
                for (who, out) in [("server", s_out), ("client", c_out)] {
                    let (Ok(o) | Err(o)) = &out;
                    let text = printed(o);
                    let ok = out.as_ref().is_ok_and(|o| o.status.success());
                    // fi_pingpong's result row: size, sent, =acked, ...
                    if !ok
                        || !text
                            .lines()
                            .any(|l| l.starts_with("1k ") && l.contains("=100"))
                    {
                        return Err(format!(
                            "{who} (ok: {ok}) printed no `1k 100 =100` row:\n{text}"
                        ));
                    }
                }
                Ok(())
            }),
        ),
    ];
    run_cases(test, cases);
}
