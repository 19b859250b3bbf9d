//! The engine section: two engines joined in memory on this thread, no driver, no link, no
//! kernel, moving 64-byte SENDs as fast as they go. What xroce's own transport costs a
//! message, both ends together on one core; the target's figure (at least 4 M messages/s).
//! `cargo bench --bench engine` measures the same with criterion, and 4 KiB WRITEs besides.
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use xroce::engine::{
    Access, CqId, Engine, EngineConfig, QpCaps, QpInit, QpType, SendFlags, SendWrRef, Sge, Wc,
    WcStatus, WrOp, MAX_FRAME_LEN,
};
use xroce::sim::workload::{connect, WorkloadConfig, IP_A, IP_B, MAC_A, MAC_B};

use super::EngineSection;

/// The message size of the engine row.
pub const ENGINE_MESSAGE: u32 = 64;
/// SENDs posted before the frames move (perftest's default window), one in 16 signaled.
const WINDOW: u64 = 128;

/// One end: its engine, QP, CQ, and an SGE over its memory.
struct End {
    engine: Engine,
    qpn: u32,
    cq: CqId,
    sge: Sge,
}

fn end(mac: [u8; 6], ip: std::net::Ipv4Addr) -> anyhow::Result<End> {
    let mut engine = Engine::new(EngineConfig::new(mac, IpAddr::V4(ip)));
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(4096).context("creating a CQ")?;
    let qpn = engine
        .create_qp(QpInit {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            caps: QpCaps {
                max_send_wr: 1024,
                max_recv_wr: 1024,
                ..QpCaps::default()
            },
            sq_sig_all: false,
            srq: None,
        })
        .context("creating a QP")?;
    let mr = engine
        .reg_mr(pd, 4096, Access::LOCAL_WRITE)
        .context("registering memory")?;
    let sge = Sge {
        addr: mr.addr,
        length: ENGINE_MESSAGE,
        lkey: mr.lkey,
    };
    Ok(End {
        engine,
        qpn,
        cq,
        sge,
    })
}

/// Moves every frame between the two engines until both are quiet.
fn pump(a: &mut End, b: &mut End, buf: &mut [u8]) {
    let now = xroce::engine::Instant::ZERO;
    loop {
        let mut moved = false;
        while let Some(n) = a.engine.poll_transmit(now, buf) {
            b.engine.handle_frame(now, &buf[..n]);
            moved = true;
        }
        while let Some(n) = b.engine.poll_transmit(now, buf) {
            a.engine.handle_frame(now, &buf[..n]);
            moved = true;
        }
        if !moved {
            break;
        }
    }
}

/// One window: B posts its receives, A posts the SENDs, the frames move, both CQs drain.
/// Returns the receive completions B got (each a message delivered).
fn window(a: &mut End, b: &mut End, buf: &mut [u8], wcs: &mut [Wc]) -> anyhow::Result<u64> {
    let recv = [b.sge];
    for i in 0..WINDOW {
        b.engine.post_recv_sges(b.qpn, i, &recv)?;
    }
    let send = [a.sge];
    let mut wr = SendWrRef {
        wr_id: 0,
        op: WrOp::Send,
        sg_list: &send,
        flags: SendFlags::default(),
        ud: None,
    };
    for i in 0..WINDOW {
        wr.wr_id = i;
        wr.flags = if i % 16 == 15 {
            SendFlags::SIGNALED
        } else {
            SendFlags::default()
        };
        a.engine.post_send_ref(a.qpn, &wr)?;
    }
    pump(a, b, buf);
    let mut delivered = 0;
    for (end, count) in [(&mut *a, false), (&mut *b, true)] {
        loop {
            let n = end.engine.poll_cq(end.cq, wcs)?;
            if n == 0 {
                break;
            }
            if let Some(bad) = wcs[..n].iter().find(|wc| wc.status != WcStatus::Success) {
                anyhow::bail!("the engine failed a message: {bad:?}");
            }
            if count {
                delivered += n as u64;
            }
        }
    }
    Ok(delivered)
}

/// Moves 64-byte SENDs between two engines for `duration` (after a warm-up of a tenth of it)
/// and reports the rate. Every window must deliver all its messages.
pub fn measure(duration: Duration) -> anyhow::Result<EngineSection> {
    let mut a = end(MAC_A, IP_A)?;
    let mut b = end(MAC_B, IP_B)?;
    let cfg = WorkloadConfig::default();
    connect(&mut a.engine, a.qpn, b.qpn, MAC_B, IP_B, 1, 1, &cfg).context("connecting A")?;
    connect(&mut b.engine, b.qpn, a.qpn, MAC_A, IP_A, 1, 1, &cfg).context("connecting B")?;
    let mut buf = vec![0u8; MAX_FRAME_LEN];
    let mut wcs = vec![Wc::EMPTY; 256];
    let warm_up = Instant::now();
    while warm_up.elapsed() < duration / 10 {
        window(&mut a, &mut b, &mut buf, &mut wcs)?;
    }
    // The rate of each tenth of the run as well as the whole: on a shared machine the core's
    // speed can drift within seconds, and their spread says whether it did during this row.
    // A tenth ends at the first window past its boundary (start + k tenths), so the last
    // ends with the run; a window longer than a tenth makes one tenth of two.
    let tenth = duration / 10;
    let (start, mut messages) = (Instant::now(), 0u64);
    let (mut tenth_start, mut tenth_messages, mut boundary) = (start, 0u64, 1u32);
    let mut tenths_mpps = Vec::with_capacity(10);
    let mut now = start;
    while now - start < duration {
        let delivered = window(&mut a, &mut b, &mut buf, &mut wcs)?;
        if delivered != WINDOW {
            anyhow::bail!("a window of {WINDOW} SENDs delivered {delivered}");
        }
        messages += delivered;
        tenth_messages += delivered;
        now = Instant::now();
        if now - start >= tenth * boundary {
            let seconds = (now - tenth_start).as_secs_f64();
            tenths_mpps.push(tenth_messages as f64 / seconds / 1e6);
            (tenth_start, tenth_messages) = (now, 0);
            while now - start >= tenth * boundary {
                boundary += 1;
            }
        }
    }
    let seconds = (now - start).as_secs_f64();
    Ok(EngineSection {
        size: ENGINE_MESSAGE as u64,
        messages,
        seconds,
        msg_rate_mpps: messages as f64 / seconds / 1e6,
        tenths_mpps,
    })
}

/// Above this ratio of the fastest tenth to the slowest, the row says the machine drifted.
const DRIFT: f64 = 1.15;

/// The spread of the row's tenths, and whether the machine's speed drifted during it.
pub fn tenths_line(tenths_mpps: &[f64]) -> Option<String> {
    let mut sorted = tenths_mpps.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (&slowest, &fastest) = (sorted.first()?, sorted.last()?);
    let median = sorted[sorted.len() / 2];
    let verdict = if fastest > DRIFT * slowest {
        format!(
            "the core's speed drifted during the row (the fastest tenth {:.2}x the slowest): \
             this machine, not the code, moves the figure by that much",
            fastest / slowest
        )
    } else {
        "steady".to_string()
    };
    Some(format!(
        "its {} tenths: {slowest:.2}-{fastest:.2} M msg/s, median {median:.2}: {verdict}",
        sorted.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tenths_line_tells_a_steady_row_from_a_drifting_one() {
        let steady = tenths_line(&[2.0, 2.1, 2.05, 1.95]).unwrap();
        assert_eq!(
            steady,
            "its 4 tenths: 1.95-2.10 M msg/s, median 2.05: steady"
        );
        let drifting = tenths_line(&[2.8, 1.4, 2.7, 2.6]).unwrap();
        assert!(
            drifting.starts_with(
                "its 4 tenths: 1.40-2.80 M msg/s, median 2.70: the core's speed drifted"
            ) && drifting.contains("2.00x the slowest"),
            "{drifting}"
        );
        assert_eq!(tenths_line(&[]), None);
    }

    #[test]
    fn the_engine_row_moves_every_message() {
        let e = measure(Duration::from_millis(50)).unwrap();
        assert!(e.messages >= WINDOW && e.messages % WINDOW == 0, "{e:?}");
        assert!(e.msg_rate_mpps > 0.0 && e.seconds >= 0.05, "{e:?}");
        // Ten tenths, fewer only if a window outlasted one (a long stall of the machine).
        assert!((1..=10).contains(&e.tenths_mpps.len()), "{e:?}");
        assert!(e.tenths_mpps.iter().all(|&r| r > 0.0), "{e:?}");
    }
}
