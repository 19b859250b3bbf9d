//! clap parsers for the library's option values: the library types parse themselves
//! (`FromStr`) and know their names and help lines; clap is named only here and in the
//! command modules.
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use xroce::verbs::ProgressMode;
use xroce_tools::endpoint::verbs::DriverChoice;
use xroce_tools::perftest::oob::TestKind;

/// `--driver xdp|udp`: lists each driver with its help line, and refuses any other value
/// with clap's "invalid value ... [possible values: xdp, udp, relay]".
pub fn driver() -> impl TypedValueParser<Value = DriverChoice> {
    PossibleValuesParser::new(
        DriverChoice::ALL.map(|d| PossibleValue::new(d.name()).help(d.about())),
    )
    .map(|name| {
        name.parse::<DriverChoice>()
            .expect("clap passes only the names DriverChoice::ALL lists")
    })
}

/// `xroce perf <test>`: the eight tests with their help lines.
pub fn test() -> impl TypedValueParser<Value = TestKind> {
    PossibleValuesParser::new(TestKind::ALL.map(|t| PossibleValue::new(t.name()).help(t.about())))
        .map(|name| {
            name.parse::<TestKind>()
                .expect("clap passes only the names TestKind::ALL lists")
        })
}

/// `--progress wakeup|busy-poll`.
pub fn progress() -> impl TypedValueParser<Value = ProgressMode> {
    PossibleValuesParser::new(
        ProgressMode::ALL.map(|m| PossibleValue::new(m.name()).help(m.about())),
    )
    .map(|name| {
        name.parse::<ProgressMode>()
            .expect("clap passes only the names ProgressMode::ALL lists")
    })
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
}
