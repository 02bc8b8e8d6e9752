//! Prints the rocefabric CRDs as multi-document YAML, or writes them with `--write` to `crds/`
//! and to the Helm chart's copies in `charts/rocefabric/files/crds/`.

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
            let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let dirs = match args.next() {
                Some(dir) => vec![PathBuf::from(dir)],
                // crds/ and the chart's byte-for-byte copies, so the two never drift.
                None => vec![
                    crate_dir.clone(),
                    crate_dir.join("../charts/rocefabric/files/crds"),
                ],
            };
            for dir in dirs.iter().filter(|d| d.is_dir()) {
                for (file, yaml) in rocefabric_api::crdgen::manifests() {
                    let path = dir.join(file);
                    std::fs::write(&path, yaml)?;
                    eprintln!("wrote {}", path.display());
                }
            }
        }
        Some(other) => {
            eprintln!("usage: crdgen [--write [DIR]]  (unknown argument {other:?})");
            std::process::exit(2);
        }
    }
    Ok(())
}
