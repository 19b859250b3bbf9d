//! The cases. Each is a short script against [`Ctx`]: set a QP up on the target, send what
//! the situation needs, and hold every answer (frames, completions, memory, timing) against
//! the rule the case cites. Requests go to the target's responder; where the target is the
//! requester, the peer plays the responder and answers (or does not) as the case needs.

use std::time::{Duration, Instant};

use super::agent::TargetCounters;
use super::case::{describe_all, describe_completions, pattern, Case, CaseError, Ctx, Rc};
use super::peer::{acknowledge, Heard};
use xroce::engine::WrOp;
use xroce::wire::{AethRepr, NakCode, Opcode, PacketRepr, Psn, Syndrome};

const ACK: Syndrome = Syndrome::Ack { credit: 0x1F };

/// Every case, in the order they run.
pub fn catalogue() -> Vec<Case> {
    vec![
        // --- the target as responder: success ---
        SEND_ONLY_SUCCESS,
        WRITE_ONLY_SUCCESS,
        WRITE_WITH_IMMEDIATE_SUCCESS,
        READ_SUCCESS,
        COMPARE_SWAP_SUCCESS,
        FETCH_ADD_SUCCESS,
        ZERO_LENGTH_WRITE,
        ACK_COALESCING_MSN,
        PSN_WRAP,
        // --- the target as responder: sequence errors and duplicates ---
        PSN_SEQUENCE_ERROR_NAK_ONCE,
        DUPLICATE_SEND_REACKED,
        DUPLICATE_WRITE_REACKED,
        DUPLICATE_READ_REPLAY,
        DUPLICATE_ATOMIC,
        // --- the target as responder: errors ---
        RKEY_VIOLATION_WRITE,
        RKEY_VIOLATION_READ,
        OUT_OF_BOUNDS_WRITE,
        OUT_OF_BOUNDS_ATOMIC,
        WRONG_ACCESS_WRITE,
        WRONG_ACCESS_ATOMIC,
        MISALIGNED_ATOMIC,
        UNEXPECTED_OPCODE,
        FIRST_INSIDE_MESSAGE,
        SEND_LONGER_THAN_RECEIVE,
        MIDDLE_NOT_MTU,
        LAST_LONGER_THAN_MTU,
        ZERO_LENGTH_SEND,
        ZERO_LENGTH_READ,
        READ_DEPTH_EXCEEDED,
        UD_QKEY_VIOLATION,
        RNR_NAK_NO_RECEIVE,
        // --- the target as responder: what must be dropped ---
        BAD_ICRC_DROPPED,
        WRONG_PKEY_DROPPED,
        WRONG_DEST_QP_DROPPED,
        WRONG_SOURCE_DROPPED,
        // --- the target as requester ---
        GHOST_ACK,
        IMPLIED_NAK,
        ACK_TIMEOUT_RETRY,
        ACK_TIMEOUT_RETRY_CNT_7,
        PSN_RETRY_EXCEEDED,
        RNR_RETRY_EXCEEDED,
        RNR_RETRY_THEN_SUCCESS,
        REMOTE_ACCESS_ERROR_NAK,
        REMOTE_OPERATIONAL_ERROR_NAK,
        BAD_RESPONSE,
        WRITE_RETRY_FROM_NAK_PSN,
        READ_RETRY_PARTIAL,
    ]
}

// ---------------------------------------------------------------------------------------
// checks shared by the cases

fn expect_ack(cx: &mut Ctx<'_>, heard: Option<&Heard>, psn: u32, msn: Option<u32>) {
    let want = match msn {
        Some(m) => format!("ACK psn={psn} msn={m}"),
        None => format!("ACK psn={psn}"),
    };
    let holds = heard.is_some_and(|h| {
        h.opcode == Opcode::RC_ACKNOWLEDGE
            && h.is_ack()
            && h.psn == psn
            && msn.is_none_or(|m| h.msn == Some(m))
    });
    cx.check(holds, want, describe_all(heard.cloned().as_slice()));
}

fn expect_nak(cx: &mut Ctx<'_>, heard: Option<&Heard>, psn: u32, code: NakCode) {
    let holds = heard.is_some_and(|h| h.is_nak(code) && h.psn == psn);
    cx.check(
        holds,
        format!(
            "{} psn={psn}",
            super::peer::syndrome_words(Syndrome::Nak(code))
        ),
        describe_all(heard.cloned().as_slice()),
    );
}

/// Reads the target's counters after a dropped frame and records each that grew (as a
/// measurement `counter NAME`). Where IBTA names a counter for the drop (`required`), a
/// drop nothing counted is a deviation: a tester cannot tell it from a frame never sent.
fn expect_counted(
    cx: &mut Ctx<'_>,
    before: &TargetCounters,
    what: &str,
    required: Option<&str>,
) -> Result<(), CaseError> {
    let after = cx.agent.counters()?;
    let grown = after.grown_since(before);
    for (name, delta) in &grown {
        cx.measure(&format!("counter {name}"), *delta as f64);
    }
    if let Some(counter) = required {
        let observed = match (&after.source, grown.is_empty()) {
            (None, _) => "the target exposes no counters".to_string(),
            (Some(source), true) => format!("no counter moved ({source})"),
            (Some(_), false) => grown
                .iter()
                .map(|(name, delta)| format!("{name} +{delta}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        cx.check(
            !grown.is_empty(),
            format!("the drop {what} counted ({counter})"),
            observed,
        );
    }
    Ok(())
}

/// No frame at all from the target within the quiet window (not only none on `rc`'s QP: a
/// frame the target should not have taken may be answered from anywhere).
fn expect_no_frame(cx: &mut Ctx<'_>, what: &str) -> Result<(), CaseError> {
    let quiet = cx.windows.quiet;
    let got = cx.peer.collect_where(Instant::now() + quiet, |_| true)?;
    cx.check(got.is_empty(), what, describe_all(&got));
    Ok(())
}

fn expect_nothing(cx: &mut Ctx<'_>, rc: &Rc, what: &str) -> Result<(), CaseError> {
    let got = cx.quiet(rc)?;
    cx.check(
        got.is_empty(),
        format!("nothing {what}"),
        describe_all(&got),
    );
    Ok(())
}

fn expect_memory(
    cx: &mut Ctx<'_>,
    rc: &Rc,
    offset: usize,
    want: &[u8],
    what: &str,
) -> Result<(), CaseError> {
    let got = cx.memory(rc, offset, want.len())?;
    let observed = if got == want {
        "it does".to_string()
    } else {
        let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        format!("it differs from byte {first}")
    };
    cx.check(got == want, what.to_string(), observed);
    Ok(())
}

fn expect_completion(
    cx: &mut Ctx<'_>,
    rc: &Rc,
    status: &str,
    what: &str,
) -> Result<Vec<super::agent::Completion>, CaseError> {
    let wcs = cx.completions(rc, 1)?;
    let holds = wcs.len() == 1 && wcs[0].status_name == status;
    cx.check(
        holds,
        format!("{what}: {status}"),
        describe_completions(&wcs),
    );
    Ok(wcs)
}

fn expect_no_more_completions(cx: &mut Ctx<'_>, rc: &Rc) -> Result<(), CaseError> {
    let quiet = cx.windows.quiet;
    let more = cx.completions_within(rc, 4, quiet)?;
    cx.check(
        more.is_empty(),
        "no other completion",
        describe_completions(&more),
    );
    Ok(())
}

fn u64_at(bytes: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[..8]);
    u64::from_ne_bytes(b)
}

fn next(psn: u32, n: u32) -> u32 {
    Psn::new(psn).wrapping_add(n).value()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------
// the target as responder: success

const SEND_ONLY_SUCCESS: Case = Case {
    name: "send_only_success",
    rule: "IBTA 9.7.5.1 (an ACK for a request with AckReq), C9-148 (MSN counts messages)",
    summary: "a SEND_ONLY into a posted receive is ACKed with its PSN and MSN 1 and completes the receive with the payload",
    run: send_only_success,
};

fn send_only_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.post_recv(&rc.qp, 1, &rc.mr, 0, 256)?;
    let data = pattern(1, 100);
    cx.send(&rc.request(Opcode::RC_SEND_ONLY, rc.psn, &data))?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    let wcs = cx.completions(&rc, 1)?;
    let holds = wcs.len() == 1 && wcs[0].status_name == "IBV_WC_SUCCESS" && wcs[0].byte_len == 100;
    cx.check(
        holds,
        "one receive completion: IBV_WC_SUCCESS, 100 bytes",
        describe_completions(&wcs),
    );
    expect_memory(cx, &rc, 0, &data, "the receive buffer holds the payload")
}

const WRITE_ONLY_SUCCESS: Case = Case {
    name: "write_only_success",
    rule: "IBTA 9.4.3 (RDMA WRITE), 9.7.5.1",
    summary: "an RDMA WRITE_ONLY is ACKed and its payload is in the target's memory",
    run: write_only_success,
};

fn write_only_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(2, 200);
    cx.send(&rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 64, 200, &data))?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    expect_memory(cx, &rc, 64, &data, "the memory holds the payload")
}

const WRITE_WITH_IMMEDIATE_SUCCESS: Case = Case {
    name: "write_with_immediate_success",
    rule: "IBTA 9.4.3, 10.7.2.2 (a WRITE with immediate consumes a receive WQE)",
    summary:
        "a WRITE_ONLY_WITH_IMMEDIATE is ACKed, written, and completes a receive with the immediate",
    run: write_with_immediate_success,
};

fn write_with_immediate_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.post_recv(&rc.qp, 7, &rc.mr, 4096, 64)?;
    let data = pattern(3, 40);
    cx.send(&rc.rdma(
        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        rc.psn,
        128,
        40,
        &data,
    ))?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    let wcs = cx.completions(&rc, 1)?;
    let holds = wcs.len() == 1
        && wcs[0].status_name == "IBV_WC_SUCCESS"
        && wcs[0].opcode == "recv_rdma_imm"
        && wcs[0].wr_id == 7;
    cx.check(
        holds,
        "the posted receive completes: recv_rdma_imm IBV_WC_SUCCESS",
        describe_completions(&wcs),
    );
    expect_memory(cx, &rc, 128, &data, "the memory holds the payload")
}

const READ_SUCCESS: Case = Case {
    name: "read_success",
    rule: "IBTA 9.4.4 (RDMA READ), 9.7.5.1 (READ responses: FIRST/MIDDLE/LAST with AETH on FIRST and LAST)",
    summary: "a 3000-byte READ at MTU 1024 is answered by three responses at the request's PSN and the next two, carrying the memory",
    run: read_success,
};

fn read_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(4, 3000);
    cx.agent.write_mem(&rc.mr, 0, &data)?;
    cx.send(&rc.rdma(Opcode::RC_RDMA_READ_REQUEST, rc.psn, 0, 3000, &[]))?;
    let mut got = Vec::new();
    for _ in 0..3 {
        match cx.answer(&rc)? {
            Some(h) => got.push(h),
            None => break,
        }
    }
    let ops: Vec<Opcode> = got.iter().map(|h| h.opcode).collect();
    let psns: Vec<u32> = got.iter().map(|h| h.psn).collect();
    let want_ops = [
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
    ];
    cx.check(
        ops == want_ops && psns == [rc.psn, next(rc.psn, 1), next(rc.psn, 2)],
        format!(
            "READ_RESPONSE FIRST/MIDDLE/LAST at psn {}, {}, {}",
            rc.psn,
            next(rc.psn, 1),
            next(rc.psn, 2)
        ),
        describe_all(&got),
    );
    let aeth_ok = got.len() == 3
        && got[0].is_ack()
        && got[1].syndrome.is_none()
        && got[2].is_ack()
        && got[2].msn == Some(1);
    cx.check(
        aeth_ok,
        "AETH (ACK) on FIRST and LAST, none on MIDDLE; MSN 1 on LAST",
        describe_all(&got),
    );
    let bytes: Vec<u8> = got.iter().flat_map(|h| h.payload.clone()).collect();
    cx.check(
        bytes == data,
        "the responses carry the 3000 bytes of memory",
        format!(
            "{} bytes, {}",
            bytes.len(),
            if bytes == data { "equal" } else { "different" }
        ),
    );
    Ok(())
}

const COMPARE_SWAP_SUCCESS: Case = Case {
    name: "compare_swap_success",
    rule: "IBTA 9.4.5 (atomic operations), 9.7.5.1 (ATOMIC ACKNOWLEDGE with the original value)",
    summary: "a matching COMPARE_SWAP returns the original value and swaps the memory",
    run: compare_swap_success,
};

fn compare_swap_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let old = 0x0102_0304_0506_0708u64;
    cx.agent.write_mem(&rc.mr, 8, &old.to_ne_bytes())?;
    cx.send(&rc.atomic(Opcode::RC_COMPARE_SWAP, rc.psn, 8, 0xAAAA, old))?;
    let a = cx.answer(&rc)?;
    let holds = a.as_ref().is_some_and(|h| {
        h.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && h.psn == rc.psn && h.atomic_orig == Some(old)
    });
    cx.check(
        holds,
        format!("ATOMIC_ACKNOWLEDGE psn={} orig={old:#x}", rc.psn),
        describe_all(a.as_slice()),
    );
    let mem = u64_at(&cx.memory(&rc, 8, 8)?);
    cx.check(
        mem == 0xAAAA,
        "memory swapped to 0xaaaa",
        format!("{mem:#x}"),
    );
    Ok(())
}

const FETCH_ADD_SUCCESS: Case = Case {
    name: "fetch_add_success",
    rule: "IBTA 9.4.5, 9.7.5.1",
    summary: "a FETCH_ADD returns the original value and adds to the memory",
    run: fetch_add_success,
};

fn fetch_add_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.write_mem(&rc.mr, 16, &100u64.to_ne_bytes())?;
    cx.send(&rc.atomic(Opcode::RC_FETCH_ADD, rc.psn, 16, 23, 0))?;
    let a = cx.answer(&rc)?;
    let holds = a.as_ref().is_some_and(|h| {
        h.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && h.psn == rc.psn && h.atomic_orig == Some(100)
    });
    cx.check(
        holds,
        format!("ATOMIC_ACKNOWLEDGE psn={} orig=0x64", rc.psn),
        describe_all(a.as_slice()),
    );
    let mem = u64_at(&cx.memory(&rc, 16, 8)?);
    cx.check(mem == 123, "memory 123", format!("{mem}"));
    Ok(())
}

const ZERO_LENGTH_WRITE: Case = Case {
    name: "zero_length_write",
    rule: "IBTA 9.4.3 / 9.7.4.1.5 (a zero-length RDMA operation checks no R_Key)",
    summary: "a WRITE_ONLY of length 0 with R_Key 0 is ACKed",
    run: zero_length_write,
};

fn zero_length_write(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mut p = rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 0, &[]);
    if let Some(r) = p.reth.as_mut() {
        r.rkey = 0;
        r.va = 0;
    }
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    Ok(())
}

const ACK_COALESCING_MSN: Case = Case {
    name: "ack_coalescing_msn",
    rule: "IBTA 9.7.5.1.2 (one ACK may acknowledge several requests), C9-148 (MSN)",
    summary:
        "three WRITEs without AckReq and a fourth with it get one ACK, for the fourth PSN, MSN 4",
    run: ack_coalescing_msn,
};

fn ack_coalescing_msn(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(5, 32);
    for i in 0..4u32 {
        let mut p = rc.rdma(
            Opcode::RC_RDMA_WRITE_ONLY,
            next(rc.psn, i),
            (i * 32) as u64,
            32,
            &data,
        );
        p.bth.ack_req = i == 3;
        cx.send(&p)?;
    }
    let window = cx.windows.answer.min(Duration::from_millis(500));
    let got = cx.gather(&rc, window)?;
    let last = next(rc.psn, 3);
    let holds = got.len() == 1 && got[0].is_ack() && got[0].psn == last && got[0].msn == Some(4);
    cx.check(
        holds,
        format!("one ACK psn={last} msn=4"),
        describe_all(&got),
    );
    Ok(())
}

const PSN_WRAP: Case = Case {
    name: "psn_wrap",
    rule: "IBTA 9.7.1 (PSNs are 24 bits and wrap)",
    summary: "WRITEs at PSN 0xFFFFFE, 0xFFFFFF, 0 and 1 are each ACKed at their PSN",
    run: psn_wrap,
};

fn psn_wrap(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.rq_psn = 0xFF_FFFE)?;
    let data = pattern(6, 16);
    let mut acks = Vec::new();
    for i in 0..4u32 {
        let psn = next(rc.psn, i);
        cx.send(&rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, psn, (i * 16) as u64, 16, &data))?;
        if let Some(h) = cx.answer(&rc)? {
            acks.push(h);
        }
    }
    let psns: Vec<u32> = acks.iter().filter(|h| h.is_ack()).map(|h| h.psn).collect();
    cx.check(
        psns == [0xFF_FFFE, 0xFF_FFFF, 0, 1],
        "ACKs at psn 16777214, 16777215, 0, 1",
        describe_all(&acks),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// sequence errors and duplicates

const PSN_SEQUENCE_ERROR_NAK_ONCE: Case = Case {
    name: "psn_sequence_error_nak_once",
    rule: "IBTA 9.7.5.2.1, 9.9.3.1 Table 63 class B (one PSN sequence error NAK, then silence until the expected PSN)",
    summary: "WRITE_FIRST p, MIDDLE p+1 skipped, LAST p+2: one NAK PSN-sequence-error for p+1, nothing for LAST p+2 again, the message completes once p+1 and p+2 come",
    run: psn_sequence_error_nak_once,
};

fn psn_sequence_error_nak_once(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mtu = rc.mtu();
    let data = pattern(7, 3 * mtu);
    let len = data.len() as u32;
    let (p0, p1, p2) = (rc.psn, next(rc.psn, 1), next(rc.psn, 2));
    let mut first = rc.rdma(Opcode::RC_RDMA_WRITE_FIRST, p0, 0, len, &data[..mtu]);
    first.bth.ack_req = false;
    let mut middle = rc.request(Opcode::RC_RDMA_WRITE_MIDDLE, p1, &data[mtu..2 * mtu]);
    middle.bth.ack_req = false;
    let last = rc.request(Opcode::RC_RDMA_WRITE_LAST, p2, &data[2 * mtu..]);
    cx.send(&first)?;
    cx.send(&last)?;
    let started = Instant::now();
    let a = cx.answer(&rc)?;
    if a.is_some() {
        cx.measure("nak_after_ms", ms(started.elapsed()));
    }
    expect_nak(cx, a.as_ref(), p1, NakCode::PsnSequenceError);
    cx.send(&last)?;
    expect_nothing(cx, &rc, "for the LAST sent again while p+1 is missing")?;
    cx.send(&middle)?;
    cx.send(&last)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), p2, Some(1));
    expect_memory(cx, &rc, 0, &data, "the memory holds the whole message")
}

const DUPLICATE_SEND_REACKED: Case = Case {
    name: "duplicate_send_reacked",
    rule: "IBTA 9.7.5.1.1, C9-105 (a duplicate SEND is acknowledged, not executed again)",
    summary: "a SEND sent twice is ACKed twice and fills one receive",
    run: duplicate_send_reacked,
};

fn duplicate_send_reacked(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.post_recv(&rc.qp, 1, &rc.mr, 0, 256)?;
    cx.agent.post_recv(&rc.qp, 2, &rc.mr, 256, 256)?;
    let data = pattern(8, 50);
    let p = rc.request(Opcode::RC_SEND_ONLY, rc.psn, &data);
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, None);
    let wcs = cx.completions(&rc, 2)?;
    cx.check(
        wcs.len() == 1 && wcs[0].wr_id == 1,
        "one receive completed (wr_id 1)",
        describe_completions(&wcs),
    );
    expect_no_more_completions(cx, &rc)
}

const DUPLICATE_WRITE_REACKED: Case = Case {
    name: "duplicate_write_reacked",
    rule: "IBTA 9.7.5.1.1, C9-105 (a duplicate WRITE is acknowledged, not executed again)",
    summary: "a WRITE repeated at its PSN with other bytes is ACKed and does not change the memory",
    run: duplicate_write_reacked,
};

fn duplicate_write_reacked(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(9, 64);
    let other = pattern(99, 64);
    cx.send(&rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data))?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    cx.send(&rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &other))?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, None);
    expect_memory(
        cx,
        &rc,
        0,
        &data,
        "the memory still holds the first WRITE's bytes",
    )
}

const DUPLICATE_READ_REPLAY: Case = Case {
    name: "duplicate_read_replay",
    rule: "IBTA 9.7.5.1.1 (a duplicate READ is executed again, whole or from a later PSN of it)",
    summary: "a READ repeated at its PSN is answered again in full; repeated from its second PSN with the matching RETH, from there",
    run: duplicate_read_replay,
};

fn duplicate_read_replay(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mtu = rc.mtu();
    let data = pattern(10, 3000);
    cx.agent.write_mem(&rc.mr, 0, &data)?;
    let read = rc.rdma(Opcode::RC_RDMA_READ_REQUEST, rc.psn, 0, 3000, &[]);
    cx.send(&read)?;
    let first: Vec<Heard> = (0..3)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    cx.check(
        first.len() == 3,
        "three READ responses",
        describe_all(&first),
    );
    // Whole again.
    cx.send(&read)?;
    let again: Vec<Heard> = (0..3)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    let bytes: Vec<u8> = again.iter().flat_map(|h| h.payload.clone()).collect();
    let psns: Vec<u32> = again.iter().map(|h| h.psn).collect();
    cx.check(
        bytes == data && psns == [rc.psn, next(rc.psn, 1), next(rc.psn, 2)],
        "the READ repeated: three responses again at the same PSNs with the same bytes",
        describe_all(&again),
    );
    // From its second PSN.
    let mut tail = rc.rdma(
        Opcode::RC_RDMA_READ_REQUEST,
        next(rc.psn, 1),
        mtu as u64,
        (3000 - mtu) as u32,
        &[],
    );
    tail.bth.ack_req = true;
    cx.send(&tail)?;
    let part: Vec<Heard> = (0..2)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    let bytes: Vec<u8> = part.iter().flat_map(|h| h.payload.clone()).collect();
    let psns: Vec<u32> = part.iter().map(|h| h.psn).collect();
    cx.check(
        bytes == data[mtu..] && psns == [next(rc.psn, 1), next(rc.psn, 2)],
        format!(
            "from the middle: two responses at psn {} and {} with bytes {mtu}..3000",
            next(rc.psn, 1),
            next(rc.psn, 2)
        ),
        describe_all(&part),
    );
    Ok(())
}

const DUPLICATE_ATOMIC: Case = Case {
    name: "duplicate_atomic",
    rule: "IBTA 9.7.5.1.1, C9-105 (a duplicate atomic returns the saved original value, not executed twice)",
    summary: "a FETCH_ADD repeated at its PSN returns the first original value and adds once",
    run: duplicate_atomic,
};

fn duplicate_atomic(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.write_mem(&rc.mr, 0, &1000u64.to_ne_bytes())?;
    let p = rc.atomic(Opcode::RC_FETCH_ADD, rc.psn, 0, 1, 0);
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    cx.check(
        a.as_ref().is_some_and(|h| h.atomic_orig == Some(1000)),
        "ATOMIC_ACKNOWLEDGE orig=0x3e8",
        describe_all(a.as_slice()),
    );
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    cx.check(
        a.as_ref().is_some_and(|h| {
            h.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && h.atomic_orig == Some(1000)
        }),
        "the duplicate answered with the saved value: ATOMIC_ACKNOWLEDGE orig=0x3e8",
        describe_all(a.as_slice()),
    );
    let mem = u64_at(&cx.memory(&rc, 0, 8)?);
    cx.check(mem == 1001, "memory 1001 (added once)", format!("{mem}"));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// errors

const RKEY_VIOLATION_WRITE: Case = Case {
    name: "rkey_violation_write",
    rule: "IBTA 9.7.4.1.5 (R_Key check), 9.9.3.1 Table 63 class C (NAK remote access error)",
    summary:
        "a WRITE with a wrong R_Key gets NAK remote access error and leaves the memory untouched",
    run: rkey_violation_write,
};

fn rkey_violation_write(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(11, 64);
    let mut p = rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data);
    if let Some(r) = p.reth.as_mut() {
        r.rkey ^= 0x00AB_0000;
    }
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::RemoteAccessError);
    expect_memory(cx, &rc, 0, &[0; 64], "the memory is untouched")
}

const RKEY_VIOLATION_READ: Case = Case {
    name: "rkey_violation_read",
    rule: "IBTA 9.7.4.1.5, 9.9.3.1 class C",
    summary: "a READ with a wrong R_Key gets NAK remote access error and no data",
    run: rkey_violation_read,
};

fn rkey_violation_read(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mut p = rc.rdma(Opcode::RC_RDMA_READ_REQUEST, rc.psn, 0, 64, &[]);
    if let Some(r) = p.reth.as_mut() {
        r.rkey ^= 0x00AB_0000;
    }
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::RemoteAccessError);
    Ok(())
}

const OUT_OF_BOUNDS_WRITE: Case = Case {
    name: "out_of_bounds_write",
    rule: "IBTA 9.7.4.1.5 (the range must lie inside the MR), 9.9.3.1 class C",
    summary: "a WRITE that runs past the MR's end gets NAK remote access error, memory untouched",
    run: out_of_bounds_write,
};

fn out_of_bounds_write(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(12, 64);
    let at = (super::case::MR_LEN - 32) as u64;
    cx.send(&rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, at, 64, &data))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::RemoteAccessError);
    expect_memory(
        cx,
        &rc,
        super::case::MR_LEN - 32,
        &[0; 32],
        "the MR's last 32 bytes are untouched",
    )
}

const OUT_OF_BOUNDS_ATOMIC: Case = Case {
    name: "out_of_bounds_atomic",
    rule: "IBTA 9.7.4.1.5, 9.9.3.1 class C",
    summary: "a FETCH_ADD past the MR's end gets NAK remote access error",
    run: out_of_bounds_atomic,
};

fn out_of_bounds_atomic(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let at = super::case::MR_LEN as u64;
    cx.send(&rc.atomic(Opcode::RC_FETCH_ADD, rc.psn, at, 1, 0))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::RemoteAccessError);
    Ok(())
}

const WRONG_ACCESS_WRITE: Case = Case {
    name: "wrong_access_write",
    rule: "IBTA 9.7.4.1.5 (the MR must grant the access the request needs), 9.9.3.1 class C",
    summary: "a WRITE into an MR registered for remote READ only gets NAK remote access error, memory untouched",
    run: wrong_access_write,
};

fn wrong_access_write(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc_with_access(&["local_write", "remote_read"], |_| {})?;
    let data = pattern(26, 64);
    cx.send(&rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::RemoteAccessError);
    expect_memory(cx, &rc, 0, &[0; 64], "the memory is untouched")
}

const WRONG_ACCESS_ATOMIC: Case = Case {
    name: "wrong_access_atomic",
    rule: "IBTA 9.7.4.1.5, 9.9.3.1 class C",
    summary: "a FETCH_ADD on an MR registered for remote READ only gets NAK remote access error, memory untouched",
    run: wrong_access_atomic,
};

fn wrong_access_atomic(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc_with_access(&["local_write", "remote_read"], |_| {})?;
    cx.send(&rc.atomic(Opcode::RC_FETCH_ADD, rc.psn, 0, 1, 0))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::RemoteAccessError);
    expect_memory(cx, &rc, 0, &[0; 8], "the memory is untouched")
}

const MISALIGNED_ATOMIC: Case = Case {
    name: "misaligned_atomic",
    rule: "IBTA 9.4.5 (an atomic's VA is 8-byte aligned), 9.9.3.1 class C (NAK invalid request)",
    summary: "a FETCH_ADD at an odd address gets NAK invalid request, memory untouched",
    run: misaligned_atomic,
};

fn misaligned_atomic(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.send(&rc.atomic(Opcode::RC_FETCH_ADD, rc.psn, 4, 1, 0))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::InvalidRequest);
    expect_memory(cx, &rc, 0, &[0; 16], "the memory is untouched")
}

const UNEXPECTED_OPCODE: Case = Case {
    name: "unexpected_opcode",
    rule: "IBTA 9.9.3.1, Table 63 class C (opcode sequence: a MIDDLE without a FIRST is an invalid request)",
    summary: "a WRITE_MIDDLE outside any message gets NAK invalid request",
    run: unexpected_opcode,
};

fn unexpected_opcode(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(13, rc.mtu());
    cx.send(&rc.request(Opcode::RC_RDMA_WRITE_MIDDLE, rc.psn, &data))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::InvalidRequest);
    Ok(())
}

const FIRST_INSIDE_MESSAGE: Case = Case {
    name: "first_inside_message",
    rule: "IBTA 9.9.3.1, Table 63 class C (opcode sequence: a new FIRST while a message is in progress)",
    summary: "WRITE_FIRST p then WRITE_FIRST p+1 gets NAK invalid request at p+1",
    run: first_inside_message,
};

fn first_inside_message(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mtu = rc.mtu();
    let data = pattern(14, mtu);
    let mut first = rc.rdma(
        Opcode::RC_RDMA_WRITE_FIRST,
        rc.psn,
        0,
        2 * mtu as u32,
        &data,
    );
    first.bth.ack_req = false;
    cx.send(&first)?;
    let second = rc.rdma(
        Opcode::RC_RDMA_WRITE_FIRST,
        next(rc.psn, 1),
        0,
        2 * mtu as u32,
        &data,
    );
    cx.send(&second)?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), next(rc.psn, 1), NakCode::InvalidRequest);
    Ok(())
}

const SEND_LONGER_THAN_RECEIVE: Case = Case {
    name: "send_longer_than_receive",
    rule: "IBTA 9.9.3.1, Table 63 class C (length error: NAK invalid request; the receive completes with a local length error)",
    summary: "a 200-byte SEND into a 64-byte receive gets NAK invalid request",
    run: send_longer_than_receive,
};

fn send_longer_than_receive(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.post_recv(&rc.qp, 1, &rc.mr, 0, 64)?;
    let data = pattern(15, 200);
    cx.send(&rc.request(Opcode::RC_SEND_ONLY, rc.psn, &data))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), rc.psn, NakCode::InvalidRequest);
    expect_completion(cx, &rc, "IBV_WC_LOC_LEN_ERR", "the receive completes")?;
    Ok(())
}

const MIDDLE_NOT_MTU: Case = Case {
    name: "middle_not_mtu",
    rule: "IBTA 9.7.5.1, 9.9.3.1 class C (a FIRST or MIDDLE packet carries exactly the path MTU)",
    summary: "a WRITE_MIDDLE of 100 bytes at MTU 1024 gets NAK invalid request",
    run: middle_not_mtu,
};

fn middle_not_mtu(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mtu = rc.mtu();
    let data = pattern(16, mtu);
    let mut first = rc.rdma(
        Opcode::RC_RDMA_WRITE_FIRST,
        rc.psn,
        0,
        3 * mtu as u32,
        &data,
    );
    first.bth.ack_req = false;
    cx.send(&first)?;
    cx.send(&rc.request(Opcode::RC_RDMA_WRITE_MIDDLE, next(rc.psn, 1), &data[..100]))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), next(rc.psn, 1), NakCode::InvalidRequest);
    Ok(())
}

const LAST_LONGER_THAN_MTU: Case = Case {
    name: "last_longer_than_mtu",
    rule: "IBTA 9.7.5.1, 9.9.3.1 class C (a LAST packet carries 1 to path-MTU bytes)",
    summary: "WRITE_FIRST p then a WRITE_LAST of MTU + 4 bytes gets NAK invalid request",
    run: last_longer_than_mtu,
};

fn last_longer_than_mtu(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mtu = rc.mtu();
    let data = pattern(23, mtu + 4);
    let mut first = rc.rdma(
        Opcode::RC_RDMA_WRITE_FIRST,
        rc.psn,
        0,
        (2 * mtu + 4) as u32,
        &data[..mtu],
    );
    first.bth.ack_req = false;
    cx.send(&first)?;
    cx.send(&rc.request(Opcode::RC_RDMA_WRITE_LAST, next(rc.psn, 1), &data))?;
    let a = cx.answer(&rc)?;
    expect_nak(cx, a.as_ref(), next(rc.psn, 1), NakCode::InvalidRequest);
    Ok(())
}

const ZERO_LENGTH_SEND: Case = Case {
    name: "zero_length_send",
    rule: "IBTA 9.4.1 (a SEND may carry no payload; it still consumes a receive)",
    summary: "a SEND_ONLY of 0 bytes is ACKed and completes a receive with length 0",
    run: zero_length_send,
};

fn zero_length_send(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.post_recv(&rc.qp, 5, &rc.mr, 0, 64)?;
    cx.send(&rc.request(Opcode::RC_SEND_ONLY, rc.psn, &[]))?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    let wcs = cx.completions(&rc, 1)?;
    cx.check(
        wcs.len() == 1 && wcs[0].status_name == "IBV_WC_SUCCESS" && wcs[0].byte_len == 0,
        "the receive completes: IBV_WC_SUCCESS, 0 bytes",
        describe_completions(&wcs),
    );
    Ok(())
}

const ZERO_LENGTH_READ: Case = Case {
    name: "zero_length_read",
    rule: "IBTA 9.4.4 / 9.7.4.1.5 (a zero-length READ checks no R_Key and is answered by one empty READ_RESPONSE_ONLY)",
    summary: "a READ of length 0 with R_Key 0 gets one READ_RESPONSE_ONLY without payload",
    run: zero_length_read,
};

fn zero_length_read(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let mut p = rc.rdma(Opcode::RC_RDMA_READ_REQUEST, rc.psn, 0, 0, &[]);
    if let Some(r) = p.reth.as_mut() {
        r.rkey = 0;
        r.va = 0;
    }
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    cx.check(
        a.as_ref().is_some_and(|h| {
            h.opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY
                && h.psn == rc.psn
                && h.payload.is_empty()
                && h.is_ack()
        }),
        format!(
            "READ_RESPONSE_ONLY psn={} without payload, AETH ACK",
            rc.psn
        ),
        describe_all(a.as_slice()),
    );
    Ok(())
}

const READ_DEPTH_EXCEEDED: Case = Case {
    name: "read_depth_exceeded",
    rule: "IBTA 9.7.5.1 (the responder keeps max_dest_rd_atomic READ resources; more READs than negotiated are refused with NAK invalid request, or served, never answered with wrong data)",
    summary: "with max_dest_rd_atomic 1, two READs at once get their right data in order, or NAK invalid request for the second",
    run: read_depth_exceeded,
};

fn read_depth_exceeded(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.max_dest_rd_atomic = 1)?;
    let data = pattern(24, 200);
    cx.agent.write_mem(&rc.mr, 0, &data)?;
    cx.send(&rc.rdma(Opcode::RC_RDMA_READ_REQUEST, rc.psn, 0, 100, &[]))?;
    cx.send(&rc.rdma(Opcode::RC_RDMA_READ_REQUEST, next(rc.psn, 1), 100, 100, &[]))?;
    let got: Vec<Heard> = (0..2)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    let served = got.len() == 2
        && got[0].opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY
        && got[0].psn == rc.psn
        && got[0].payload == data[..100]
        && got[1].opcode == Opcode::RC_RDMA_READ_RESPONSE_ONLY
        && got[1].psn == next(rc.psn, 1)
        && got[1].payload == data[100..];
    let refused = got.len() == 2
        && got[0].payload == data[..100]
        && got[1].is_nak(NakCode::InvalidRequest)
        && got[1].psn == next(rc.psn, 1);
    cx.measure("second_refused", if refused { 1.0 } else { 0.0 });
    cx.check(
        served || refused,
        "two READ_RESPONSE_ONLY with bytes 0..100 and 100..200, or the first and NAK invalid request for the second",
        describe_all(&got),
    );
    Ok(())
}

const UD_QKEY_VIOLATION: Case = Case {
    name: "ud_qkey_violation",
    rule: "IBTA 10.2.4 (Q_Keys): a UD datagram whose Q_Key does not match the QP's is dropped silently; 14.2.5.6 (PortInfo Q_KeyViolations): and counted",
    summary: "a UD SEND with the wrong Q_Key is not delivered and not answered, and a counter moves; with the right one it is delivered",
    run: ud_qkey_violation,
};

fn ud_qkey_violation(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    const QKEY: u32 = 0x1111_2222;
    let qp = cx.agent.create_qp(true)?;
    let mr = cx.agent.reg_mr(4096, &["local_write"])?;
    cx.agent.ud_ready(&qp, QKEY)?;
    // A UD receive takes the 40-byte GRH before the payload (IBTA 11.4.1.1).
    cx.agent.post_recv(&qp, 1, &mr, 0, 1024)?;
    cx.peer.drain()?;
    let data = pattern(25, 64);
    let peer_qpn = cx.next_peer_qpn;
    cx.next_peer_qpn += 1;
    let datagram = |qkey: u32| {
        let mut p = PacketRepr::new(Opcode::UD_SEND_ONLY, qp.qpn);
        p.payload = &data;
        p.deth = Some(xroce::wire::DethRepr {
            qkey,
            src_qp: peer_qpn,
        });
        p
    };
    let counted_before = cx.agent.counters()?;
    cx.send(&datagram(QKEY ^ 0xFF))?;
    let quiet = cx.windows.quiet;
    let wcs = cx.agent.poll(&qp, 1, quiet)?;
    cx.check(
        wcs.is_empty(),
        "no receive completion for the wrong Q_Key",
        describe_completions(&wcs),
    );
    expect_counted(
        cx,
        &counted_before,
        "of a wrong Q_Key",
        Some("IBTA 14.2.5.6 PortInfo Q_KeyViolations"),
    )?;
    cx.send(&datagram(QKEY))?;
    let wcs = cx.agent.poll(&qp, 1, cx.windows.answer)?;
    cx.check(
        wcs.len() == 1 && wcs[0].status_name == "IBV_WC_SUCCESS" && wcs[0].byte_len == 40 + 64,
        "the right Q_Key's datagram completes the receive: IBV_WC_SUCCESS, 40 + 64 bytes",
        describe_completions(&wcs),
    );
    let got = cx.agent.read_mem(&mr, 40, 64)?;
    cx.check(
        got == data,
        "the payload after the GRH",
        if got == data { "it is" } else { "it differs" },
    );
    let answers = cx
        .peer
        .collect_where(Instant::now(), |h| h.dest_qp == peer_qpn)?;
    cx.check(
        answers.is_empty(),
        "nothing sent back (UD has no ACKs)",
        describe_all(&answers),
    );
    Ok(())
}

const RNR_NAK_NO_RECEIVE: Case = Case {
    name: "rnr_nak_no_receive",
    rule: "IBTA 9.7.5.2.8 (RNR NAK with the responder's minimum RNR timer; the PSN is not consumed)",
    summary: "a SEND with no receive posted gets RNR NAK carrying min_rnr_timer; the same PSN succeeds once a receive is posted",
    run: rnr_nak_no_receive,
};

fn rnr_nak_no_receive(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.min_rnr_timer = 14)?;
    let data = pattern(17, 20);
    let p = rc.request(Opcode::RC_SEND_ONLY, rc.psn, &data);
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    cx.check(
        a.as_ref()
            .is_some_and(|h| h.psn == rc.psn && h.rnr_timer() == Some(14)),
        format!("RNR NAK (timer 14) psn={}", rc.psn),
        describe_all(a.as_slice()),
    );
    cx.agent.post_recv(&rc.qp, 1, &rc.mr, 0, 64)?;
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// dropped silently

const BAD_ICRC_DROPPED: Case = Case {
    name: "bad_icrc_dropped",
    rule: "IBTA 7.8 (ICRC), Annex A17 (RoCEv2 ICRC): a packet whose ICRC fails is dropped silently; 16.1.3.5 (PortCounters PortRcvErrors): and counted",
    summary: "a WRITE with a corrupted ICRC gets no answer, writes nothing and moves a counter; the same WRITE intact is ACKed",
    run: bad_icrc_dropped,
};

fn bad_icrc_dropped(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(18, 64);
    let p = rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data);
    let mut frame = cx.peer.compose(&p)?;
    let n = frame.len();
    frame[n - 1] ^= 0xFF;
    let counted_before = cx.agent.counters()?;
    cx.peer.send_frame(frame)?;
    expect_nothing(cx, &rc, "for the frame with the bad ICRC")?;
    expect_counted(
        cx,
        &counted_before,
        "of a bad ICRC",
        Some("IBTA 16.1.3.5 PortCounters PortRcvErrors"),
    )?;
    expect_memory(cx, &rc, 0, &[0; 64], "nothing written")?;
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    Ok(())
}

const WRONG_PKEY_DROPPED: Case = Case {
    name: "wrong_pkey_dropped",
    rule: "IBTA 9.6 (transport header checks), 10.9 (P_Keys): a packet whose P_Key does not match is dropped silently; 14.2.5.6 (PortInfo P_KeyViolations): and counted",
    summary: "a WRITE with P_Key 0x1234 gets no answer, writes nothing and moves a counter",
    run: wrong_pkey_dropped,
};

fn wrong_pkey_dropped(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(19, 64);
    let mut p = rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data);
    p.bth.pkey = 0x1234;
    let counted_before = cx.agent.counters()?;
    cx.send(&p)?;
    expect_nothing(cx, &rc, "for the frame with P_Key 0x1234")?;
    expect_counted(
        cx,
        &counted_before,
        "of a wrong P_Key",
        Some("IBTA 14.2.5.6 PortInfo P_KeyViolations"),
    )?;
    expect_memory(cx, &rc, 0, &[0; 64], "nothing written")?;
    p.bth.pkey = 0xFFFF;
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    Ok(())
}

const WRONG_SOURCE_DROPPED: Case = Case {
    name: "wrong_source_dropped",
    rule: "IBTA 9.6 (transport header checks): an RC packet from another address than the QP's peer is dropped silently",
    summary: "a WRITE to the right QP and PSN from another IP address gets no answer and writes nothing",
    run: wrong_source_dropped,
};

fn wrong_source_dropped(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(27, 64);
    let p = rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data);
    let real = cx.peer.local.ip;
    let o = real.octets();
    // Another host of the same /24 (never the peer's own address).
    let other = std::net::Ipv4Addr::new(o[0], o[1], o[2], o[3] ^ 0x80);
    cx.peer.local.ip = other;
    let frame = cx.peer.compose(&p);
    cx.peer.local.ip = real;
    let counted_before = cx.agent.counters()?;
    cx.peer.send_frame(frame?)?;
    expect_no_frame(cx, &format!("nothing for the frame from {other}"))?;
    expect_counted(cx, &counted_before, "of a frame from another address", None)?;
    expect_memory(cx, &rc, 0, &[0; 64], "nothing written")?;
    cx.send(&p)?;
    let a = cx.answer(&rc)?;
    expect_ack(cx, a.as_ref(), rc.psn, Some(1));
    Ok(())
}

const WRONG_DEST_QP_DROPPED: Case = Case {
    name: "wrong_dest_qp_dropped",
    rule: "IBTA 9.6 (transport header checks): a packet for a QP that does not exist is dropped silently",
    summary: "a WRITE to a QPN nobody has gets no answer",
    run: wrong_dest_qp_dropped,
};

fn wrong_dest_qp_dropped(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let data = pattern(20, 64);
    let mut p = rc.rdma(Opcode::RC_RDMA_WRITE_ONLY, rc.psn, 0, 64, &data);
    p.bth.dest_qp = rc.qpn() ^ 0x80_0000;
    let counted_before = cx.agent.counters()?;
    cx.send(&p)?;
    expect_no_frame(cx, "nothing for the frame to a QPN nobody has")?;
    expect_counted(cx, &counted_before, "of a frame to a QPN nobody has", None)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// the target as requester

/// The target posts a SEND of `len` bytes; the frame it sends.
fn target_sends(
    cx: &mut Ctx<'_>,
    rc: &Rc,
    wr_id: u64,
    len: usize,
) -> Result<Option<Heard>, CaseError> {
    cx.agent
        .post_send(&rc.qp, wr_id, WrOp::Send, &rc.mr, 0, len)?;
    cx.answer(rc)
}

const GHOST_ACK: Case = Case {
    name: "ghost_ack",
    rule: "IBTA 9.7.5.2 (an ACK for a PSN not outstanding is ignored)",
    summary: "an ACK for a PSN the target never sent changes nothing: its next SEND still starts at its first PSN and completes",
    run: ghost_ack,
};

fn ghost_ack(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.send(&acknowledge(rc.qpn(), next(rc.target_psn, 5), ACK, 5))?;
    let quiet = cx.windows.quiet;
    let early = cx.completions_within(&rc, 4, quiet)?;
    cx.check(
        early.is_empty(),
        "no completion from the ghost ACK",
        describe_completions(&early),
    );
    let s = target_sends(cx, &rc, 1, 16)?;
    cx.check(
        s.as_ref()
            .is_some_and(|h| h.opcode == Opcode::RC_SEND_ONLY && h.psn == rc.target_psn),
        format!("the SEND at the first PSN {}", rc.target_psn),
        describe_all(s.as_slice()),
    );
    cx.send(&acknowledge(rc.qpn(), rc.target_psn, ACK, 1))?;
    expect_completion(cx, &rc, "IBV_WC_SUCCESS", "the SEND completes")?;
    Ok(())
}

const IMPLIED_NAK: Case = Case {
    name: "implied_nak",
    rule: "IBTA 9.7.5.2 (an ACK past an outstanding READ implies its responses were lost: the READ is sent again)",
    summary: "the target sends READ p and SEND p+1; an ACK for p+1 alone makes it send the READ again",
    run: implied_nak,
};

fn implied_nak(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    // A long ACK timeout (1.07 s): a resend well before it is the implied NAK's, not the
    // timer's, even on a slow or busy target.
    let rc = cx.rc(|p| p.timeout = 18)?;
    let pattern_bytes = pattern(21, 64);
    // The peer's "memory": the READ reads 64 bytes of nothing in particular.
    cx.agent.post_send(
        &rc.qp,
        1,
        WrOp::Read {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        &rc.mr,
        0,
        64,
    )?;
    cx.agent
        .post_send(&rc.qp, 2, WrOp::Send, &rc.mr, 1024, 16)?;
    let first: Vec<Heard> = (0..2)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    let (t0, t1) = (rc.target_psn, next(rc.target_psn, 1));
    cx.check(
        first.len() == 2
            && first[0].opcode == Opcode::RC_RDMA_READ_REQUEST
            && first[0].psn == t0
            && first[1].opcode == Opcode::RC_SEND_ONLY
            && first[1].psn == t1,
        format!("READ_REQUEST psn={t0}, SEND_ONLY psn={t1}"),
        describe_all(&first),
    );
    let started = Instant::now();
    cx.send(&acknowledge(rc.qpn(), t1, ACK, 2))?;
    let again = cx.answer(&rc)?;
    if again.is_some() {
        cx.measure("resend_after_ms", ms(started.elapsed()));
    }
    let resent = again
        .as_ref()
        .is_some_and(|h| h.opcode == Opcode::RC_RDMA_READ_REQUEST && h.psn == t0);
    let soon = started.elapsed() < Duration::from_millis(500);
    cx.check(
        resent && soon,
        format!("the READ again at psn {t0} at once (not after the 1.07 s ACK timeout)"),
        format!(
            "{} after {:.1} ms",
            describe_all(again.as_slice()),
            ms(started.elapsed())
        ),
    );
    // Answer it; the READ and the SEND complete.
    let mut resp = PacketRepr::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, rc.qpn());
    resp.bth.psn = Psn::new(t0);
    resp.aeth = Some(AethRepr {
        syndrome: ACK,
        msn: 2,
    });
    resp.payload = &pattern_bytes;
    cx.send(&resp)?;
    // Going back to the READ resent the SEND after it too: acknowledge it again.
    cx.send(&acknowledge(rc.qpn(), t1, ACK, 2))?;
    let wcs = cx.completions(&rc, 2)?;
    cx.check(
        wcs.len() == 2 && wcs.iter().all(|w| w.status_name == "IBV_WC_SUCCESS"),
        "READ and SEND complete with IBV_WC_SUCCESS",
        describe_completions(&wcs),
    );
    expect_memory(
        cx,
        &rc,
        0,
        &pattern_bytes,
        "the READ's bytes in the target's memory",
    )
}

/// Sends of the target's one SEND until the target stops (or `watch` ends); their times.
fn retransmissions(cx: &mut Ctx<'_>, rc: &Rc, watch: Duration) -> Result<Vec<Heard>, CaseError> {
    let got = cx.gather(rc, watch)?;
    Ok(got
        .into_iter()
        .filter(|h| h.opcode == Opcode::RC_SEND_ONLY)
        .collect())
}

fn intervals_ms(sent: &[Heard]) -> Vec<f64> {
    sent.windows(2).map(|w| ms(w[1].at - w[0].at)).collect()
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn describe_intervals(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn ack_timeout_case(cx: &mut Ctx<'_>, timeout: u8, retry_cnt: u8) -> Result<(), CaseError> {
    let rc = cx.rc(|p| {
        p.timeout = timeout;
        p.retry_cnt = retry_cnt;
    })?;
    let t_ms = 4.096e-3 * f64::from(1u32 << timeout);
    let sends = retry_cnt as usize + 1;
    cx.agent.post_send(&rc.qp, 1, WrOp::Send, &rc.mr, 0, 16)?;
    // Long enough for every retry at 4 × the timeout (the spec's upper bound), and more.
    let watch = Duration::from_secs_f64((sends as f64 * 4.0 * t_ms + 500.0) / 1e3);
    let sent = retransmissions(cx, &rc, watch)?;
    let gaps = intervals_ms(&sent);
    cx.measure("transmissions", sent.len() as f64);
    if let Some(min) = gaps.iter().cloned().reduce(f64::min) {
        cx.measure("min_interval_ms", min);
    }
    if let Some(max) = gaps.iter().cloned().reduce(f64::max) {
        cx.measure("max_interval_ms", max);
    }
    cx.check(
        sent.len() == sends && sent.iter().all(|h| h.psn == rc.target_psn),
        format!(
            "the SEND {sends} times (1 + retry_cnt {retry_cnt}), all at psn {}",
            rc.target_psn
        ),
        format!("{} times", sent.len()),
    );
    // The peer stamps a frame when it reads it: one late stamp shortens the next gap by as
    // much as it lengthened the one before, so the timer's floor is judged on the mean gap
    // (each gap still bounded above).
    cx.check(
        !gaps.is_empty()
            && mean(&gaps) >= t_ms * 0.9
            && gaps.iter().all(|&g| g <= t_ms * 4.0 + 30.0),
        format!(
            "{t_ms:.1} to {:.1} ms between them (the timeout, at most 4 times it; the floor on their mean)",
            t_ms * 4.0
        ),
        format!("{} ms", describe_intervals(&gaps)),
    );
    let wcs = cx.completions(&rc, 1)?;
    cx.check(
        wcs.len() == 1 && wcs[0].status_name == "IBV_WC_RETRY_EXC_ERR",
        "the SEND completes: IBV_WC_RETRY_EXC_ERR",
        describe_completions(&wcs),
    );
    if wcs.is_empty() {
        cx.agent.modify(&rc.qp, "err")?;
    }
    Ok(())
}

const ACK_TIMEOUT_RETRY: Case = Case {
    name: "ack_timeout_retry",
    rule: "IBTA 9.7.6.1.3, C9-140 (local ACK timeout 4.096 µs × 2^timeout; retry_cnt retries, then RETRY_EXC_ERR)",
    summary: "with timeout 14 (67 ms) and retry_cnt 2, an unanswered SEND goes out 3 times, about 67 ms apart, then completes with RETRY_EXC_ERR",
    run: ack_timeout_retry,
};

fn ack_timeout_retry(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    ack_timeout_case(cx, 14, 2)
}

const ACK_TIMEOUT_RETRY_CNT_7: Case = Case {
    name: "ack_timeout_retry_cnt_7",
    rule: "IBTA 9.7.6.1.3, C9-140 (retry_cnt is a 3-bit count: 7 means 7 retries; only rnr_retry 7 means forever)",
    summary: "with retry_cnt 7 an unanswered SEND goes out 8 times and completes with RETRY_EXC_ERR",
    run: ack_timeout_retry_cnt_7,
};

fn ack_timeout_retry_cnt_7(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    ack_timeout_case(cx, 12, 7)
}

/// The target's SEND answered by `answer` each time it comes, up to `rounds` times; the
/// sends seen.
fn answer_each(
    cx: &mut Ctx<'_>,
    rc: &Rc,
    rounds: usize,
    answer: impl Fn(u32) -> PacketRepr<'static>,
) -> Result<Vec<Heard>, CaseError> {
    let mut sent = Vec::new();
    for _ in 0..rounds {
        match cx.answer(rc)? {
            Some(h) if h.opcode == Opcode::RC_SEND_ONLY => {
                let psn = h.psn;
                sent.push(h);
                cx.send(&answer(psn))?;
            }
            Some(_) => {}
            None => break,
        }
    }
    Ok(sent)
}

const PSN_RETRY_EXCEEDED: Case = Case {
    name: "psn_retry_exceeded",
    rule: "IBTA 9.7.5.2.1 (a PSN sequence error NAK makes the requester resend; it counts against retry_cnt)",
    summary: "a SEND answered by NAK PSN-sequence-error each time goes out retry_cnt + 1 times, then RETRY_EXC_ERR",
    run: psn_retry_exceeded,
};

fn psn_retry_exceeded(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.retry_cnt = 2)?;
    let qpn = rc.qpn();
    cx.agent.post_send(&rc.qp, 1, WrOp::Send, &rc.mr, 0, 16)?;
    let sent = answer_each(cx, &rc, 6, |psn| {
        acknowledge(qpn, psn, Syndrome::Nak(NakCode::PsnSequenceError), 0)
    })?;
    cx.measure("transmissions", sent.len() as f64);
    cx.check(
        sent.len() == 3,
        "the SEND 3 times (1 + retry_cnt 2)",
        format!("{} times", sent.len()),
    );
    expect_completion(cx, &rc, "IBV_WC_RETRY_EXC_ERR", "the SEND completes")?;
    Ok(())
}

const RNR_RETRY_EXCEEDED: Case = Case {
    name: "rnr_retry_exceeded",
    rule: "IBTA 9.7.5.2.8 (the requester waits the RNR NAK's timer, retries rnr_retry times, then RNR_RETRY_EXC_ERR)",
    summary: "a SEND answered by RNR NAK (timer 20, 10.24 ms) each time goes out rnr_retry + 1 times, at least 10.24 ms apart",
    run: rnr_retry_exceeded,
};

fn rnr_retry_exceeded(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.rnr_retry = 2)?;
    let qpn = rc.qpn();
    cx.agent.post_send(&rc.qp, 1, WrOp::Send, &rc.mr, 0, 16)?;
    let sent = answer_each(cx, &rc, 6, |psn| {
        acknowledge(qpn, psn, Syndrome::RnrNak { timer: 20 }, 0)
    })?;
    let gaps = intervals_ms(&sent);
    cx.measure("transmissions", sent.len() as f64);
    if let Some(min) = gaps.iter().cloned().reduce(f64::min) {
        cx.measure("min_interval_ms", min);
    }
    cx.check(
        sent.len() == 3,
        "the SEND 3 times (1 + rnr_retry 2)",
        format!("{} times", sent.len()),
    );
    cx.check(
        !gaps.is_empty() && mean(&gaps) >= 10.24 * 0.95,
        "at least 10.24 ms (RNR timer 20) between them (on their mean: the peer's stamps jitter)",
        format!("{} ms", describe_intervals(&gaps)),
    );
    expect_completion(cx, &rc, "IBV_WC_RNR_RETRY_EXC_ERR", "the SEND completes")?;
    Ok(())
}

const RNR_RETRY_THEN_SUCCESS: Case = Case {
    name: "rnr_retry_then_success",
    rule: "IBTA 9.7.5.2.8",
    summary:
        "a SEND answered by one RNR NAK goes out again after the timer and completes once ACKed",
    run: rnr_retry_then_success,
};

fn rnr_retry_then_success(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.rnr_retry = 3)?;
    let s = target_sends(cx, &rc, 1, 16)?;
    let Some(s) = s else {
        cx.check(false, "the target's SEND", "nothing");
        return Ok(());
    };
    cx.send(&acknowledge(
        rc.qpn(),
        s.psn,
        Syndrome::RnrNak { timer: 18 },
        0,
    ))?;
    let again = cx.answer(&rc)?;
    let gap = again.as_ref().map(|h| ms(h.at - s.at));
    if let Some(g) = gap {
        cx.measure("resend_after_ms", g);
    }
    cx.check(
        again.as_ref().is_some_and(|h| h.psn == s.psn) && gap.is_some_and(|g| g >= 5.12 * 0.95),
        "the SEND again at its PSN, at least 5.12 ms (RNR timer 18) later",
        format!("{} after {:?} ms", describe_all(again.as_slice()), gap),
    );
    cx.send(&acknowledge(rc.qpn(), s.psn, ACK, 1))?;
    expect_completion(cx, &rc, "IBV_WC_SUCCESS", "the SEND completes")?;
    Ok(())
}

fn nak_completes(cx: &mut Ctx<'_>, op: WrOp, code: NakCode, status: &str) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    cx.agent.post_send(&rc.qp, 1, op, &rc.mr, 0, 16)?;
    let Some(h) = cx.answer(&rc)? else {
        cx.check(false, "the target's request", "nothing");
        return Ok(());
    };
    cx.send(&acknowledge(rc.qpn(), h.psn, Syndrome::Nak(code), 0))?;
    expect_completion(cx, &rc, status, "the WR completes")?;
    let again = cx.quiet(&rc)?;
    let resent = again.iter().filter(|x| x.is_request()).count();
    cx.check(resent == 0, "no resend", describe_all(&again));
    Ok(())
}

const REMOTE_ACCESS_ERROR_NAK: Case = Case {
    name: "remote_access_error_nak",
    rule: "IBTA 9.7.5.2, 9.9.3.1 (a NAK remote access error is not retried: the WR completes with REM_ACCESS_ERR)",
    summary: "a WRITE answered by NAK remote access error completes with IBV_WC_REM_ACCESS_ERR, not retried",
    run: remote_access_error_nak,
};

fn remote_access_error_nak(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    nak_completes(
        cx,
        WrOp::Write {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        NakCode::RemoteAccessError,
        "IBV_WC_REM_ACCESS_ERR",
    )
}

const REMOTE_OPERATIONAL_ERROR_NAK: Case = Case {
    name: "remote_operational_error_nak",
    rule: "IBTA 9.7.5.2, 9.9.3.1 (a NAK remote operational error is not retried: the WR completes with REM_OP_ERR)",
    summary: "a SEND answered by NAK remote operational error completes with IBV_WC_REM_OP_ERR",
    run: remote_operational_error_nak,
};

fn remote_operational_error_nak(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    nak_completes(
        cx,
        WrOp::Send,
        NakCode::RemoteOperationalError,
        "IBV_WC_REM_OP_ERR",
    )
}

const BAD_RESPONSE: Case = Case {
    name: "bad_response",
    rule: "IBTA 9.7.5.2 (a response of the wrong kind for the outstanding request is a bad response: BAD_RESP_ERR)",
    summary: "a SEND answered by an ATOMIC ACKNOWLEDGE completes with IBV_WC_BAD_RESP_ERR",
    run: bad_response,
};

fn bad_response(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.retry_cnt = 1)?;
    let Some(h) = target_sends(cx, &rc, 1, 16)? else {
        cx.check(false, "the target's SEND", "nothing");
        return Ok(());
    };
    let mut p = PacketRepr::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, rc.qpn());
    p.bth.psn = Psn::new(h.psn);
    p.aeth = Some(AethRepr {
        syndrome: ACK,
        msn: 1,
    });
    p.atomic_ack_eth = Some(xroce::wire::AtomicAckEthRepr { orig_data: 7 });
    cx.send(&p)?;
    let wait = cx.windows.answer + Duration::from_millis(500);
    let wcs = cx.completions_within(&rc, 1, wait)?;
    cx.check(
        wcs.len() == 1 && wcs[0].status_name == "IBV_WC_BAD_RESP_ERR",
        "the SEND completes: IBV_WC_BAD_RESP_ERR",
        describe_completions(&wcs),
    );
    if wcs.is_empty() {
        cx.agent.modify(&rc.qp, "err")?;
    }
    Ok(())
}

const WRITE_RETRY_FROM_NAK_PSN: Case = Case {
    name: "write_retry_from_nak_psn",
    rule: "IBTA 9.7.5.2.1 (go-back-N: resend from the NAK's PSN, which acknowledges the packets before it)",
    summary: "a 3-packet WRITE answered by NAK PSN-sequence-error at its second PSN is resent from the MIDDLE, not the FIRST",
    run: write_retry_from_nak_psn,
};

fn write_retry_from_nak_psn(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|_| {})?;
    let len = 3 * rc.mtu();
    cx.agent.post_send(
        &rc.qp,
        1,
        WrOp::Write {
            remote_addr: 0x1000,
            rkey: 0x42,
        },
        &rc.mr,
        0,
        len,
    )?;
    let first: Vec<Heard> = (0..3)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    let t1 = next(rc.target_psn, 1);
    cx.check(
        first.len() == 3,
        "the WRITE's three packets",
        describe_all(&first),
    );
    cx.send(&acknowledge(
        rc.qpn(),
        t1,
        Syndrome::Nak(NakCode::PsnSequenceError),
        0,
    ))?;
    let again: Vec<Heard> = (0..2)
        .filter_map(|_| cx.answer(&rc).ok().flatten())
        .collect();
    let ops: Vec<(Opcode, u32)> = again.iter().map(|h| (h.opcode, h.psn)).collect();
    cx.check(
        ops == [
            (Opcode::RC_RDMA_WRITE_MIDDLE, t1),
            (Opcode::RC_RDMA_WRITE_LAST, next(t1, 1)),
        ],
        format!("WRITE_MIDDLE psn={t1}, WRITE_LAST psn={}", next(t1, 1)),
        describe_all(&again),
    );
    cx.send(&acknowledge(rc.qpn(), next(t1, 1), ACK, 1))?;
    expect_completion(cx, &rc, "IBV_WC_SUCCESS", "the WRITE completes")?;
    Ok(())
}

const READ_RETRY_PARTIAL: Case = Case {
    name: "read_retry_partial",
    rule: "IBTA 9.7.5.2 (a READ whose responses stop is requested again, whole or from the first missing response)",
    summary: "a 3-response READ that gets only its FIRST response is requested again, and completes with the data once answered",
    run: read_retry_partial,
};

fn read_retry_partial(cx: &mut Ctx<'_>) -> Result<(), CaseError> {
    let rc = cx.rc(|p| p.timeout = 12)?;
    let mtu = rc.mtu();
    let data = pattern(22, 3 * mtu);
    cx.agent.post_send(
        &rc.qp,
        1,
        WrOp::Read {
            remote_addr: 0x10_0000,
            rkey: 0x42,
        },
        &rc.mr,
        0,
        data.len(),
    )?;
    let Some(req) = cx.answer(&rc)? else {
        cx.check(false, "the target's READ request", "nothing");
        return Ok(());
    };
    let t0 = req.psn;
    let mut r = PacketRepr::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, rc.qpn());
    r.bth.psn = Psn::new(t0);
    r.aeth = Some(AethRepr {
        syndrome: ACK,
        msn: 0,
    });
    r.payload = &data[..mtu];
    cx.send(&r)?;
    // Nothing more: the target's timer runs out and it asks again.
    let again = cx.answer(&rc)?;
    let whole = again.as_ref().is_some_and(|h| {
        h.opcode == Opcode::RC_RDMA_READ_REQUEST
            && h.psn == t0
            && h.reth.is_some_and(|r| r.dma_len as usize == data.len())
    });
    let partial = again.as_ref().is_some_and(|h| {
        h.opcode == Opcode::RC_RDMA_READ_REQUEST
            && h.psn == next(t0, 1)
            && h.reth.is_some_and(|r| {
                r.dma_len as usize == data.len() - mtu && r.va == 0x10_0000 + mtu as u64
            })
    });
    cx.check(
        whole || partial,
        format!(
            "a READ request again: at psn {t0} for {} bytes, or at psn {} for the {} missing",
            data.len(),
            next(t0, 1),
            data.len() - mtu
        ),
        describe_all(again.as_slice()),
    );
    cx.measure("partial_retry", if partial { 1.0 } else { 0.0 });
    // Answer whatever it asked.
    let (from_psn, from) = if partial { (next(t0, 1), mtu) } else { (t0, 0) };
    let rest = &data[from..];
    let chunks: Vec<&[u8]> = rest.chunks(mtu).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let op = match (i, chunks.len()) {
            (_, 1) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
            (0, _) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            (i, n) if i + 1 == n => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        };
        let mut r = PacketRepr::new(op, rc.qpn());
        r.bth.psn = Psn::new(next(from_psn, i as u32));
        if op.info().is_some_and(|i| i.has_aeth) {
            r.aeth = Some(AethRepr {
                syndrome: ACK,
                msn: 1,
            });
        }
        r.payload = chunk;
        cx.send(&r)?;
    }
    expect_completion(cx, &rc, "IBV_WC_SUCCESS", "the READ completes")?;
    expect_memory(cx, &rc, 0, &data, "the READ's bytes in the target's memory")
}
