//! The bench is layered: util → schema and measurements → worker → coordinator
//! → report → lib.rs. This reads every source file, maps its module path
//! to its layer, and fails on any `crate::…` path that reaches a higher
//! layer, or on a workload file naming another workload's file.

use std::fs;
use std::path::{Path, PathBuf};

/// The layer of module `path` (segments under `src/`), bottom first.
fn layer(path: &[String]) -> u8 {
    match path.first().map(String::as_str) {
        Some("util") => 1,
        Some("schema" | "measurements") => 2,
        Some("worker") => 3,
        Some("coordinator") => 4,
        Some("report") => 5,
        None | Some("lib") => 6,
        Some(other) => panic!("src/{other}: a module outside the layer map in lib.rs"),
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file: `src/worker/workloads/churn.rs` →
/// [worker, workloads, churn]; `mod.rs` and `lib.rs` name their directory.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut segs: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    segs
}

/// The module paths a file names as `crate::a::b…`, outside comments. A
/// `use crate::{a, b::c}` group is refused: the check reads one path per
/// `crate::`, so each must be written out.
fn crate_paths(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':' || *c == '{')
                .collect();
            assert!(
                !path.starts_with('{'),
                "{line:?}: write each `crate::` path out; the layer check cannot read a group"
            );
            let path = path.trim_end_matches([':', '{']);
            out.push(path.split("::").map(str::to_owned).collect());
        }
    }
    out
}

/// `(side, workload)` when `m` is a workload's file, e.g.
/// [worker, workloads, churn] → ("worker", "churn").
fn workload(m: &[String]) -> Option<(&str, &str)> {
    match m {
        [side, w, name, ..] if w == "workloads" => Some((side, name)),
        _ => None,
    }
}

/// What breaks the layering in `src`, one line each.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let from = module_of(src, &file);
        let text = fs::read_to_string(&file).unwrap();
        for to in crate_paths(&text) {
            let name = format!("{} → crate::{}", file.display(), to.join("::"));
            if layer(&to) > layer(&from) {
                found.push(format!("{name}: a higher layer"));
            }
            if let (Some(a), Some(b)) = (workload(&from), workload(&to)) {
                if a.0 == b.0 && a.1 != b.1 {
                    found.push(format!("{name}: another workload"));
                }
            }
        }
    }
    found
}

#[test]
fn imports_only_go_down_and_no_workload_imports_another() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(found.is_empty(), "layering broken:\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_an_upward_import_and_a_sideways_workload() {
    let from = module_of(Path::new("src"), Path::new("src/util/histogram.rs"));
    let to = crate_paths("use crate::coordinator::progress::thousands;");
    assert!(layer(&to[0]) > layer(&from));
    let churn = module_of(Path::new("src"), Path::new("src/worker/workloads/churn.rs"));
    let to = crate_paths("use crate::worker::workloads::publishers::{PublishDriver, X};");
    assert_eq!(workload(&churn), Some(("worker", "churn")));
    assert_eq!(workload(&to[0]), Some(("worker", "publishers")));
}
