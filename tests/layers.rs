//! No import runs up a layer. The provider's modules sit on floors, each using only the floors
//! below it: the wire format at the bottom; the values and captures next to it; the sans-IO
//! engine and the drivers side by side (neither knows the other); the verbs runtime and the
//! CM protocol over them; the RDMA CM over both. The tools are another crate on top
//! (`tools/`, which the compiler keeps above: this crate does not depend on it). This test
//! reads every `crate::` path in the provider's code (comments and strings left out) and fails
//! on one that names a module on the same floor or above, unless it is one of the exceptions
//! listed here, each with the reason it still stands.
use std::collections::BTreeSet;
use std::path::Path;

#[path = "common/source.rs"]
mod source;
use source::{code_only, crate_paths, names_after, sources};

/// Each top-level module and its floor.
const FLOORS: &[(&str, u32)] = &[
    ("wire", 0),
    ("capture", 1),
    ("netdev", 1),
    ("dma", 1),
    ("engine", 2),
    ("driver", 2),
    ("netns", 2),
    ("verbs", 3),
    ("cm", 3),
    ("sim", 3),
    ("rdmacm", 4),
];

/// Imports across or up a floor that still stand: (from, to, why). None today: keep the
/// list for the day one is needed, with its reason.
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

fn floor(module: &str) -> Option<u32> {
    FLOORS.iter().find(|(m, _)| *m == module).map(|(_, f)| *f)
}

/// The module a source file belongs to (`engine/mr.rs` -> `engine`, `netdev.rs` -> `netdev`).
fn module_of(path: &Path) -> String {
    let first = path
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

#[test]
fn every_module_has_a_floor() {
    let mut modules: BTreeSet<String> = sources().iter().map(|(path, _)| module_of(path)).collect();
    // The crate root: the library's module list.
    modules.remove("lib");
    let missing: Vec<_> = modules.iter().filter(|m| floor(m).is_none()).collect();
    assert!(
        missing.is_empty(),
        "modules with no floor in FLOORS: {missing:?}"
    );
}

#[test]
fn no_import_runs_up_a_layer() {
    let mut up = Vec::new();
    let mut used = BTreeSet::new();
    for (path, text) in sources() {
        let from = module_of(&path);
        let Some(from_floor) = floor(&from) else {
            continue;
        };
        for to in crate_paths(&code_only(&text)) {
            let Some(to_floor) = floor(&to) else {
                continue;
            };
            if to == from || to_floor < from_floor {
                continue;
            }
            if EXCEPTIONS.iter().any(|(f, t, _)| *f == from && *t == to) {
                used.insert((from.clone(), to.clone()));
                continue;
            }
            up.push(format!(
                "src/{}: crate::{to} (floor {to_floor}) from {from} (floor {from_floor})",
                path.display()
            ));
        }
    }
    assert!(up.is_empty(), "imports up a layer:\n{}", up.join("\n"));
    // An exception nobody needs any more is a rule that can be tightened.
    let stale: Vec<_> = EXCEPTIONS
        .iter()
        .filter(|(f, t, _)| !used.contains(&(f.to_string(), t.to_string())))
        .collect();
    assert!(stale.is_empty(), "exceptions no longer used: {stale:?}");
}

/// The engine's rooms and their floors: the values at the bottom; the queues and tables; the
/// rooms every actor ends its work in (completions and QP errors, outgoing packets); the
/// completer; the requester (which completes a local operation at the head through the
/// completer) and the responder; what drives them on top (transmit, receive, post, modify).
/// `mod.rs` is the engine's root: it holds the `Engine` and its state, which every room uses.
const ENGINE_FLOORS: &[(&str, u32)] = &[
    ("types", 0),
    ("time", 0),
    ("limits", 0),
    ("counters", 0),
    ("shared_table", 0),
    ("state", 1),
    ("timers", 1),
    ("qp", 2),
    ("av", 2),
    ("mr", 3),
    ("cq", 3),
    ("srq", 3),
    ("gsi", 3),
    ("mw", 4),
    ("objects", 4),
    ("completion", 5),
    ("outgoing", 5),
    ("completer", 6),
    ("requester", 7),
    ("responder", 7),
    ("transmit", 8),
    ("receive", 8),
    ("post", 8),
    ("modify", 8),
];

/// The RDMA CM's rooms: the public types; the registry (the CM's shared state and the ids'
/// data, which the service hands what only it can do when a `Cm` is made); listening behind a
/// relay; the ids; the service (the `Cm`, its port threads and the agent's news) on top.
const RDMACM_FLOORS: &[(&str, u32)] = &[
    ("types", 0),
    ("registry", 1),
    ("relay_listen", 2),
    ("id", 3),
    ("service", 4),
];

/// The CM protocol's rooms: the values it exchanges and a message with its transaction id;
/// the agent (its connections, listeners and SIDR exchanges, and what all work on it
/// needs); the three kinds of work on it, side by side: the caller's commands, the handlers
/// of arriving MADs, the timers.
const CM_FLOORS: &[(&str, u32)] = &[
    ("types", 0),
    ("msg", 0),
    ("agent", 1),
    ("commands", 2),
    ("handlers", 2),
    ("timers", 2),
    ("tests", 3),
];

/// The rooms of `folder` a file names: `super::<room>`, the rooms in `super::{..}`, and
/// `crate::<folder>::<room>` (and its braces).
fn rooms_named(code: &str, folder: &str) -> BTreeSet<String> {
    let mut rooms = names_after(code, "super::");
    rooms.extend(names_after(code, &format!("crate::{folder}::")));
    rooms
}

/// Every room of `src/<folder>/` uses only rooms on floors below its own: no circle.
fn assert_rooms_on_floors(folder: &str, floors: &[(&str, u32)]) {
    let floor_of = |room: &str| floors.iter().find(|(r, _)| *r == room).map(|(_, f)| *f);
    let mut up = Vec::new();
    let mut rooms_seen = BTreeSet::new();
    for (path, text) in sources() {
        let Ok(inside) = path.strip_prefix(folder) else {
            continue;
        };
        let from = inside.to_string_lossy().trim_end_matches(".rs").to_string();
        if from == "mod" {
            continue;
        }
        rooms_seen.insert(from.clone());
        let Some(from_floor) = floor_of(&from) else {
            up.push(format!("src/{folder}/{from}.rs has no floor"));
            continue;
        };
        for to in rooms_named(&code_only(&text), folder) {
            let Some(to_floor) = floor_of(&to) else {
                continue;
            };
            if to != from && to_floor >= from_floor {
                up.push(format!(
                    "src/{folder}/{from}.rs (floor {from_floor}) uses {to} (floor {to_floor})"
                ));
            }
        }
    }
    assert!(
        up.is_empty(),
        "the rooms of src/{folder} import up or across:\n{}",
        up.join("\n")
    );
    let gone: Vec<_> = floors
        .iter()
        .filter(|(r, _)| !rooms_seen.contains(*r))
        .collect();
    assert!(
        gone.is_empty(),
        "the floors of src/{folder} name rooms that are gone: {gone:?}"
    );
}

#[test]
fn the_engine_has_no_circle() {
    assert_rooms_on_floors("engine", ENGINE_FLOORS);
}

#[test]
fn the_cm_protocol_has_no_circle() {
    assert_rooms_on_floors("cm", CM_FLOORS);
}

#[test]
fn the_rdma_cm_has_no_circle() {
    assert_rooms_on_floors("rdmacm", RDMACM_FLOORS);
}

#[test]
fn the_room_reader_sees_groups_and_single_names() {
    let code = "use super::{completion::{self, post}, qp, DeviceState};\nuse super::time::Instant; crate::engine::cq::x; a::super::no";
    let found: Vec<String> = rooms_named(code, "engine").into_iter().collect();
    assert_eq!(found, ["DeviceState", "completion", "cq", "qp", "time"]);
}

/// The sans-IO layers (the transport engine and the CM protocol) name no module that does
/// I/O: interface queries, drivers, namespaces, captures. Their values (addresses, MTUs) are
/// the wire's.
#[test]
fn the_sans_io_layers_name_no_io_module() {
    const SANS_IO: [&str; 2] = ["engine", "cm"];
    const IO: [&str; 4] = ["netdev", "driver", "netns", "capture"];
    let mut found = Vec::new();
    for (path, text) in sources() {
        if !SANS_IO.contains(&module_of(&path).as_str()) {
            continue;
        }
        for to in crate_paths(&code_only(&text)) {
            if IO.contains(&to.as_str()) {
                found.push(format!("src/{}: crate::{to}", path.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "sans-IO code naming I/O modules:\n{}",
        found.join("\n")
    );
}

/// The verbs runtime (`src/verbs/runtime/`: the device's shared state, rounds, the progress
/// token and background threads, asynchronous events) is below the handles users hold: it
/// names none of their modules. The handles and their device know each other (the object
/// model of verbs.h); the runtime knows neither.
#[test]
fn the_verbs_runtime_names_no_handle() {
    const HANDLES: [&str; 6] = ["device", "cq", "pd", "qp", "srq", "gsi"];
    let mut found = Vec::new();
    let mut files = 0;
    for (path, text) in sources() {
        let Ok(inside) = path.strip_prefix("verbs/runtime") else {
            continue;
        };
        files += 1;
        // From runtime/mod.rs `super::` is verbs; from a file below it, `super::super::`.
        let verbs = if inside == Path::new("mod.rs") {
            "super::"
        } else {
            "super::super::"
        };
        let code = code_only(&text);
        for handle in HANDLES {
            for prefix in [verbs.to_string(), "crate::verbs::".to_string()] {
                let named = format!("{prefix}{handle}");
                if code.match_indices(&named).any(|(at, _)| {
                    let after = code[at + named.len()..].chars().next();
                    !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
                }) {
                    found.push(format!("src/{}: {named}", path.display()));
                }
            }
        }
    }
    assert!(files >= 3, "read the runtime's files: {files}");
    assert!(
        found.is_empty(),
        "the runtime names handles:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_path_reader_sees_module_names() {
    let code = "use crate::wire::Mtu; let x = crate::engine::GSI_QPN; a::crate::no; xcrate::no; \
                use crate::{dma::UserMemory, netdev};";
    let found: Vec<String> = crate_paths(code).into_iter().collect();
    assert_eq!(found, ["dma", "engine", "netdev", "wire"]);
}
