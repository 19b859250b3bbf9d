//! The library's own source, read by the tests that guard its structure
//! (tests/unsafe_confined.rs, tests/layers.rs, tools/tests/tool_rooms.rs): every
//! `src/**/*.rs` with its path, its code with comments and literals blanked out, and the
//! module names its paths start with. Include with
//! `#[path = "common/source.rs"] mod source;`.
#![allow(dead_code)]
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

pub fn sources() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "found the source tree: {files:?}");
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(&src).unwrap().to_path_buf(), text)
        })
        .collect()
}

/// The code of `text` with comments, string and character literals blanked out (newlines
/// kept, so line numbers stay right).
pub fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            // Block comments nest in Rust.
            let (mut depth, mut j) = (0usize, i);
            loop {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else {
                    j += 1;
                }
            }
        } else if rest.starts_with(b"r\"") || rest.starts_with(b"r#") {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                out.push(rest[0] as char);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = i + 2 + hashes;
            body + b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .expect("raw string closed")
                + close.len()
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            match rest.get(1..).and_then(|r| {
                if r.first() == Some(&b'\\') {
                    r[1..].iter().position(|&c| c == b'\'').map(|p| p + 3)
                } else {
                    let ch = std::str::from_utf8(&r[..r.len().min(4)])
                        .ok()
                        .or_else(|| std::str::from_utf8(&r[..1]).ok())?
                        .chars()
                        .next()?;
                    (r.get(ch.len_utf8()) == Some(&b'\'')).then_some(ch.len_utf8() + 2)
                }
            }) {
                Some(len) => i + len,
                None => {
                    out.push('\'');
                    i += 1;
                    continue;
                }
            }
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    out
}

pub fn has_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// The names right after `prefix` wherever the code has it (not inside a longer path such as
/// `a::crate::`): `crate::wire::Mtu` gives `wire` for `crate::`; a group gives its top-level
/// names, `super::{a, b::{c, d}, e}` gives `a`, `b` and `e` for `super::`.
pub fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut word, mut fresh) = (0, String::new(), true);
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.extend((!word.is_empty()).then(|| std::mem::take(&mut word)));
                        fresh = true;
                    }
                    c if depth == 0 && fresh && (c.is_alphanumeric() || c == '_') => word.push(c),
                    _ if !word.is_empty() => {
                        found.insert(std::mem::take(&mut word));
                        fresh = false;
                    }
                    _ => {}
                }
            }
            found.extend((!word.is_empty()).then_some(word));
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.extend((!name.is_empty()).then_some(name));
        }
    }
    found
}

/// Every `crate::<module>` the code names, grouped imports (`crate::{a, b}`) included.
pub fn crate_paths(code: &str) -> BTreeSet<String> {
    names_after(code, "crate::")
}
