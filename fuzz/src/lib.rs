//! Fuzz targets for every parser of outside data in rocefabric.
//!
//! Each [`Target`] takes raw bytes, turns them into what its parser reads (lossy UTF-8 for text,
//! the bytes themselves for netlink), calls the real parser and asserts what must hold for every
//! input: no panic, round trips where a renderer exists (`parse(render(x)) == x`), errors that
//! name what they are about, output bounded by the input. A broken invariant is a panic, which is
//! what the corpus test and libFuzzer report.
//!
//! `cargo test -p rocefabric-fuzz` replays `fuzz/corpus/<target>/` through every target; `fuzz/run`
//! fuzzes them with libFuzzer (see `fuzz/README.md`). This crate is test code: it is not linked
//! into any binary and is not an API.

use std::borrow::Cow;

mod h2;
mod netlink;
mod node;
mod objects;
mod regions;
mod rendezvous;
mod sysfs;

/// One fuzz target: a name (also its corpus folder) and the function that checks one input.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub name: &'static str,
    /// What the target feeds and to which parser.
    pub covers: &'static str,
    pub run: fn(&[u8]),
}

/// Every target, in the order `fuzz/run` runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "snapshot",
        covers: "operator Snapshot::load_str (kubectl -o yaml files of fabrics, nodes, pods, RoceNodes, ConfigMaps)",
        run: objects::snapshot,
    },
    Target {
        name: "fabric_validate",
        covers: "rocefabric_api::validate::fabric_value (CRD schema + CEL) on strict YAML documents",
        run: objects::fabric_validate,
    },
    Target {
        name: "node_config",
        covers: "device plugin Config::from_yaml, duration_text::parse, nic_selector::parse_hex_id",
        run: node::node_config,
    },
    Target {
        name: "qos_config",
        covers: "the `qos apply --config` block: strict YAML, then validate::qos_value",
        run: objects::qos_config,
    },
    Target {
        name: "sysfs_values",
        covers: "sysfs/procfs text: parse_gid, parse_node_guid, parse_nvidia_information, PciChain::parse, is_bdf, distance, normalize_pci_address, driver_files parse_number/parse_trust",
        run: sysfs::sysfs_values,
    },
    Target {
        name: "sysfs_tree",
        covers: "inventory::discover_with over a one-NIC one-GPU fixture tree whose attributes (numa_node, vendor, class, port state, link_layer, node_guid, GID table, nvidia information) come from the input",
        run: sysfs::sysfs_tree,
    },
    Target {
        name: "netlink",
        covers: "qos::netlink parse_messages, parse_attrs (nested), Attr accessors, exchange",
        run: netlink::netlink,
    },
    Target {
        name: "dcbnl",
        covers: "qos::dcbnl decode_ieee_get_reply, decode_set_reply, IeeePfc::decode, DcbApp::decode, Dcbnl over a fake kernel",
        run: netlink::dcbnl,
    },
    Target {
        name: "rtnl",
        covers: "qos::rtnl decode_link, Rtnl get_link/set_mtu over a fake kernel",
        run: netlink::rtnl,
    },
    Target {
        name: "region_annotation",
        covers: "the rocefabric.io/region annotation: formats RegionAssignment::parse (the operator's), data plane parse_assignment",
        run: regions::region_annotation,
    },
    Target {
        name: "region_directory",
        covers: "the regions.json directory: formats directory::parse and render (the operator's), data plane Directory::parse and owner lookup",
        run: regions::region_directory,
    },
    Target {
        name: "rendezvous",
        covers: "the data plane's rendezvous lines: dsm wire Hello/Response/Answer/Reply, check_hello against a directory, check_proof, check_challenge",
        run: rendezvous::rendezvous,
    },
    Target {
        name: "quantity",
        covers: "rocefabric_api::quantity::parse_bytes (regionSize, rocefabric.io/region-size)",
        run: regions::quantity,
    },
    Target {
        name: "h2_front",
        covers: "device plugin kubelet::authority::HeaderRewriter (HTTP/2 header blocks of any client: HPACK decode, :authority mended, re-framed)",
        run: h2::h2_front,
    },
    Target {
        name: "yaml",
        covers: "rocefabric_input::yaml::documents (strict YAML: duplicate keys, depth scan, big integers)",
        run: objects::yaml,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The input as text, invalid UTF-8 replaced (what a `read_to_string` caller would have refused,
/// mapped to the nearest text so the parser still sees the rest).
pub(crate) fn text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}
