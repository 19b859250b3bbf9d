//! Running the catalogue and what comes out of it: a result per case (verdict, checks,
//! timings, the frames both ways), a target's expectations (its known deviations), the
//! terminal table, JSON and the HTML report with a ladder diagram per case.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::agent::AgentClient;
use super::case::{Case, CaseError, Check, Ctx, Verdict, Windows};
use super::peer::{Direction, Peer, Record};
use crate::analysis::{Ladder, Rung};

/// What one case found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CaseResult {
    pub name: String,
    pub rule: String,
    pub summary: String,
    pub verdict: Verdict,
    /// Why the case could not run (verdict `error`).
    pub error: Option<String>,
    pub checks: Vec<Check>,
    pub measurements: BTreeMap<String, f64>,
    pub elapsed_ms: f64,
    /// Frames both ways during the case (not in JSON: the capture and the ladder show them).
    #[serde(skip)]
    pub frames: Vec<Record>,
    /// What the expectations file says of this case, and whether the result matches it.
    pub expected_verdict: Verdict,
    pub as_expected: bool,
}

impl CaseResult {
    /// The checks that did not hold, as `expected → observed` lines.
    pub fn failures(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !c.holds)
            .map(|c| format!("expected {}; observed {}", c.expected, c.observed))
            .collect()
    }

    /// The exchange as a ladder diagram (peer on the left, target on the right).
    pub fn ladder(&self, peer: &str, target: &str) -> Ladder {
        let mut ladder = Ladder::new(60);
        let start = self.frames.first().map(|r| r.at).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        for (i, r) in self.frames.iter().enumerate() {
            let Ok(p) = xroce::wire::parse_frame(&r.frame) else {
                continue;
            };
            let repeated = !seen.insert((
                r.direction == Direction::Sent,
                p.repr.roce.bth.opcode.0,
                p.repr.roce.bth.psn.value(),
            ));
            let mut one = Ladder::new(1);
            one.frame(i + 1, r.at - start, &p, repeated);
            if let Some(rung) = one.rungs().first() {
                let (from, to) = match r.direction {
                    Direction::Sent => (peer.to_string(), target.to_string()),
                    Direction::Received => (target.to_string(), peer.to_string()),
                };
                ladder.push(Rung {
                    from,
                    to,
                    ..rung.clone()
                });
            }
        }
        ladder
    }
}

/// A target's recorded deviations: case name → the verdict to expect (every other case is
/// expected to conform). Text, one case per line: `NAME deviates  # why`.
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    pub name: String,
    pub verdicts: BTreeMap<String, Verdict>,
}

/// The expectations files the project keeps (`--target rxe`, `--target xroce`).
pub const BUILTIN_EXPECTATIONS: &[(&str, &str)] = &[
    ("rxe", include_str!("expect/rxe.txt")),
    ("xroce", include_str!("expect/xroce.txt")),
];

impl Expectations {
    /// Parses an expectations file; `name` labels it in reports.
    pub fn parse(name: &str, text: &str) -> Result<Expectations, String> {
        let mut verdicts = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(case), Some(verdict), None) = (words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "{name} line {}: want `CASE conforms|deviates|error`, got {line:?}",
                    n + 1
                ));
            };
            let verdict = match verdict {
                "conforms" => Verdict::Conforms,
                "deviates" => Verdict::Deviates,
                "error" => Verdict::Error,
                other => {
                    return Err(format!(
                        "{name} line {}: verdict {other:?} (conforms, deviates or error)",
                        n + 1
                    ))
                }
            };
            verdicts.insert(case.to_string(), verdict);
        }
        Ok(Expectations {
            name: name.to_string(),
            verdicts,
        })
    }

    /// `rxe`, `xroce`, or a file's path.
    pub fn load(target: &str) -> Result<Expectations, String> {
        if let Some((_, text)) = BUILTIN_EXPECTATIONS.iter().find(|(n, _)| *n == target) {
            return Expectations::parse(target, text);
        }
        let text = std::fs::read_to_string(target).map_err(|e| {
            format!("--target {target}: neither rxe, xroce nor a readable file ({e})")
        })?;
        Expectations::parse(target, &text)
    }

    pub fn expected(&self, case: &str) -> Verdict {
        self.verdicts
            .get(case)
            .copied()
            .unwrap_or(Verdict::Conforms)
    }

    /// Cases the file names that the catalogue does not have (a typo would hide a change).
    pub fn unknown_cases(&self, catalogue: &[Case]) -> Vec<String> {
        self.verdicts
            .keys()
            .filter(|k| !catalogue.iter().any(|c| c.name == k.as_str()))
            .cloned()
            .collect()
    }
}

/// Whether `name` is selected by `pattern`: comma-separated parts, each a name or a
/// substring, `*` as a wildcard (`rnr*`, `duplicate`, `ghost_ack,psn_wrap`).
pub fn selected(name: &str, pattern: Option<&str>) -> bool {
    let Some(pattern) = pattern else { return true };
    pattern.split(',').map(str::trim).any(|part| {
        if part.is_empty() {
            return false;
        }
        let pieces: Vec<&str> = part.split('*').collect();
        if pieces.len() == 1 {
            return name.contains(part);
        }
        let mut rest = name;
        for (i, piece) in pieces.iter().enumerate() {
            if piece.is_empty() {
                continue;
            }
            match rest.find(piece) {
                Some(at) if i > 0 || at == 0 => rest = &rest[at + piece.len()..],
                _ => return false,
            }
        }
        pieces.last().is_some_and(|l| l.is_empty()) || rest.is_empty()
    })
}

/// Runs `cases` one after another; `each` sees every result as it is made.
pub fn run_cases(
    peer: &mut Peer,
    agent: &mut AgentClient,
    cases: &[Case],
    expectations: &Expectations,
    windows: Windows,
    mut each: impl FnMut(&CaseResult),
) -> Result<Vec<CaseResult>, CaseError> {
    let hello = agent.hello()?;
    // pyverbs' GID parser wants all eight groups.
    let peer_gid = peer
        .local
        .ip
        .to_ipv6_mapped()
        .segments()
        .iter()
        .map(|g| format!("{g:04x}"))
        .collect::<Vec<_>>()
        .join(":");
    let mut results = Vec::new();
    let mut next_peer_qpn = 0x00C0_0100;
    for case in cases {
        let mark = peer.mark();
        let started = Instant::now();
        let mut cx = Ctx {
            peer: &mut *peer,
            agent: &mut *agent,
            target_gid: hello.gid.clone(),
            peer_gid: peer_gid.clone(),
            windows,
            target_rd_atom: hello.max_qp_rd_atom,
            checks: Vec::new(),
            measurements: BTreeMap::new(),
            next_peer_qpn,
        };
        let outcome = (case.run)(&mut cx);
        next_peer_qpn = cx.next_peer_qpn + 1;
        let (checks, measurements) = (cx.checks, cx.measurements);
        let (verdict, error) = match outcome {
            Err(e) => (Verdict::Error, Some(e.to_string())),
            Ok(()) if checks.is_empty() => {
                (Verdict::Error, Some("the case checked nothing".to_string()))
            }
            Ok(()) if checks.iter().all(|c| c.holds) => (Verdict::Conforms, None),
            Ok(()) => (Verdict::Deviates, None),
        };
        // Late answers belong to this case, not the next one.
        std::thread::sleep(Duration::from_millis(20));
        peer.drain()?;
        let expected_verdict = expectations.expected(case.name);
        let result = CaseResult {
            name: case.name.to_string(),
            rule: case.rule.to_string(),
            summary: case.summary.to_string(),
            verdict,
            error,
            checks,
            measurements,
            elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
            frames: peer.records_since(mark).to_vec(),
            expected_verdict,
            as_expected: verdict == expected_verdict,
        };
        each(&result);
        results.push(result);
    }
    Ok(results)
}

/// One line per case for the terminal.
pub fn table_line(r: &CaseResult) -> String {
    let mark = if r.as_expected { " " } else { "!" };
    let mut line = format!(
        "{mark} {:<30} {:<9} {:>8.1} ms",
        r.name,
        r.verdict.to_string(),
        r.elapsed_ms
    );
    if !r.as_expected {
        let _ = write!(line, "  (expected {})", r.expected_verdict);
    }
    line
}

/// The summary under the table.
pub fn summary_line(results: &[CaseResult], expectations: &Expectations) -> String {
    let count = |v| results.iter().filter(|r| r.verdict == v).count();
    let changed = results.iter().filter(|r| !r.as_expected).count();
    format!(
        "{} cases: {} conform, {} deviate, {} errors; {} differ from the expectations of '{}'",
        results.len(),
        count(Verdict::Conforms),
        count(Verdict::Deviates),
        count(Verdict::Error),
        changed,
        expectations.name
    )
}

/// Writes the frames of a case as a pcap.
pub fn write_pcap(path: &std::path::Path, frames: &[Record]) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    let mut w = xroce::capture::EthernetPcapWriter::new(std::io::BufWriter::new(file), 65535)
        .map_err(std::io::Error::other)?;
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let start = frames.first().map(|r| r.at).unwrap_or_default();
    for r in frames {
        w.write_frame(base + (r.at - start), &r.frame)
            .map_err(std::io::Error::other)?;
    }
    Ok(())
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The HTML report: the summary table, then per case its rule, checks, timings and ladder.
pub fn html_report(
    title: &str,
    results: &[CaseResult],
    expectations: &Expectations,
    peer: &str,
    target: &str,
) -> String {
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{}</title>\n<style>\
body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}\
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}}\
.conforms{{color:#060}}.deviates{{color:#b50}}.error{{color:#c00}}.changed{{background:#fee}}\
</style></head><body>\n<h1>{}</h1>\n<p>{}</p>\n",
        html_escape(title),
        html_escape(title),
        html_escape(&summary_line(results, expectations))
    );
    h.push_str(
        "<table><tr><th>case</th><th>verdict</th><th>expected</th><th>rule</th><th>ms</th></tr>\n",
    );
    for r in results {
        let _ = writeln!(
            h,
            "<tr{}><td><a href=\"#{n}\">{n}</a></td><td class=\"{v}\">{v}</td><td>{e}</td><td>{rule}</td><td>{ms:.1}</td></tr>",
            if r.as_expected { "" } else { " class=\"changed\"" },
            n = r.name,
            v = r.verdict,
            e = r.expected_verdict,
            rule = html_escape(&r.rule),
            ms = r.elapsed_ms
        );
    }
    h.push_str("</table>\n");
    for r in results {
        let _ = write!(
            h,
            "<h2 id=\"{n}\">{n}: <span class=\"{v}\">{v}</span></h2>\n<p>{s}</p>\n<p><b>Rule:</b> {rule}</p>\n",
            n = r.name,
            v = r.verdict,
            s = html_escape(&r.summary),
            rule = html_escape(&r.rule)
        );
        if let Some(e) = &r.error {
            let _ = writeln!(h, "<p class=\"error\">{}</p>", html_escape(e));
        }
        h.push_str("<table><tr><th></th><th>expected</th><th>observed</th></tr>\n");
        for c in &r.checks {
            let _ = writeln!(
                h,
                "<tr><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
                if c.holds { "conforms" } else { "deviates" },
                if c.holds { "✓" } else { "✗" },
                html_escape(&c.expected),
                html_escape(&c.observed)
            );
        }
        h.push_str("</table>\n");
        if !r.measurements.is_empty() {
            let m: Vec<String> = r
                .measurements
                .iter()
                .map(|(k, v)| format!("{k} = {v:.2}"))
                .collect();
            let _ = writeln!(h, "<p><b>Measured:</b> {}</p>", html_escape(&m.join(", ")));
        }
        h.push_str(&r.ladder(peer, target).to_svg(&r.name));
        h.push('\n');
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conform::catalogue;

    #[test]
    fn patterns_select_by_name_part_and_wildcard() {
        assert!(selected("duplicate_read_replay", None));
        assert!(selected("duplicate_read_replay", Some("duplicate")));
        assert!(selected("rnr_retry_exceeded", Some("ghost_ack, rnr*")));
        assert!(!selected("ghost_ack", Some("rnr*")));
        assert!(selected("ack_timeout_retry_cnt_7", Some("*cnt_7")));
        assert!(!selected("ack_timeout_retry", Some("*cnt_7")));
        assert!(selected("read_retry_partial", Some("read*partial")));
        assert!(!selected("read_success", Some("read*partial")));
        assert!(!selected("read_success", Some(",")));
    }

    #[test]
    fn expectations_parse_and_refuse_what_they_cannot_mean() {
        let e = Expectations::parse(
            "t",
            "# c\nghost_ack deviates  # why\n\nbad_response error\n",
        )
        .unwrap();
        assert_eq!(e.expected("ghost_ack"), Verdict::Deviates);
        assert_eq!(e.expected("bad_response"), Verdict::Error);
        assert_eq!(e.expected("psn_wrap"), Verdict::Conforms);
        assert!(Expectations::parse("t", "ghost_ack maybe").is_err());
        assert!(Expectations::parse("t", "ghost_ack deviates extra").is_err());
        assert!(Expectations::parse("t", "ghost_ack").is_err());
        let typo = Expectations::parse("t", "ghost_akc deviates").unwrap();
        assert_eq!(
            typo.unknown_cases(&catalogue()),
            vec!["ghost_akc".to_string()]
        );
        assert!(Expectations::load("/no/such/file").is_err());
    }

    #[test]
    fn the_shipped_expectations_name_only_catalogue_cases() {
        for (name, _) in BUILTIN_EXPECTATIONS {
            let e = Expectations::load(name).unwrap();
            assert!(e.unknown_cases(&catalogue()).is_empty(), "{name}");
        }
        assert_eq!(
            Expectations::load("rxe")
                .unwrap()
                .expected("ack_timeout_retry_cnt_7"),
            Verdict::Deviates
        );
    }

    #[test]
    fn every_case_has_a_unique_name_and_cites_the_ibta() {
        let cases = catalogue();
        let mut names = std::collections::HashSet::new();
        for c in &cases {
            assert!(names.insert(c.name), "{} twice", c.name);
            assert!(c.rule.starts_with("IBTA "), "{}: {}", c.name, c.rule);
            assert!(!c.rule.contains('?'), "{}: {}", c.name, c.rule);
            assert!(!c.summary.is_empty());
        }
    }
}
