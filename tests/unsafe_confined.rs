//! `unsafe` stays in the driver layer: `src/driver` and `src/dma.rs` (the application's
//! memory, on the floor below the engine). The compiler enforces it (`#![deny(unsafe_code)]`
//! at the roots of the library and the binary, `#[allow(unsafe_code)]` only on `pub mod
//! dma;` and `pub mod driver;`); this test keeps that arrangement from being undone quietly:
//! no other `allow(unsafe_code)`, no `unsafe` in code outside those two, and every `unsafe`
//! in them right under a `// Safety:` comment.
use std::path::{Path, PathBuf};

#[path = "common/source.rs"]
mod source;
use source::{code_only, has_word, sources};

/// `src/driver/**` and `src/dma.rs`: the only code allowed `unsafe`.
fn in_driver_layer(path: &Path) -> bool {
    path.starts_with("driver") || path == Path::new("dma.rs")
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
    // The tools crate has none at all: the compiler refuses it in both of its roots.
    for file in ["tools/src/lib.rs", "tools/src/main.rs"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        assert!(
            text.lines().any(|l| l.trim() == "#![forbid(unsafe_code)]"),
            "{file} must forbid unsafe code"
        );
    }
    let provider_root = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(
        provider_root
            .lines()
            .any(|l| l.trim() == "#![deny(unsafe_code)]"),
        "src/lib.rs must deny unsafe code"
    );
    assert!(
        provider_root
            .lines()
            .any(|l| l.trim() == "#![warn(clippy::undocumented_unsafe_blocks)]"),
        "src/lib.rs must ask for a Safety comment on every unsafe block"
    );
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
        [
            (PathBuf::from("lib.rs"), Some("pub mod dma;".to_string())),
            (PathBuf::from("lib.rs"), Some("pub mod driver;".to_string()))
        ],
        "allow(unsafe_code) belongs on the driver layer's two modules only"
    );
}

#[test]
fn unsafe_outside_the_driver_layer_is_only_in_comments() {
    let mut found = Vec::new();
    for (path, text) in sources() {
        if in_driver_layer(&path) {
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
        "unsafe code outside src/driver and src/dma.rs:\n{}",
        found.join("\n")
    );
}

#[test]
fn every_unsafe_in_the_driver_layer_says_why_it_holds() {
    let mut blocks = 0;
    let mut undocumented = Vec::new();
    for (path, text) in sources() {
        if !in_driver_layer(&path) {
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
