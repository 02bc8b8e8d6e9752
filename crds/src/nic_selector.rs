//! Which RDMA NICs belong to a fabric (or to the device plugin's pool).
//!
//! Values within one list are OR'd, lists are AND'd, an empty or absent list matches everything.

use serde::{Deserialize, Serialize};

/// Selects RDMA NICs by PCI identity or name. Only RoCE (Ethernet link layer) ports are ever
/// selected, whatever the selector says.
#[derive(Serialize, Deserialize, schemars::JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NicSelector {
    /// PCI vendor ids in hex (`15b3`, `0x8086`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^(0[xX])?[0-9a-fA-F]{1,4}$")))]
    pub vendors: Vec<String>,
    /// PCI device ids in hex (`1021` for ConnectX-7).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^(0[xX])?[0-9a-fA-F]{1,4}$")))]
    pub device_ids: Vec<String>,
    /// PCI addresses (`0000:18:00.0`; the domain may be omitted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(
        pattern = r"^([0-9a-fA-F]{1,4}:)?[0-9a-fA-F]{1,2}:[01]?[0-9a-fA-F]\.[0-7]$"
    )))]
    pub pci_addresses: Vec<String>,
    /// RDMA device names (`mlx5_0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma_devices: Vec<String>,
    /// Network interface names (`enp24s0np0`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub netdevs: Vec<String>,
}

/// The identity of one RDMA NIC function as discovery sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NicIdentity<'a> {
    /// PCI vendor id; `None` for a virtual RDMA device (Soft-RoCE), which no `vendors` entry selects.
    pub vendor: Option<u16>,
    pub device_id: Option<u16>,
    /// Full PCI address, `0000:18:00.0`; `None` for a virtual RDMA device.
    pub pci_address: Option<&'a str>,
    pub rdma_device: &'a str,
    pub netdev: Option<&'a str>,
}

/// A malformed selector value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid nicSelector.{field} value {value:?}: {reason}")]
pub struct SelectorError {
    pub field: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl NicSelector {
    /// True when the selector has no constraint at all.
    pub fn is_empty(&self) -> bool {
        self.vendors.is_empty()
            && self.device_ids.is_empty()
            && self.pci_addresses.is_empty()
            && self.rdma_devices.is_empty()
            && self.netdevs.is_empty()
    }

    /// Whether `nic` is selected. Malformed hex values never match (see [`NicSelector::check`]).
    pub fn matches(&self, nic: &NicIdentity<'_>) -> bool {
        let hex_any = |list: &[String], id: Option<u16>| {
            list.is_empty() || id.is_some_and(|id| list.iter().any(|v| parse_hex_id(v) == Some(id)))
        };
        let pci_any = |list: &[String]| {
            list.is_empty()
                || list.iter().any(|v| {
                    nic.pci_address.is_some()
                        && normalize_pci_address(v).as_deref() == nic.pci_address
                })
        };
        let name_any = |list: &[String], name: Option<&str>| {
            list.is_empty() || name.is_some_and(|n| list.iter().any(|v| v == n))
        };
        hex_any(&self.vendors, nic.vendor)
            && hex_any(&self.device_ids, nic.device_id)
            && pci_any(&self.pci_addresses)
            && name_any(&self.rdma_devices, Some(nic.rdma_device))
            && name_any(&self.netdevs, nic.netdev)
    }

    /// Reject values that can never match, naming the field and value.
    pub fn check(&self) -> Result<(), SelectorError> {
        for (field, list) in [("vendors", &self.vendors), ("deviceIds", &self.device_ids)] {
            if let Some(bad) = list.iter().find(|v| parse_hex_id(v).is_none()) {
                return Err(SelectorError {
                    field,
                    value: bad.clone(),
                    reason: "expected a 16-bit hex id such as 15b3 or 0x1021",
                });
            }
        }
        if let Some(bad) = self
            .pci_addresses
            .iter()
            .find(|v| normalize_pci_address(v).is_none())
        {
            return Err(SelectorError {
                field: "pciAddresses",
                value: bad.clone(),
                reason: "expected a PCI address such as 0000:18:00.0",
            });
        }
        Ok(())
    }
}

/// Parse a 16-bit PCI id written in hex, with or without `0x`.
pub fn parse_hex_id(value: &str) -> Option<u16> {
    let v = value.trim();
    let digits = v
        .strip_prefix("0x")
        .or_else(|| v.strip_prefix("0X"))
        .unwrap_or(v);
    if digits.is_empty() || digits.len() > 4 {
        return None;
    }
    u16::from_str_radix(digits, 16).ok()
}

/// Normalize a PCI address to `dddd:bb:dd.f` lowercase; a missing domain means `0000`.
pub fn normalize_pci_address(value: &str) -> Option<String> {
    let v = value.trim().to_ascii_lowercase();
    let parts: Vec<&str> = v.split(':').collect();
    let (domain, bus, devfn) = match parts.as_slice() {
        [d, b, df] => (*d, *b, *df),
        [b, df] => ("0000", *b, *df),
        _ => return None,
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |s: &str, max_len: usize| {
        !s.is_empty() && s.len() <= max_len && s.chars().all(|c| c.is_ascii_hexdigit())
    };
    if !(hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && func.len() == 1 && hex(func, 1)) {
        return None;
    }
    let d = u32::from_str_radix(domain, 16).ok()?;
    let b = u32::from_str_radix(bus, 16).ok()?;
    let dv = u32::from_str_radix(dev, 16).ok()?;
    let f = u32::from_str_radix(func, 16).ok()?;
    if dv > 0x1f || f > 7 {
        return None;
    }
    Some(format!("{d:04x}:{b:02x}:{dv:02x}.{f:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx7<'a>() -> NicIdentity<'a> {
        NicIdentity {
            vendor: Some(0x15b3),
            device_id: Some(0x1021),
            pci_address: Some("0000:18:00.0"),
            rdma_device: "mlx5_0",
            netdev: Some("enp24s0np0"),
        }
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(NicSelector::default().matches(&cx7()));
        assert!(NicSelector::default().is_empty());
    }

    #[test]
    fn values_in_a_list_are_ored_and_lists_anded() {
        let sel = NicSelector {
            vendors: vec!["8086".into(), "0x15B3".into()],
            device_ids: vec!["1021".into()],
            ..Default::default()
        };
        assert!(sel.matches(&cx7()));
        let sel = NicSelector {
            netdevs: vec!["enp64s0np0".into()],
            ..sel
        };
        assert!(!sel.matches(&cx7()), "netdev list must also match");
    }

    #[test]
    fn pci_address_without_domain_matches() {
        let sel = NicSelector {
            pci_addresses: vec!["18:00.0".into()],
            ..Default::default()
        };
        assert!(sel.matches(&cx7()));
        let sel = NicSelector {
            pci_addresses: vec!["0000:19:00.0".into()],
            ..Default::default()
        };
        assert!(!sel.matches(&cx7()));
    }

    #[test]
    fn rdma_device_names_match_exactly_not_by_prefix() {
        let sel = NicSelector {
            rdma_devices: vec!["mlx5_1".into()],
            ..Default::default()
        };
        let nic = NicIdentity {
            rdma_device: "mlx5_10",
            ..cx7()
        };
        assert!(!sel.matches(&nic));
    }

    #[test]
    fn pci_identity_selectors_never_match_a_virtual_device() {
        let rxe = NicIdentity {
            vendor: None,
            device_id: None,
            pci_address: None,
            rdma_device: "rxe0",
            netdev: Some("eth0"),
        };
        for sel in [
            NicSelector {
                vendors: vec!["15b3".into()],
                ..Default::default()
            },
            NicSelector {
                device_ids: vec!["1021".into()],
                ..Default::default()
            },
            NicSelector {
                pci_addresses: vec!["0000:18:00.0".into()],
                ..Default::default()
            },
        ] {
            assert!(!sel.matches(&rxe), "{sel:?} selected a virtual device");
        }
        let by_name = NicSelector {
            rdma_devices: vec!["rxe0".into()],
            netdevs: vec!["eth0".into()],
            ..Default::default()
        };
        assert!(by_name.matches(&rxe));
    }

    #[test]
    fn netdev_selector_never_matches_a_nic_without_netdev() {
        let sel = NicSelector {
            netdevs: vec!["enp24s0np0".into()],
            ..Default::default()
        };
        assert!(!sel.matches(&NicIdentity {
            netdev: None,
            ..cx7()
        }));
    }

    #[test]
    fn check_names_field_and_value() {
        let sel = NicSelector {
            device_ids: vec!["cx7".into()],
            ..Default::default()
        };
        let err = sel.check().unwrap_err();
        assert_eq!(err.field, "deviceIds");
        assert!(err.to_string().contains("\"cx7\""), "{err}");
        let sel = NicSelector {
            pci_addresses: vec!["18:00".into()],
            ..Default::default()
        };
        assert_eq!(sel.check().unwrap_err().field, "pciAddresses");
    }

    #[test]
    fn pci_normalization() {
        assert_eq!(
            normalize_pci_address("0000:AA:00.1").as_deref(),
            Some("0000:aa:00.1")
        );
        assert_eq!(
            normalize_pci_address("aa:00.1").as_deref(),
            Some("0000:aa:00.1")
        );
        assert_eq!(normalize_pci_address("aa:20.1"), None);
        assert_eq!(normalize_pci_address("aa:00.8"), None);
        assert_eq!(normalize_pci_address("zz:00.0"), None);
    }
}
