//! `unsafe` stays in the driver layer. The compiler enforces it (`#![deny(unsafe_code)]` at
//! the roots of the library and the binary, `#[allow(unsafe_code)]` only on `pub mod
//! driver;`); this test keeps that arrangement from being undone quietly: no other
//! `allow(unsafe_code)`, no `unsafe` in code outside `src/driver`, and every `unsafe` in
//! the driver layer right under a `// Safety:` comment.
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources() -> Vec<(PathBuf, String)> {
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
fn code_only(text: &str) -> String {
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

fn has_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

#[test]
fn the_stripper_sees_only_code() {
    let text = "let a = \"unsafe\"; // unsafe\n/* unsafe /* nested */ unsafe */ let c = 'u';\n\
                fn f<'a>(x: &'a u8) { let r = r#\"unsafe \"# ; unsafe { g() } }\n";
    let code = code_only(text);
    assert_eq!(code.lines().count(), 3);
    let hits: Vec<usize> = code
        .lines()
        .enumerate()
        .filter(|(_, l)| has_word(l, "unsafe"))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(hits, [2], "only the block on line 3 is code: {code:?}");
    assert!(code.contains("fn f<'a>(x: &'a u8)"), "{code:?}");
    assert!(!has_word("unsafe_code", "unsafe"));
}

#[test]
fn the_roots_deny_unsafe_code_and_only_the_driver_layer_is_allowed_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in ["src/lib.rs", "src/main.rs"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(
            text.lines().any(|l| l.trim() == "#![deny(unsafe_code)]"),
            "{file} must deny unsafe code"
        );
        assert!(
            text.lines()
                .any(|l| l.trim() == "#![warn(clippy::undocumented_unsafe_blocks)]"),
            "{file} must ask for a Safety comment on every unsafe block"
        );
    }
    let mut allowed = Vec::new();
    for (path, text) in sources() {
        let code = code_only(&text);
        let lines: Vec<&str> = code.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if line.contains("allow(unsafe_code)") {
                let next = lines[n + 1..].iter().find(|l| !l.trim().is_empty());
                allowed.push((path.clone(), next.map(|l| l.trim().to_string())));
            }
        }
    }
    assert_eq!(
        allowed,
        [(PathBuf::from("lib.rs"), Some("pub mod driver;".to_string()))],
        "allow(unsafe_code) belongs on the driver module only"
    );
}

#[test]
fn unsafe_outside_src_driver_is_only_in_comments() {
    let mut found = Vec::new();
    for (path, text) in sources() {
        if path.starts_with("driver") {
            continue;
        }
        for (n, line) in code_only(&text).lines().enumerate() {
            if has_word(line, "unsafe") {
                found.push(format!("src/{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "unsafe code outside src/driver:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_unsafe_in_the_driver_layer_says_why_it_holds() {
    let mut blocks = 0;
    let mut undocumented = Vec::new();
    for (path, text) in sources() {
        if !path.starts_with("driver") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in code_only(&text).lines().enumerate() {
            if !has_word(line, "unsafe") {
                continue;
            }
            blocks += 1;
            // The `// Safety:` comment sits on the lines right above (the statement may
            // start a line or two before the `unsafe` keyword, as in `let x =\n unsafe`).
            let above = lines[n.saturating_sub(8)..n]
                .iter()
                .rev()
                .take_while(|l| !l.trim().is_empty() && !l.trim().ends_with(';'))
                .any(|l| l.trim_start().starts_with("// Safety:"));
            if !above {
                undocumented.push(format!("src/{}:{}", path.display(), n + 1));
            }
        }
    }
    assert!(blocks > 0, "the driver layer has unsafe blocks to look at");
    assert!(
        undocumented.is_empty(),
        "unsafe without a `// Safety:` comment right above: {undocumented:?}"
    );
}
