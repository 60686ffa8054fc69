//! Replays every kept fuzz input through its target's check, on stable, as
//! part of `cargo test --workspace`: the corpus (`fuzz/corpus/<target>/`,
//! grown and minimised by `scripts/fuzz.sh`) and the crashes found and
//! fixed (`fuzz/regressions/<target>/`). A regression shows up here, fast,
//! without nightly or libFuzzer.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use myriad_fuzz::{Target, TARGETS};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `dir`, sorted; none if it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a readable directory").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs `target`'s check on each file; returns the files it failed on.
fn replay(target: Target, files: &[PathBuf]) -> Vec<String> {
    let mut failed = Vec::new();
    for file in files {
        let data = std::fs::read(file).expect("a readable input");
        if catch_unwind(AssertUnwindSafe(|| (target.check)(&data))).is_err() {
            failed.push(file.display().to_string());
        }
    }
    failed
}

#[test]
fn every_corpus_input_passes_its_check() {
    let mut failed = Vec::new();
    for &target in TARGETS {
        let files = inputs(&fuzz_dir().join("corpus").join(target.name));
        assert!(
            !files.is_empty(),
            "fuzz/corpus/{} is empty: grow it with `scripts/fuzz.sh 60 {}` and commit it",
            target.name,
            target.name
        );
        failed.extend(replay(target, &files));
    }
    assert!(failed.is_empty(), "checks failed on: {failed:#?}");
}

#[test]
fn every_fixed_crash_stays_fixed() {
    let mut failed = Vec::new();
    for &target in TARGETS {
        let files = inputs(&fuzz_dir().join("regressions").join(target.name));
        failed.extend(replay(target, &files));
    }
    assert!(failed.is_empty(), "fixed crashes are back: {failed:#?}");
}

/// A folder for a target that no longer exists would be replayed by
/// nothing, silently.
#[test]
fn every_kept_folder_belongs_to_a_target() {
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind)) else {
            continue;
        };
        for entry in entries {
            let name = entry.expect("a readable directory").file_name();
            let name = name.to_string_lossy();
            assert!(
                myriad_fuzz::target(&name).is_some(),
                "fuzz/{kind}/{name} has no target in crates/fuzz/src/lib.rs"
            );
        }
    }
}
