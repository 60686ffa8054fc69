//! The one libFuzzer binary: runs the check of the target named by
//! `MYRIAD_FUZZ_TARGET` (see `myriad_fuzz::TARGETS`), so every target is
//! built and linked once, and a new one needs no file here.
//! `MYRIAD_FUZZ_TARGET=list` prints the names and exits.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

static CHECK: OnceLock<fn(&[u8])> = OnceLock::new();

fuzz_target!(
    init: {
        let name = std::env::var("MYRIAD_FUZZ_TARGET").unwrap_or_default();
        let names: Vec<&str> = myriad_fuzz::TARGETS.iter().map(|t| t.name).collect();
        if name == "list" {
            println!("{}", names.join("\n"));
            std::process::exit(0);
        }
        let Some(target) = myriad_fuzz::target(&name) else {
            eprintln!("MYRIAD_FUZZ_TARGET={name:?} names no target; one of: {}", names.join(", "));
            std::process::exit(2);
        };
        let _ = CHECK.set(target.check);
    },
    |data: &[u8]| {
        let check = CHECK.get().expect("set in init");
        check(data);
    }
);
