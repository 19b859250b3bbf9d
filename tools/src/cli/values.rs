//! clap parsers for the library's option values: the library types parse themselves
//! (`FromStr`) and know their names and help lines; clap is named only here and in the
//! command modules.
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use xroce::verbs::ProgressMode;
use xroce_tools::demo::stage::DemoDriver;
use xroce_tools::endpoint::verbs::DriverChoice;
use xroce_tools::perftest::oob::TestKind;

/// A parser for a library type that lists its values (`all`, in `--help` order), names
/// each (`name`, which its `FromStr` takes back) and explains each (`about`): clap shows the
/// names with their help lines and refuses any other value with "invalid value ...
/// [possible values: ...]".
fn named<T>(
    all: &[T],
    name: fn(T) -> &'static str,
    about: fn(T) -> &'static str,
) -> impl TypedValueParser<Value = T>
where
    T: Copy + std::str::FromStr + Send + Sync + Clone + 'static,
{
    PossibleValuesParser::new(
        all.iter()
            .map(|&v| PossibleValue::new(name(v)).help(about(v))),
    )
    .map(|typed| match typed.parse::<T>() {
        Ok(value) => value,
        Err(_) => unreachable!("clap passes only the listed names, {typed:?} among them"),
    })
}

/// `--driver xdp|udp|relay`.
pub fn driver() -> impl TypedValueParser<Value = DriverChoice> {
    named(&DriverChoice::ALL, DriverChoice::name, DriverChoice::about)
}

/// `xroce perf <test>`: the eight tests with their help lines.
pub fn test() -> impl TypedValueParser<Value = TestKind> {
    named(&TestKind::ALL, TestKind::name, TestKind::about)
}

/// `--progress wakeup|busy-poll`.
pub fn progress() -> impl TypedValueParser<Value = ProgressMode> {
    named(&ProgressMode::ALL, ProgressMode::name, ProgressMode::about)
}

/// `xroce demo --driver xdp|udp|sim`.
pub fn demo_driver() -> impl TypedValueParser<Value = DemoDriver> {
    named(&DemoDriver::ALL, DemoDriver::name, DemoDriver::about)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[arg(long, value_parser = driver(), default_value_t = DriverChoice::Xdp)]
        driver: DriverChoice,
    }

    fn parse(args: &[&str]) -> Result<DriverChoice, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).map(|c| c.driver)
    }

    #[test]
    fn driver_values_reach_the_library_type() {
        assert_eq!(parse(&[]).unwrap(), DriverChoice::Xdp);
        assert_eq!(parse(&["--driver", "udp"]).unwrap(), DriverChoice::Udp);
        assert_eq!(parse(&["--driver", "xdp"]).unwrap(), DriverChoice::Xdp);
        let err = parse(&["--driver", "nope"]).unwrap_err().to_string();
        assert!(
            err.contains("invalid value 'nope' for '--driver <DRIVER>'"),
            "{err}"
        );
        assert!(err.contains("[possible values: xdp, udp, relay]"), "{err}");
    }

    #[derive(clap::Parser, Debug)]
    struct ProgressCli {
        #[arg(long, value_parser = progress(), default_value_t = ProgressMode::Wakeup)]
        progress: ProgressMode,
    }

    #[test]
    fn progress_values_reach_the_library_type() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            ProgressCli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .map(|c| c.progress)
        };
        assert_eq!(parse(&[]).unwrap(), ProgressMode::Wakeup);
        assert_eq!(
            parse(&["--progress", "busy-poll"]).unwrap(),
            ProgressMode::BusyPoll
        );
        let err = parse(&["--progress", "spin"]).unwrap_err().to_string();
        assert!(
            err.contains("[possible values: wakeup, busy-poll]"),
            "{err}"
        );
    }

    #[derive(clap::Parser, Debug)]
    struct TestCli {
        #[arg(value_parser = test())]
        test: TestKind,
    }

    #[test]
    fn test_names_reach_the_library_type() {
        use clap::Parser;
        let parse = |arg: &str| TestCli::try_parse_from(["x", arg]).map(|c| c.test);
        for kind in TestKind::ALL {
            assert_eq!(parse(kind.name()).unwrap(), kind);
        }
        let err = parse("write-bw").unwrap_err().to_string();
        assert!(
            err.contains("[possible values: send_bw, write_bw, read_bw, atomic_bw, send_lat, write_lat, read_lat, atomic_lat]"),
            "{err}"
        );
    }

    #[derive(clap::Parser, Debug)]
    struct DemoCli {
        #[arg(long, value_parser = demo_driver())]
        driver: Option<DemoDriver>,
    }

    #[test]
    fn demo_drivers_reach_the_library_type() {
        use clap::Parser;
        let parse = |args: &[&str]| {
            DemoCli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
                .map(|c| c.driver)
        };
        assert_eq!(parse(&[]).unwrap(), None);
        assert_eq!(parse(&["--driver", "sim"]).unwrap(), Some(DemoDriver::Sim));
        let err = parse(&["--driver", "relay"]).unwrap_err().to_string();
        assert!(err.contains("[possible values: xdp, udp, sim]"), "{err}");
    }
}
