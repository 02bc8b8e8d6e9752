//! libFuzzer entry point for every target of `rocefabric-fuzz`: the target is chosen by the
//! environment variable `ROCEFABRIC_FUZZ_TARGET`, read once. Built and run by `fuzz/run`.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rocefabric_fuzz::{TARGETS, Target};

fn chosen() -> &'static Target {
    static TARGET: OnceLock<&'static Target> = OnceLock::new();
    TARGET.get_or_init(|| {
        let name = std::env::var("ROCEFABRIC_FUZZ_TARGET").unwrap_or_default();
        rocefabric_fuzz::target(&name).unwrap_or_else(|| {
            let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            eprintln!("set ROCEFABRIC_FUZZ_TARGET to one of: {}", names.join(", "));
            std::process::exit(2)
        })
    })
}

fuzz_target!(|data: &[u8]| {
    (chosen().run)(data);
});
