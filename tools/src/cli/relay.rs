//! `xroce relay -d IFACE`: own an interface's AF_XDP driver and share it with the local
//! processes that open a device on it (see `xroce::driver::relay`).
const EXAMPLES: &str = "\
Examples:
  # serve veth0, then start any number of processes on it:
  xroce relay -d veth0 &
  xroce perf -d veth0 --driver relay ...     # or the default driver: it falls back to the relay
  XROCE_DRIVER=relay xroce run -d veth0 -- ib_write_bw ...";

/// Arguments.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// The network interface to serve.
    #[arg(short = 'd', long = "ib-dev")]
    pub ifname: String,
    /// Print the counters every this many seconds (0: only when stopping).
    #[arg(long, default_value_t = 0)]
    pub stats_interval: u64,
    /// Stop after this many seconds (0: run until killed).
    #[arg(long, default_value_t = 0)]
    pub duration: u64,
}

/// Runs the relay in this process.
#[cfg(feature = "xdp")]
pub fn run(args: Args) -> anyhow::Result<i32> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let mut relay = xroce::driver::relay::Relay::open_xdp(&args.ifname)?;
    let stats = relay.stats();
    let info = relay.driver_info();
    println!(
        "relay on {} ({}): serving @{}",
        args.ifname,
        info.mode,
        xroce::driver::relay::socket_name(&args.ifname)
    );
    let stop = Arc::new(AtomicBool::new(false));
    let ticker_stop = stop.clone();
    let (interval, duration) = (args.stats_interval, args.duration);
    let ticker_stats = stats.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut last = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(100));
            if duration > 0 && start.elapsed() >= Duration::from_secs(duration) {
                ticker_stop.store(true, Ordering::Relaxed);
                return;
            }
            if interval > 0 && last.elapsed() >= Duration::from_secs(interval) {
                last = Instant::now();
                println!("{}", ticker_stats.summary());
            }
        }
    });
    let result = relay.run(&stop);
    println!("{}", stats.summary());
    result?;
    Ok(0)
}

/// Without AF_XDP there is nothing to relay.
#[cfg(not(feature = "xdp"))]
pub fn run(_args: Args) -> anyhow::Result<i32> {
    Err(xroce::driver::DriverError::XdpNotBuilt.into())
}
