//! `rocefabric-fixture NAME DIR`: write a built-in fixture node (a DGX H100 and its variants, a
//! Soft-RoCE VM) to DIR, as `DIR/sys` and `DIR/dev`, for trying the node daemon
//! without the hardware:
//!
//! ```sh
//! cargo run -p rocefabric-e2e --bin rocefabric-fixture -- dgx-h100 /tmp/dgx
//! cargo run -p rocefabric-device-plugin -- discover --sysfs-root /tmp/dgx/sys
//! ```

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use clap::builder::PossibleValuesParser;
use rocefabric_node_testing::fixtures::{self, FixtureNode};

/// Write a built-in fixture node's sysfs and /dev trees.
#[derive(Debug, Parser)]
#[command(name = "rocefabric-fixture")]
struct Args {
    /// Which node.
    #[arg(value_parser = PossibleValuesParser::new(fixtures::VARIANTS))]
    name: String,
    /// Where to write it (created; must be empty or missing).
    dir: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let node = FixtureNode::variant(&args.name)
        .with_context(|| format!("unknown fixture {:?}", args.name))?;
    if args.dir.exists() && args.dir.read_dir()?.next().is_some() {
        anyhow::bail!("{} is not empty", args.dir.display());
    }
    let (sys, dev) = (args.dir.join("sys"), args.dir.join("dev"));
    node.write_to(&sys)
        .with_context(|| format!("failed to write {}", sys.display()))?;
    fixtures::write_dev_nodes(&node, &dev)
        .with_context(|| format!("failed to write {}", dev.display()))?;
    println!("sysfs {}\ndev   {}", sys.display(), dev.display());
    Ok(())
}
