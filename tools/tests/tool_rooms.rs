//! The tools' families know each other one way only: reading every `crate::<module>` path in
//! `tools/src/` (comments and strings left out), the graph of the crate's top-level modules
//! has no circle. Shared pieces (`setup`, `options`, `endpoint`, `json_line`) sit below the
//! families that use them; a family that needs another's piece means the piece belongs lower.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

#[path = "../../tests/common/source.rs"]
mod source;
use source::{code_only, crate_paths, sources};

/// The top-level module a file of `tools/src/` belongs to (`perftest/oob/codec.rs` ->
/// `perftest`); `None` for the crate roots and the binary's CLI.
fn module_of(path: &Path) -> Option<String> {
    let first = path.components().next()?.as_os_str().to_string_lossy();
    let name = first.trim_end_matches(".rs").to_string();
    (!["lib", "main", "cli"].contains(&name.as_str())).then_some(name)
}

/// A circle of `graph`, if it has one.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_tool_families_have_no_circle() {
    let files = sources();
    let modules: BTreeSet<String> = files.iter().filter_map(|(p, _)| module_of(p)).collect();
    assert!(
        modules.contains("perftest") && modules.contains("endpoint"),
        "read the tools' modules: {modules:?}"
    );
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in &files {
        let Some(from) = module_of(path) else {
            continue;
        };
        let uses = graph.entry(from.clone()).or_default();
        for to in crate_paths(&code_only(text)) {
            if to != from && modules.contains(&to) {
                uses.insert(to);
            }
        }
    }
    assert_eq!(find_circle(&graph), None, "the tools' modules: {graph:?}");
}

#[test]
fn the_circle_finder_finds_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_circle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
