//! Ladder diagrams (`xroce dump --ladder FILE.svg`): the endpoints of an exchange as columns,
//! time running down, each packet an arrow from its sender to its receiver labelled with its
//! opcode, PSN and what its AETH says. Drawn for teaching and for reading a conformance case
//! at a glance: a NAK, a go-back-N resend or a packet with a bad ICRC stands out by its
//! colour and dash.

use std::fmt::Write as _;
use std::time::Duration;

use xroce::wire::{NakCode, Opcode, ParsedFrame, Syndrome};

use super::line::addresses;

/// What kind of packet a rung is, which decides how it is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RungKind {
    /// A request (SEND, WRITE, READ request, atomic) sent for the first time.
    Request,
    /// A READ response or an atomic acknowledge.
    Response,
    /// A positive acknowledgement.
    Ack,
    /// A NAK or an RNR NAK.
    Nak,
    /// A request or READ response that repeats an earlier packet of its sender (same QP,
    /// PSN and opcode, as the summary's `retransmitted` counts them): a go-back-N resend, a
    /// timer retry or a READ replay.
    Retransmit,
    /// A communication-management MAD (a UD SEND to QP1).
    Cm,
    /// A packet whose ICRC does not verify (IBTA Vol. 1 7.8.1, RoCEv2 annex A17.3.3): its
    /// receiver drops it.
    BadIcrc,
}

impl RungKind {
    fn class(self) -> &'static str {
        match self {
            RungKind::Request => "request",
            RungKind::Response => "response",
            RungKind::Ack => "ack",
            RungKind::Nak => "nak",
            RungKind::Retransmit => "retransmit",
            RungKind::Cm => "cm",
            RungKind::BadIcrc => "bad-icrc",
        }
    }
}

/// One packet of the diagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rung {
    /// The frame's number in its capture (1-based).
    pub number: usize,
    /// Time since the first frame.
    pub time: Duration,
    pub from: String,
    pub to: String,
    pub label: String,
    pub kind: RungKind,
}

/// A ladder diagram being collected; [`Ladder::to_svg`] draws it.
#[derive(Debug, Clone)]
pub struct Ladder {
    rungs: Vec<Rung>,
    columns: Vec<String>,
    limit: usize,
    left_out: usize,
}

impl Ladder {
    /// A diagram of at most `limit` packets; later ones are counted and named in a note.
    pub fn new(limit: usize) -> Ladder {
        Ladder {
            rungs: Vec::new(),
            columns: Vec::new(),
            limit,
            left_out: 0,
        }
    }

    /// The rungs drawn so far.
    pub fn rungs(&self) -> &[Rung] {
        &self.rungs
    }

    /// Adds a packet of a capture; `repeated`: it repeats an earlier packet of its sender
    /// (the capture summary knows).
    pub fn frame(&mut self, number: usize, time: Duration, p: &ParsedFrame<'_>, repeated: bool) {
        let (from, to) = addresses(p);
        let r = &p.repr.roce;
        let op = r.bth.opcode;
        let mut label = format!("#{number} {} psn={}", short_name(op), r.bth.psn.value());
        let mut kind = if op == Opcode::RC_ACKNOWLEDGE {
            RungKind::Ack
        } else if op.info().is_some_and(|i| i.is_response) {
            RungKind::Response
        } else {
            RungKind::Request
        };
        if let Some(a) = r.aeth {
            let _ = write!(label, " {} msn={}", syndrome_text(a.syndrome), a.msn);
            if !matches!(a.syndrome, Syndrome::Ack { .. }) {
                kind = RungKind::Nak;
            }
        }
        if let Some(reth) = r.reth {
            let _ = write!(label, " len={}", reth.dma_len);
        }
        match xroce::wire::cm::gsi_cm_mad(r) {
            Some(Ok(mad)) => {
                label = format!("#{number} CM {}", mad.message.name());
                kind = RungKind::Cm;
            }
            Some(Err(_)) => {
                label = format!("#{number} MAD (not a CM message xroce reads)");
                kind = RungKind::Cm;
            }
            None => {}
        }
        if repeated && matches!(kind, RungKind::Request | RungKind::Response) {
            kind = RungKind::Retransmit;
            label.push_str(" (again)");
        }
        if !p.icrc_ok() {
            kind = RungKind::BadIcrc;
            label.push_str(" ICRC BAD");
        }
        self.push(Rung {
            number,
            time,
            from,
            to,
            label,
            kind,
        });
    }

    /// Adds a rung made elsewhere (a conformance case's own record of an exchange).
    pub fn push(&mut self, rung: Rung) {
        if self.rungs.len() >= self.limit {
            self.left_out += 1;
            return;
        }
        for end in [&rung.from, &rung.to] {
            if !self.columns.contains(end) {
                self.columns.push(end.clone());
            }
        }
        self.rungs.push(rung);
    }

    /// The diagram as a standalone SVG document.
    pub fn to_svg(&self, title: &str) -> String {
        const LEFT: usize = 110; // room for the time labels
        const GAP: usize = 420; // between two columns
        const TOP: usize = 70;
        const ROW: usize = 24;
        const SLANT: usize = 10;
        let columns = self.columns.len().max(2);
        let width = LEFT + GAP * (columns - 1) + 120;
        let bottom = TOP + ROW * self.rungs.len() + 40;
        let height = bottom + if self.left_out > 0 { 30 } else { 10 };
        let x =
            |name: &str| LEFT + 60 + GAP * self.columns.iter().position(|c| c == name).unwrap_or(0);
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="monospace" font-size="12">"#
        );
        let _ = writeln!(s, "<title>{}</title>", escape(title));
        s.push_str(concat!(
            "<defs><marker id=\"head\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" ",
            "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\">",
            "<path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"context-stroke\"/></marker></defs>\n",
            "<style>line.rung{stroke-width:1.4;marker-end:url(#head)}",
            ".request{stroke:#222;fill:#222}.response{stroke:#1f5fbf;fill:#1f5fbf}",
            ".ack{stroke:#2e8b3a;fill:#2e8b3a}.nak{stroke:#d9480f;fill:#d9480f}",
            ".retransmit{stroke:#8e44ad;fill:#8e44ad;stroke-dasharray:6 3}",
            ".cm{stroke:#777;fill:#777}.bad-icrc{stroke:#c00;fill:#c00;stroke-dasharray:2 2}",
            "text.label{stroke:none}</style>\n"
        ));
        let _ = writeln!(
            s,
            r#"<text x="10" y="20" font-size="14" font-weight="bold">{}</text>"#,
            escape(title)
        );
        for name in &self.columns {
            let cx = x(name);
            let _ = writeln!(
                s,
                r#"<text class="endpoint" x="{cx}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
                TOP - 20,
                escape(name)
            );
            let _ = writeln!(
                s,
                r##"<line class="lifeline" x1="{cx}" y1="{}" x2="{cx}" y2="{bottom}" stroke="#bbb"/>"##,
                TOP - 10
            );
        }
        for (i, r) in self.rungs.iter().enumerate() {
            let y = TOP + ROW * i;
            let (x1, x2) = (x(&r.from), x(&r.to));
            let class = r.kind.class();
            let _ = writeln!(
                s,
                r#"<text class="time" x="10" y="{}">+{:.3} ms</text>"#,
                y + 4,
                r.time.as_secs_f64() * 1e3
            );
            let _ = writeln!(
                s,
                r#"<line class="rung {class}" data-frame="{}" x1="{x1}" y1="{y}" x2="{x2}" y2="{}"/>"#,
                r.number,
                y + SLANT
            );
            let _ = writeln!(
                s,
                r#"<text class="label {class}" x="{}" y="{}" text-anchor="middle">{}</text>"#,
                (x1 + x2) / 2,
                y + 1,
                escape(&r.label)
            );
        }
        if self.left_out > 0 {
            let _ = writeln!(
                s,
                r#"<text class="note" x="10" y="{}">{} more packets not drawn (xroce dump --ladder-max)</text>"#,
                bottom + 10,
                self.left_out
            );
        }
        s.push_str("</svg>\n");
        s
    }

    /// Packets past the limit, not drawn.
    pub fn left_out(&self) -> usize {
        self.left_out
    }
}

/// The opcode without its transport prefix for RC (the common case), with it otherwise.
fn short_name(op: Opcode) -> String {
    let name = op.name();
    name.strip_prefix("RC_").unwrap_or(name).to_string()
}

fn syndrome_text(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { .. } => "ACK".into(),
        Syndrome::RnrNak { timer } => format!(
            "RNR NAK {:.2} ms",
            xroce::wire::rnr_timer(timer).as_secs_f64() * 1e3
        ),
        Syndrome::Nak(NakCode::PsnSequenceError) => "NAK PSN sequence error".into(),
        Syndrome::Nak(code) => format!("NAK {code}"),
        Syndrome::Reserved(b) => format!("reserved syndrome 0x{b:02x}"),
    }
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rung(n: usize, from: &str, to: &str, label: &str, kind: RungKind) -> Rung {
        Rung {
            number: n,
            time: Duration::from_micros(n as u64 * 100),
            from: from.into(),
            to: to.into(),
            label: label.into(),
            kind,
        }
    }

    #[test]
    fn columns_follow_first_appearance_and_labels_are_escaped() {
        let mut l = Ladder::new(10);
        l.push(rung(1, "b", "a", "<SEND> & \"x\"", RungKind::Request));
        l.push(rung(2, "a", "b", "ACK", RungKind::Ack));
        let svg = l.to_svg("t<1>");
        assert!(svg.contains("&lt;SEND&gt; &amp; &quot;x&quot;"));
        assert!(svg.contains("<title>t&lt;1&gt;</title>"));
        let b = svg.find(">b</text>").unwrap();
        let a = svg.find(">a</text>").unwrap();
        assert!(b < a, "the first sender is the left column");
        // b is the left column: the first rung runs left to right.
        assert!(
            svg.contains(r#"data-frame="1" x1="170" y1="70" x2="590""#),
            "{svg}"
        );
        assert_eq!(svg.matches("<line class=\"rung ").count(), 2);
    }

    #[test]
    fn a_limit_counts_what_it_leaves_out() {
        let mut l = Ladder::new(2);
        for n in 1..=5 {
            l.push(rung(n, "a", "b", "x", RungKind::Request));
        }
        assert_eq!(l.rungs().len(), 2);
        assert_eq!(l.left_out(), 3);
        assert!(l.to_svg("t").contains("3 more packets not drawn"));
    }
}
