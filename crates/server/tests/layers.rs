//! The server crate is layered. Its top-level modules, bottom first (a
//! module may name modules of its own layer or below, never above):
//!
//! 1. leaves, naming no other module: `span`, `publication`, `registry`,
//!    `heap`, `process`, `fds`, `peers`, `listener`, `outbound`, `reloadable`,
//!    `sharded`, `deflate`, `backend` (the one HTTP client to the
//!    application's backend), `hooks` (which names `backend`);
//! 2. `history`, `messages` (what a worker's mailbox carries), `tls`;
//! 3. `hub`, `namespace`, `redis_tls`, `link`;
//! 4. `engine`, `feeds`, `proxy` (all send into the hub);
//! 5. `config` (every setting, built from the engine's and TLS's own);
//! 6. `auth`, `session`, `transport`, `doctor` (the host's limits against
//!    the settings);
//! 7. `metrics`, `conn`;
//! 8. `shared` (the node's state every thread holds);
//! 9. `status`, `sessions` (a worker's subscription core, apart from its
//!    sockets);
//! 10. `worker`, `admin`;
//! 11. `lib.rs`, which wires them together.
//!
//! This reads every source file, takes each `crate::<module>` it names
//! outside comments, and fails on a name that reaches a higher layer, on a
//! module missing from the map above, and on any circle among the
//! top-level modules (modules of one layer may name each other, but not
//! in a circle). docs/architecture.md ("Layers") describes the same order.
//! It also keeps every file but the config under 800 lines.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layer of top-level module `module`, bottom first; `None` for a
/// module the map does not know.
fn layer(module: &str) -> Option<u8> {
    Some(match module {
        "span" | "publication" | "registry" | "heap" | "process" | "fds" | "peers" | "listener"
        | "sharded" | "outbound" | "reloadable" | "deflate" | "backend" | "hooks" => 1,
        "history" | "messages" | "tls" => 2,
        "hub" | "namespace" | "redis_tls" | "link" => 3,
        "engine" | "feeds" | "proxy" => 4,
        "config" => 5,
        "auth" | "session" | "transport" | "doctor" => 6,
        "metrics" | "conn" => 7,
        "shared" => 8,
        "status" | "sessions" => 9,
        "worker" | "admin" => 10,
        "lib" => 11,
        _ => return None,
    })
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to: `src/engine/redis/instance.rs` →
/// `engine`, `src/hub.rs` → `hub`, `src/lib.rs` → `lib`.
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.iter().next().unwrap().to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// The top-level modules a file names as `crate::<module>`, outside
/// comments. A `crate::{…}` group is refused: each path is written out so
/// that this check can read it.
fn named_modules(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            assert!(
                !rest.starts_with('{'),
                "{line:?}: write each `crate::` path out; the layer check cannot read a group"
            );
            let module: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.insert(module);
        }
    }
    out
}

/// Which top-level module names which, from the files under `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let from = top_module(src, &file);
        let named = named_modules(&fs::read_to_string(&file).unwrap());
        let edges = graph.entry(from.clone()).or_default();
        edges.extend(named.into_iter().filter(|to| *to != from));
    }
    graph
}

/// A circle through `graph`, as the modules on it, if there is one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Depth first; a module met again while still on the path closes a
    // circle. `done` holds modules whose every onward path was explored.
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut found = path[at..].to_vec();
            found.push(module.to_owned());
            return Some(found);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(module.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

/// What breaks the layering, one line each.
fn violations(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut found = Vec::new();
    for (from, named) in graph {
        let Some(own) = layer(from) else {
            found.push(format!("src/{from}: a module outside the layer map"));
            continue;
        };
        for to in named {
            match layer(to) {
                None => found.push(format!("{from} → crate::{to}: outside the layer map")),
                Some(theirs) if theirs > own => {
                    found.push(format!(
                        "{from} (layer {own}) → crate::{to} (layer {theirs}): a higher layer"
                    ));
                }
                Some(_) => {}
            }
        }
    }
    if let Some(circle) = circle(graph) {
        found.push(format!("a circle: {}", circle.join(" → ")));
    }
    found
}

#[test]
fn modules_name_only_their_layer_or_below_and_form_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&graph(&src));
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_an_upward_name_and_a_circle() {
    let named = named_modules("use crate::engine::{Attach, Engine}; // crate::worker");
    assert_eq!(named, BTreeSet::from(["engine".to_owned()]));
    assert_eq!(
        top_module(Path::new("src"), Path::new("src/engine/redis/instance.rs")),
        "engine"
    );

    let mut upward = BTreeMap::new();
    upward.insert("hub".to_owned(), BTreeSet::from(["engine".to_owned()]));
    upward.insert("engine".to_owned(), BTreeSet::new());
    let found = violations(&upward);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a higher layer"), "{found:?}");

    let mut same_layer = BTreeMap::new();
    same_layer.insert("engine".to_owned(), BTreeSet::from(["feeds".to_owned()]));
    same_layer.insert("feeds".to_owned(), BTreeSet::from(["engine".to_owned()]));
    let found = violations(&same_layer);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("a circle: "), "{found:?}");
}

/// Files a reader can hold in mind: none but `config.rs` (one table of every
/// setting, which reads best in one place) runs past this many lines.
const MOST_LINES: usize = 800;

#[test]
fn no_source_file_but_the_config_runs_past_800_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter(|file| *file != &src.join("config.rs"))
        .map(|file| (file, fs::read_to_string(file).unwrap().lines().count()))
        .filter(|(_, lines)| *lines > MOST_LINES)
        .map(|(file, lines)| format!("{}: {lines} lines", file.display()))
        .collect();
    assert!(
        long.is_empty(),
        "split these by what they own:\n{}",
        long.join("\n")
    );
}
