//! The node's default-route interfaces, and the rule that keeps QoS off them unless asked: an
//! empty or vendor-wide NIC selector must not reconfigure (PFC, trust, MTU) the NIC that carries
//! the node's own traffic (kubelet, SSH, the API server). Pure: the texts of `/proc/net/route` and
//! `/proc/net/ipv6_route` in, names out.

use std::collections::BTreeSet;

use rocefabric_api::NicSelector;

/// Interfaces holding a default route (IPv4 `0.0.0.0/0` or IPv6 `::/0`), from the kernel's
/// `/proc/net/route` and `/proc/net/ipv6_route` texts. `lo` (the kernel's IPv6 reject route) never
/// counts; malformed lines are skipped.
pub fn default_route_netdevs(ipv4_routes: &str, ipv6_routes: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
    for line in ipv4_routes.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 8 && f[1] == "00000000" && f[7] == "00000000" {
            out.insert(f[0].to_string());
        }
    }
    // dest dest_len src src_len next_hop metric refcnt use flags iface
    for line in ipv6_routes.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 10 && f[1] == "00" && f[0].bytes().all(|b| b == b'0') {
            out.insert(f[9].to_string());
        }
    }
    out.remove("lo");
    out
}

/// Whether `selector` names this NIC itself (its netdev, RDMA device or PCI address), rather
/// than catching it with an empty, vendor or device-id selector.
pub fn named_explicitly(
    selector: &NicSelector,
    netdev: &str,
    rdma: &str,
    pci: Option<&str>,
) -> bool {
    selector.netdevs.iter().any(|n| n == netdev)
        || selector.rdma_devices.iter().any(|r| r == rdma)
        || pci.is_some_and(|pci| {
            selector
                .pci_addresses
                .iter()
                .any(|a| pci == a || pci.strip_prefix("0000:") == Some(a.as_str()))
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const ROUTE: &str =
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
enp24s0np0\t0000640A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
";
    const ROUTE6: &str = "00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 enp64s0np0
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 enp64s0np0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";

    #[test]
    fn default_routes_of_both_families_and_never_lo() {
        let got = default_route_netdevs(ROUTE, ROUTE6);
        assert_eq!(got, BTreeSet::from(["eth0".into(), "enp64s0np0".into()]));
        assert!(default_route_netdevs("", "").is_empty());
        assert!(default_route_netdevs("Iface\nbroken line\n", "short\n").is_empty());
    }

    #[test]
    fn only_names_count_as_explicit() {
        let by = |s: &str| -> NicSelector { serde_json::from_str(s).unwrap() };
        let nic = ("enp24s0np0", "mlx5_0", "0000:18:00.0");
        let explicit = |s: &NicSelector| named_explicitly(s, nic.0, nic.1, Some(nic.2));
        assert!(!explicit(&NicSelector::default()));
        assert!(!explicit(&by(
            r#"{"vendors": ["15b3"], "deviceIds": ["1021"]}"#
        )));
        assert!(explicit(&by(r#"{"netdevs": ["enp24s0np0"]}"#)));
        assert!(explicit(&by(r#"{"rdmaDevices": ["mlx5_0"]}"#)));
        assert!(explicit(&by(r#"{"pciAddresses": ["18:00.0"]}"#)));
        assert!(explicit(&by(r#"{"pciAddresses": ["0000:18:00.0"]}"#)));
        assert!(!explicit(&by(r#"{"netdevs": ["enp64s0np0"]}"#)));
    }
}
