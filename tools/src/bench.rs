//! `xroce bench`: the limit, the alternative and xroce, measured side by side in one run on
//! veth pairs between two namespaces that the run creates and removes.
//!
//! 1. **Ceiling**: raw AF_XDP frames of RoCE sizes (RC RDMA WRITE_ONLY frames built with
//!    `xroce::wire`) through the same [`XdpDriver`](xroce::driver::xdp::XdpDriver) the verbs
//!    layer uses, no engine: a one-way stream each way (rate at the receiver, loss), and a
//!    ping-pong.
//! 2. **Kernel UDP** between the same two addresses (`std::net::UdpSocket`): a one-way
//!    stream of the same payload per packet each way, and a ping-pong.
//! 3. **xroce**: `xroce perf` servers in namespace B and clients in A, the bandwidth tests
//!    from 64 B to 1 MiB with one QP and with 16, the latency tests at 64 B and 4 KiB in each
//!    progress mode; every figure also as a ratio to the ceiling and to kernel UDP.
//! 4. **Scale**: `write_bw` with 1, 16, 256 and 1024 QPs, and what each QP costs in memory.
//! 5. **Threads**: `write_bw` and `send_bw` at 64 B with 2 QPs on one thread and on two
//!    (`perf --threads`), with one engine shard and with two (`--shards`), on a veth pair
//!    with 2 queues per end; message rates side by side with the ratio to one thread.
//! 6. **Library** (asked for by name): perftest's binaries on xroce's `libibverbs.so.1`
//!    beside `xroce perf`'s same test.
//! 7. **Engine**: two engines joined in memory in this process, on one core, moving 64-byte
//!    SENDs: xroce's own transport with no driver, link or kernel (no namespace: alone, it
//!    needs no root).
//!
//! The rows at 4 KiB run on a second veth pair at a jumbo MTU (9000 unless `--mtu`), where
//! one 4 KiB message is one packet; everything else on a pair at MTU 1500.
//!
//! Every process that sends or receives frames runs inside a namespace: this executable again as
//! `xroce bench-child '<json spec>'` ([`child`]), or `xroce perf`.
pub mod child;
mod engine;
pub mod hiccups;
pub mod targets;

mod plan;
mod render;
mod report;
mod run;

pub use plan::*;
pub use render::*;
pub use report::*;
pub use run::*;

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    #[test]
    fn perftest_rows_are_read() {
        let bw = "---\n #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n 65536      2000             2.68               0.83   \t\t   0.001591\n---\n";
        assert_eq!(
            parse_perftest(bw, false).unwrap(),
            PerfResult::Bw {
                gbps: 0.83,
                peak_gbps: 2.68,
                msg_rate_mpps: 0.001591
            }
        );
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       200          8.22           1303.43      9.31     \t       14.87       \t45.48  \t\t634.90  \t\t1303.43\n";
        assert_eq!(
            parse_perftest(lat, true).unwrap(),
            PerfResult::Lat {
                median: 9.31,
                p99: 634.90
            }
        );
        assert!(parse_perftest("Couldn't connect", false).is_err());
        assert!(parse_perftest(" #bytes x\n 64 100\n", false).is_err());
    }

    #[test]
    fn library_rows_say_whether_within_ten_percent() {
        let case = library_cases(&BenchOptions {
            sections: vec![Section::Library],
            ..BenchOptions::new("xroce".into())
        })[0]
            .clone();
        let bw = |g| PerfResult::Bw {
            gbps: g,
            peak_gbps: g,
            msg_rate_mpps: 0.0,
        };
        assert!(LibraryRow::new(&case, bw(0.95), bw(1.0)).within_10_percent);
        assert!(!LibraryRow::new(&case, bw(0.8), bw(1.0)).within_10_percent);
        assert_eq!(LibraryRow::new(&case, bw(0.5), bw(1.0)).ratio, 0.5);
        assert!(library_cases(&BenchOptions::new("xroce".into())).is_empty());
    }

    use super::*;

    fn opts() -> BenchOptions {
        BenchOptions::new(PathBuf::from("xroce"))
    }

    #[test]
    fn quick_plan_covers_every_section_with_few_runs() {
        let mut o = opts();
        o.quick = true;
        let p = plan(&o);
        assert_eq!(p.links.len(), 3);
        assert_eq!(p.links[0].mtu, 1500);
        assert_eq!(p.links[0].queues, 1);
        assert_eq!(p.links[0].path_mtu, 1024);
        assert_eq!(p.links[1].mtu, 9000);
        assert_eq!(p.links[1].path_mtu, 4096);
        assert_eq!(p.links[1].stream_payloads, vec![4096]);
        let runs: usize = p
            .links
            .iter()
            .map(|l| l.bw.len() + l.lat.len() + l.scale.len() + l.threads.len())
            .sum();
        assert!(runs <= 36, "{runs} perf runs in --quick");
        // The threads rows: their own pair, with a queue per shard of the largest run.
        let t = &p.links[2];
        assert_eq!((t.mtu, t.queues), (1500, THREAD_QUEUES));
        assert!(t.bw.is_empty() && t.lat.is_empty() && t.stream_payloads.is_empty());
        for test in THREAD_TESTS {
            for (threads, shards) in THREAD_RUNS {
                let c = t
                    .threads
                    .iter()
                    .find(|c| c.test == test && c.threads == threads && c.shards == shards)
                    .unwrap_or_else(|| panic!("no {test} --threads {threads} --shards {shards}"));
                assert_eq!((c.size, c.qps), (THREAD_SIZE, THREAD_QPS));
                assert_eq!(c.qps % c.threads, 0);
            }
        }
        assert!(p.links[0].scale.iter().any(|c| c.qps == 1024));
        assert_eq!(p.memory_qps, SCALE_QPS.to_vec());
        for test in BW_TESTS {
            assert!(p.links[0].bw.iter().any(|c| c.test == test));
        }
        // The UC ping-pong beside RC's, busy-poll at 64 B on the base link only.
        let uc: Vec<_> = p
            .links
            .iter()
            .flat_map(|l| l.lat.iter().map(move |c| (l.mtu, c)))
            .filter(|(_, c)| c.test == UC_SEND_LAT)
            .collect();
        assert_eq!(uc.len(), 1, "{uc:?}");
        assert_eq!(
            (uc[0].0, uc[0].1.size, uc[0].1.mode),
            (BASE_MTU, UC_SEND_LAT_SIZE, Progress::BusyPoll)
        );
        for mode in [Progress::Wakeup, Progress::BusyPoll] {
            for test in LAT_TESTS {
                for l in &p.links[..2] {
                    assert!(
                        l.lat.iter().any(|c| c.test == test && c.mode == mode),
                        "{test} {mode:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn full_plan_sweeps_every_size_with_one_and_many_qps() {
        let p = plan(&opts());
        let base = &p.links[0];
        for test in BW_TESTS {
            for size in FULL_BW_SIZES {
                for qps in BW_QPS {
                    assert!(base
                        .bw
                        .iter()
                        .any(|c| c.test == test && c.size == size && c.qps == qps));
                }
            }
        }
        // Every payload per packet a bandwidth row needs has its stream row.
        assert_eq!(base.stream_payloads, vec![64, 256, 1024]);
        for c in base.bw.iter().chain(&base.scale) {
            assert!(c.iters >= crate::perftest::run::MIN_ITERS);
        }
    }

    #[test]
    fn without_perf_progress_busy_poll_is_left_to_the_raw_rows() {
        let mut o = opts();
        o.perf_has_progress = false;
        let p = plan(&o);
        assert!(p
            .links
            .iter()
            .all(|l| l.lat.iter().all(|c| c.mode == Progress::Wakeup)));
        o.modes = vec![Progress::BusyPoll];
        o.modes_explicit = true;
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains("--progress busy-poll"), "{e}");
    }

    #[test]
    fn bad_options_name_the_option_and_the_range() {
        let mut o = opts();
        o.jumbo_mtu = 1500;
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("--mtu 1500: must be between 4176 and 9000"),
            "{e}"
        );
        let mut o = opts();
        o.lat_iters = Some(0);
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("-n/--iters 0: must be between 100 and"),
            "{e}"
        );
        let mut o = opts();
        o.messages = Some(0);
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("--messages 0:"));
        let mut o = opts();
        o.sections.clear();
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("--sections"));
    }

    #[test]
    fn threads_only_makes_one_multi_queue_pair() {
        let mut o = opts();
        o.sections = vec![Section::Threads];
        let p = plan(&o);
        assert_eq!(p.links.len(), 1);
        assert_eq!(p.links[0].queues, THREAD_QUEUES);
        assert_eq!(
            p.links[0].threads.len(),
            THREAD_TESTS.len() * THREAD_RUNS.len()
        );
        assert!(p.memory_qps.is_empty());
        // --shards is the other sections' (and their pairs' queues), not the threads rows'.
        let mut o = opts();
        o.shards = 4;
        let p = plan(&o);
        assert!(p.links[0]
            .bw
            .iter()
            .all(|c| c.shards == 4 && c.threads == 1));
        assert_eq!(p.links[0].queues, 4);
        let t = p.links.iter().find(|l| !l.threads.is_empty()).unwrap();
        assert!(t.threads.iter().any(|c| c.shards == 1));
        let mut o = opts();
        o.shards = 0;
        let e = o.validate().unwrap_err().to_string();
        assert!(e.starts_with("--shards 0: must be between 1 and 64"), "{e}");
    }

    #[test]
    fn per_thread_rates_are_read() {
        let doc = r#"{"results":[{"size":64,"iters":20,"peak":0,"average":0.1,"msg_rate_mpps":0.4,"unit":"GigabitsPerSec","per_thread":[{"thread":0,"qps":1,"size":64,"iters":10,"peak":0,"average":0.05,"msg_rate_mpps":0.25,"unit":"GigabitsPerSec"},{"thread":1,"qps":1,"size":64,"iters":10,"peak":0,"average":0.05,"msg_rate_mpps":0.2,"unit":"GigabitsPerSec"}]}]}"#;
        assert_eq!(parse_per_thread_mpps(doc).unwrap(), vec![0.25, 0.2]);
        assert!(parse_per_thread_mpps(r#"{"results":[{"size":64}]}"#)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn threads_rows_render_figures_or_their_error() {
        let row = |threads, shards, mpps: Option<f64>, error: Option<&str>| ThreadsRow {
            test: "write_bw",
            size: 64,
            qps: 2,
            threads,
            shards,
            iters: 100,
            msg_rate_mpps: mpps,
            gbps: mpps.map(|m| m * 0.512),
            per_thread_mpps: if threads == 2 && mpps.is_some() {
                vec![0.3, 0.2]
            } else {
                Vec::new()
            },
            vs_one_thread: mpps.and_then(|m| Ratio::new("one".into(), 0.4, m)),
            error: error.map(str::to_string),
        };
        let report = BenchReport {
            machine: read_machine("test".into()),
            quick: true,
            sections: vec![Section::Threads],
            progress: vec![],
            links: vec![],
            ceiling: None,
            udp: None,
            xroce: None,
            scale: None,
            threads: Some(ThreadsSection {
                link_mtu: 1500,
                queues: 2,
                rows: vec![
                    row(1, 1, Some(0.4), None),
                    row(2, 1, Some(0.5), None),
                    row(
                        2,
                        2,
                        None,
                        Some("xroce perf write_bw client: exit status: 1"),
                    ),
                ],
            }),
            library: Some(LibrarySection {
                rows: vec![LibraryRow {
                    test: "write_bw",
                    size: 64,
                    iters: 1000,
                    unit: "Gbit/s",
                    perftest: 0.2,
                    xroce_perf: 0.25,
                    ratio: 0.8,
                    within_10_percent: false,
                }],
            }),
            engine: None,
            targets: vec![],
            notes: vec![],
            failures: vec![],
            seconds: 1.0,
        };
        let text = render_text(&report);
        assert!(
            text.contains("== 6. perftest on xroce's libibverbs.so.1"),
            "{text}"
        );
        assert!(text.contains("   0.80  no"), "{text}");
        assert!(text.contains("== 5. Threads"), "{text}");
        assert!(text.contains("1.25x  0.300 + 0.200"), "{text}");
        assert!(
            text.contains("error: xroce perf write_bw client: exit status: 1"),
            "{text}"
        );
    }

    #[test]
    fn messages_shrink_with_size_within_bounds() {
        let o = opts();
        assert_eq!(o.messages_for(64), 200_000);
        assert_eq!(o.messages_for(4096), 100_000);
        assert_eq!(o.messages_for(1 << 20), 390);
        let mut q = opts();
        q.messages = Some(100);
        assert_eq!(q.messages_for(1 << 20), 100);
    }

    #[test]
    fn perf_json_is_read_for_both_kinds() {
        let bw = r#"{"test":"write_bw","results":[{"size":64,"iters":10,"peak":0.3,"average":0.25,"msg_rate_mpps":0.49,"unit":"GigabitsPerSec"}]}"#;
        assert_eq!(
            parse_perf(bw).unwrap(),
            PerfResult::Bw {
                gbps: 0.25,
                peak_gbps: 0.3,
                msg_rate_mpps: 0.49
            }
        );
        let lat = r#"{"results":[{"size":64,"iters":10,"samples":8,"min":1.0,"max":9.0,"median":2.0,"average":2.5,"stdev":0.5,"p99":8.0,"p99_9":9.0}]}"#;
        assert_eq!(
            parse_perf(lat).unwrap(),
            PerfResult::Lat {
                median: 2.0,
                p99: 8.0
            }
        );
        let mb = bw.replace("GigabitsPerSec", "MegabytesPerSec");
        assert!(parse_perf(&mb).is_err());
        assert!(parse_perf(r#"{"results":[]}"#).is_err());
    }

    #[test]
    fn targets_are_read_off_the_rows_and_judged() {
        let bw = |test, qps, mpps: f64, vs_ceiling: f64, vs_udp: f64| XroceBwRow {
            test,
            link_mtu: BASE_MTU,
            path_mtu: 1024,
            size: 64,
            qps,
            iters: 1000,
            gbps: mpps * 0.512,
            peak_gbps: 0.0,
            msg_rate_mpps: mpps,
            vs_ceiling: Ratio::new("ceiling".into(), 1.0, vs_ceiling),
            vs_udp: Ratio::new("udp".into(), 1.0, vs_udp),
        };
        let lat = |test, median: f64, p99: f64, vs_ceiling: f64| XroceLatRow {
            test,
            mode: Progress::BusyPoll,
            link_mtu: BASE_MTU,
            size: 64,
            iters: 1000,
            measures: "half round trip",
            median_us: median,
            p99_us: p99,
            vs_ceiling: Some(LatencyRatios {
                median: Ratio::new("c".into(), 1.0, vs_ceiling).unwrap(),
                p99: Ratio::new("c".into(), 1.0, vs_ceiling).unwrap(),
            }),
            vs_udp: None,
        };
        let mut report = BenchReport {
            machine: read_machine("test".into()),
            quick: false,
            sections: vec![Section::Xroce],
            progress: vec![Progress::BusyPoll],
            links: vec![],
            ceiling: None,
            udp: None,
            xroce: Some(XroceSection {
                bw: vec![
                    bw("write_bw", 1, 0.6, 0.8, 1.3),
                    bw("send_bw", 1, 0.5, 0.7, 1.0),
                    bw("send_bw", 16, 0.4, 0.5, 0.8),
                ],
                lat: vec![
                    lat("send_lat", 10.0, 25.0, 2.6),
                    lat("write_lat", 4.0, 6.0, 1.2),
                    lat(UC_SEND_LAT, 6.5, 9.0, 1.7),
                ],
            }),
            scale: None,
            threads: None,
            library: None,
            engine: Some(EngineSection {
                size: 64,
                messages: 3_500_000,
                seconds: 1.0,
                msg_rate_mpps: 3.5,
                tenths_mpps: vec![3.4, 3.6],
            }),
            targets: vec![],
            notes: vec![],
            failures: vec![],
            seconds: 1.0,
        };
        report.targets = targets::targets(&report);
        let by_name = |name: &str| {
            report
                .targets
                .iter()
                .find(|t| t.name.starts_with(name))
                .unwrap_or_else(|| panic!("no target {name}"))
                .clone()
        };
        let write_bw = by_name("write_bw 64 B, 1 QP / raw");
        assert_eq!(
            (write_bw.met(), write_bw.goal_met()),
            (Some(true), Some(false))
        );
        assert_eq!(by_name("send_bw 64 B, 1 QP / raw").met(), Some(false));
        assert_eq!(by_name("write_bw 64 B, 1 QP / kernel").met(), Some(true));
        let send_lat = by_name("send_lat 64 B busy-poll median / raw");
        assert_eq!(send_lat.met(), Some(false));
        assert_eq!(by_name("send_lat 64 B busy-poll p99").ratio, Some(2.5));
        assert_eq!(by_name("write_lat 64 B busy-poll p99").met(), Some(true));
        let write_lat = by_name("write_lat 64 B busy-poll median / raw");
        assert_eq!(
            (write_lat.met(), write_lat.goal_met()),
            (Some(true), Some(true))
        );
        // Not measured: no UDP section, no scale section.
        assert_eq!(
            by_name("send_lat 64 B busy-poll median / kernel").met(),
            None
        );
        assert_eq!(by_name("write_bw 64 B, 1,024 QPs").ratio, None);
        let qps16 = by_name("send_bw 64 B, 16 QPs");
        assert!((qps16.ratio.unwrap() - 0.8).abs() < 1e-9);
        assert_eq!(qps16.met(), Some(false));
        let text = render_text(&report);
        assert!(text.contains("== Targets"), "{text}");
        assert!(text.contains("not run"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("write_bw 64 B, 1 QP / raw AF_XDP stream"))
            .unwrap();
        assert!(
            row.contains("0.80") && row.contains(">=0.75") && row.contains("yes"),
            "{row}"
        );
        assert!(row.trim_end().ends_with("NO"), "{row}");
        let engine = by_name("engine alone, 64 B SENDs");
        assert_eq!(
            (engine.ratio, engine.met(), engine.goal_met()),
            (Some(3.5), Some(false), Some(false))
        );
        assert!(text.contains("== 7. The engine alone"), "{text}");
        assert!(text.contains("3.500 M msg/s (3500000 messages"), "{text}");
        // The UC row is no target: it splits the send_lat row's time into the ACK and the rest.
        assert!(!report.targets.iter().any(|t| t.name.contains("UC")));
        let ack = text
            .lines()
            .find(|l| l.starts_with("send_lat 64 B busy-poll median: RC"))
            .unwrap_or_else(|| panic!("no ACK share line in {text}"));
        assert!(
            ack.contains("RC 10.00 us, UC 6.50 us")
                && ack.contains("1.70x the raw")
                && ack.ends_with("the ACK costs 3.50 us of each half"),
            "{ack}"
        );
        assert_eq!(engine.unit, "M msg/s");
        assert!(report
            .targets
            .iter()
            .all(|t| (t.unit == "ratio") != t.name.starts_with("engine alone")));
        // A noisy run where UC came out slower gives no split.
        report.xroce.as_mut().unwrap().lat[2].median_us = 11.0;
        let noisy = targets::ack_share(&report).unwrap();
        assert!(
            noisy.contains("UC slower than RC") && !noisy.contains("costs"),
            "{noisy}"
        );
        report.xroce.as_mut().unwrap().lat.pop();
        assert_eq!(targets::ack_share(&report), None);
    }

    #[test]
    fn utc_dates_follow_the_calendar() {
        let s = utc_now();
        assert!(s.ends_with(" UTC") && s.len() == 23, "{s}");
        assert!(s.starts_with("20"), "{s}");
    }
}
