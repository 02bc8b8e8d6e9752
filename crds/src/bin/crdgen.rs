//! Prints the rocefabric CRDs as multi-document YAML, or writes them to `crds/` with `--write`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        None => {
            for (_, yaml) in rocefabric_api::crdgen::manifests() {
                println!("---\n{yaml}");
            }
        }
        Some("--write") => {
            let dir = args
                .next()
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
            for (file, yaml) in rocefabric_api::crdgen::manifests() {
                let path = dir.join(file);
                std::fs::write(&path, yaml)?;
                eprintln!("wrote {}", path.display());
            }
        }
        Some(other) => {
            eprintln!("usage: crdgen [--write [DIR]]  (unknown argument {other:?})");
            std::process::exit(2);
        }
    }
    Ok(())
}
