#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn port_rates_parse_to_mbps() {
    assert_eq!(parse_rate_mbps("400 Gb/sec (4X NDR)\n"), Some(400_000));
    assert_eq!(parse_rate_mbps("2.5 Gb/sec (1X SDR)"), Some(2_500));
    assert_eq!(parse_rate_mbps("100 Mb/sec"), Some(100));
    for bad in [
        "",
        "fast",
        "400 Tb/sec",
        "-1 Gb/sec",
        "NaN Gb/sec",
        "1e300 Gb/sec",
    ] {
        assert_eq!(parse_rate_mbps(bad), None, "{bad:?}");
    }
}

#[test]
fn nvidia_information_parsing() {
    let text = "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 180\nGPU UUID: \t GPU-6f3a2c1e-0b1d-4c55-9e2a-8d7f00000003\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDevice Minor: \t 3\n";
    let info = parse_nvidia_information(text);
    assert_eq!(info.minor, Some(3));
    assert_eq!(
        info.uuid.as_deref(),
        Some("GPU-6f3a2c1e-0b1d-4c55-9e2a-8d7f00000003")
    );
    assert_eq!(
        parse_nvidia_information("Device Minor: x\nGPU UUID: n/a\n"),
        NvidiaInformation::default()
    );
}

#[test]
fn gid_parsing() {
    let g = parse_gid("0000:0000:0000:0000:0000:ffff:0ac8:010a\n").unwrap();
    assert_eq!(g.to_ipv4_mapped().unwrap().to_string(), "10.200.1.10");
    assert!(parse_gid("fe80::1").is_none());
    assert!(parse_gid("zzzz:0000:0000:0000:0000:ffff:0ac8:010a").is_none());
}

/// `ports/N/rate` is read like every attribute: a FIFO planted there is refused at once (the
/// port keeps no rate) instead of blocking discovery.
#[test]
fn a_rate_that_is_a_fifo_is_skipped_without_blocking() {
    let dir = rocefabric_node_testing::fixtures::tempdir().unwrap();
    rocefabric_node_testing::fixtures::FixtureNode::dgx_h100()
        .write_to(dir.path())
        .unwrap();
    let rate = dir.path().join("class/infiniband/mlx5_0/ports/1/rate");
    rocefabric_node_testing::fixtures::replace_with_fifo(&rate).unwrap();
    let inv = discover(dir.path(), &NicSelector::default()).unwrap();
    let rate_of = |name: &str| inv.hcas.iter().find(|h| h.name == name).unwrap().rate_mbps;
    assert_eq!(rate_of("mlx5_0"), None);
    assert_eq!(rate_of("mlx5_3"), Some(400_000));
}
