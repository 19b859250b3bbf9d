//! docs/architecture.md must describe the code as it is: every file or folder it names
//! exists, and every `xroce::module` it names is a module of the library.
use std::path::Path;

const DOC: &str = include_str!("../docs/architecture.md");

/// Backticked spans of the doc's prose (fenced blocks left out), e.g. `src/engine/post.rs`.
fn code_spans(doc: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    for (i, part) in doc.split("```").enumerate() {
        if i % 2 == 0 {
            spans.extend(part.split('`').skip(1).step_by(2));
        }
    }
    spans
}

/// Every `<crate>::name` the doc mentions, in prose or in its diagrams, for `crate` one of
/// the workspace's two libraries (`xroce`, the provider; `xroce_tools`, the tools).
fn module_names(doc: &str, krate: &str) -> Vec<String> {
    doc.split(&format!("{krate}::"))
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect::<String>()
        })
        .filter(|m| !m.is_empty())
        .collect()
}

/// A span that names a repository path: it starts at a top-level folder of the workspace.
fn as_repo_path(span: &str) -> Option<&str> {
    const ROOTS: [&str; 10] = [
        "src/", "tests/", "bpf/", "abi/", "docs/", "benches/", "fuzz/", "lab/", "scripts/",
        "tools/",
    ];
    let path = span.split_whitespace().next()?;
    let path = path.trim_end_matches([',', '.', ':']);
    (ROOTS.iter().any(|r| path.starts_with(r)) && !path.contains(['<', '*', '{', '(']))
        .then_some(path)
}

#[test]
fn every_path_in_the_architecture_doc_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let named: Vec<&str> = code_spans(DOC)
        .into_iter()
        .filter_map(as_repo_path)
        .collect();
    assert!(
        named.len() > 20,
        "expected the doc to name its files, found {named:?}"
    );
    let missing: Vec<&&str> = named.iter().filter(|p| !root.join(p).exists()).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn every_module_in_the_architecture_doc_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for (krate, src) in [
        ("xroce", root.join("src")),
        ("xroce_tools", root.join("tools/src")),
    ] {
        for module in module_names(DOC, krate) {
            let file = src.join(format!("{module}.rs"));
            let dir = src.join(&module).join("mod.rs");
            assert!(
                file.exists() || dir.exists(),
                "docs/architecture.md names {krate}::{module}, which is not a module of {}",
                src.display()
            );
            checked += 1;
        }
    }
    assert!(
        checked >= 8,
        "expected the doc to name the library's modules, found {checked}"
    );
}

#[test]
fn the_doc_spans_are_read_as_paths() {
    assert_eq!(
        as_repo_path("src/engine/post.rs"),
        Some("src/engine/post.rs")
    );
    assert_eq!(as_repo_path("tools/src/cli/<tool>.rs"), None);
    assert_eq!(as_repo_path("Engine::poll_transmit"), None);
    assert_eq!(code_spans("a `x` b `y`"), vec!["x", "y"]);
    assert_eq!(code_spans("`a`\n```\n`b`\n```\n`c`"), vec!["a", "c"]);
    let doc = "xroce::wire and xroce::Foo, xroce_tools::bench, xroce::sim::X";
    assert_eq!(module_names(doc, "xroce"), vec!["wire", "sim"]);
    assert_eq!(module_names(doc, "xroce_tools"), vec!["bench"]);
}
