//! Headers that explain themselves, field by field, for `xroce dump --explain` and
//! `xroce sim --trace --explain`.
//!
//! Each header's `Repr` implements [`PrettyPrint`]: given where it starts in a frame, it
//! writes a heading and one row per field to an [`Explainer`], which holds the frame's bytes
//! (every row shows the bytes it explains, with their offset) and the indentation. Whole
//! packets and frames ([`PacketRepr`](super::PacketRepr), [`ParsedFrame`](super::ParsedFrame))
//! explain themselves by explaining their headers in wire order. Writing goes to any
//! [`fmt::Write`]; nothing here does I/O.
//!
//! ```text
//!   BTH [42..54]  Base Transport Header
//!     002a  11                       opcode 0x11 RC_ACKNOWLEDGE: ...   [ICRC: covered]
//! ```
//!
//! The CM's MADs explain themselves in `pretty/cm.rs`, next to the headers' explanations here.

mod cm;

use std::fmt;

/// How the ICRC treats a field (shown as `[ICRC: ...]` after the row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcRole {
    /// Covered as sent.
    Covered,
    /// Replaced by ones before the CRC (a field routers and switches may change).
    Masked,
    /// Something more particular, e.g. "TC and flow label masked".
    Partly(&'static str),
    /// Not part of what the ICRC sees (Ethernet, the ICRC itself): no note.
    Outside,
}

impl IcrcRole {
    fn note(self) -> &'static str {
        match self {
            IcrcRole::Covered => "covered",
            IcrcRole::Masked => "masked",
            IcrcRole::Partly(text) => text,
            IcrcRole::Outside => "",
        }
    }
}

/// Where headers write their explanation: the frame they are part of, the output, and the
/// indentation level (headings at two spaces per level, their rows one level deeper).
pub struct Explainer<'a> {
    frame: &'a [u8],
    out: &'a mut dyn fmt::Write,
    level: usize,
}

impl<'a> Explainer<'a> {
    /// Explains parts of `frame` into `out`, headings indented by `level` steps.
    pub fn new(frame: &'a [u8], out: &'a mut dyn fmt::Write, level: usize) -> Explainer<'a> {
        Explainer { frame, out, level }
    }

    /// The whole frame (offsets in rows count from its first byte).
    pub fn frame(&self) -> &'a [u8] {
        self.frame
    }

    /// The frame's bytes `at..at + len`, cut at its end (empty past it).
    pub fn bytes(&self, at: usize, len: usize) -> &'a [u8] {
        let end = at.saturating_add(len).min(self.frame.len());
        self.frame.get(at.min(end)..end).unwrap_or(&[])
    }

    /// The big-endian 16-bit word at `at` (0 past the frame's end).
    pub fn be16(&self, at: usize) -> u16 {
        match self.bytes(at, 2) {
            [a, b] => u16::from_be_bytes([*a, *b]),
            _ => 0,
        }
    }

    /// A header's heading line, e.g. `BTH [42..54]  Base Transport Header`.
    pub fn heading(&mut self, text: fmt::Arguments<'_>) -> fmt::Result {
        writeln!(self.out, "{:indent$}{text}", "", indent = 2 * self.level)
    }

    /// One field row: offset, the field's bytes in hex, its meaning and the ICRC's role.
    pub fn field(
        &mut self,
        at: usize,
        len: usize,
        meaning: impl fmt::Display,
        icrc: IcrcRole,
    ) -> fmt::Result {
        let mut hex = String::with_capacity(3 * len);
        for (i, b) in self.bytes(at, len).iter().enumerate() {
            if i > 0 {
                hex.push(' ');
            }
            fmt::Write::write_fmt(&mut hex, format_args!("{b:02x}"))?;
        }
        write!(
            self.out,
            "{:indent$}{at:04x}  {hex:<24} {meaning}",
            "",
            indent = 2 * self.level + 2
        )?;
        match icrc.note() {
            "" => writeln!(self.out),
            note => writeln!(self.out, "   [ICRC: {note}]"),
        }
    }
}

/// A header (or a packet of headers) that explains itself field by field.
pub trait PrettyPrint {
    /// Writes the explanation of `self`, which starts at byte `at` of `out`'s frame.
    fn pretty_print(&self, at: usize, out: &mut Explainer<'_>) -> fmt::Result;

    /// The explanation as a string, `self` starting at `at` of `frame`, headings at `level`.
    fn explain(&self, frame: &[u8], at: usize, level: usize) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = self.pretty_print(at, &mut Explainer::new(frame, &mut text, level));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_show_offset_bytes_and_icrc_role_and_never_read_past_the_frame() {
        let frame = [0xab, 0xcd, 0xef];
        let mut text = String::new();
        let mut e = Explainer::new(&frame, &mut text, 1);
        e.heading(format_args!("X [0..3]")).unwrap();
        e.field(1, 2, "two bytes", IcrcRole::Masked).unwrap();
        e.field(2, 8, "cut at the end", IcrcRole::Outside).unwrap();
        e.field(9, 2, "past the end", IcrcRole::Partly("partly"))
            .unwrap();
        assert_eq!(e.be16(0), 0xabcd);
        assert_eq!(e.be16(2), 0);
        assert_eq!(
            text,
            "  X [0..3]\n    0001  cd ef                    two bytes   [ICRC: masked]\n    \
             0002  ef                       cut at the end\n    \
             0009                           past the end   [ICRC: partly]\n"
        );
    }
}
