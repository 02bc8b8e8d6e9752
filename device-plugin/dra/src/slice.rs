//! The `ResourceSlice` of the node's pool: one slice per node, named after it, holding every
//! published device.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;

use super::DRIVER_NAME;
use super::devices::{Attr, DraDevice};

/// Most devices one slice may hold (`resource.k8s.io/v1` validation).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Label on our slices, so `kubectl get resourceslices -l` finds them.
pub const NODE_LABEL: &str = "rocefabric.io/node";

/// Name of the node's slice: `<node>-rocefabric.io` (a node name is a DNS subdomain, so this is
/// one too as long as the node name leaves room).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
}

fn attribute(value: &Attr) -> DeviceAttribute {
    match value {
        Attr::Bool(b) => DeviceAttribute {
            bool: Some(*b),
            ..Default::default()
        },
        Attr::Int(i) => DeviceAttribute {
            int: Some(*i),
            ..Default::default()
        },
        Attr::Str(s) => DeviceAttribute {
            string: Some(s.clone()),
            ..Default::default()
        },
    }
}

/// The slice spec of `devices` for `node` at pool `generation`; devices beyond
/// [`MAX_DEVICES_PER_SLICE`] are left out (no node has that many RDMA devices and GPUs).
pub fn spec(node: &str, generation: i64, devices: &[DraDevice]) -> ResourceSliceSpec {
    let devices = devices
        .iter()
        .take(MAX_DEVICES_PER_SLICE)
        .map(|d| Device {
            name: d.name.clone(),
            attributes: Some(
                d.attributes
                    .iter()
                    .map(|(k, v)| (k.clone(), attribute(v)))
                    .collect(),
            ),
            capacity: (!d.capacity.is_empty()).then(|| {
                d.capacity
                    .iter()
                    .map(|(k, v)| {
                        let value = DeviceCapacity {
                            value: Quantity(v.clone()),
                            request_policy: None,
                        };
                        (k.clone(), value)
                    })
                    .collect()
            }),
            ..Default::default()
        })
        .collect();
    ResourceSliceSpec {
        driver: DRIVER_NAME.to_string(),
        node_name: Some(node.to_string()),
        pool: ResourcePool {
            name: node.to_string(),
            generation,
            resource_slice_count: 1,
        },
        devices: Some(devices),
        ..Default::default()
    }
}

/// The whole slice object.
pub fn resource_slice(node: &str, generation: i64, devices: &[DraDevice]) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            labels: Some(BTreeMap::from([(NODE_LABEL.to_string(), node.to_string())])),
            ..Default::default()
        },
        spec: spec(node, generation, devices),
    }
}

/// Whether `existing` already says what `devices` would (the generation aside): then nothing is
/// written and the pool's generation stays.
pub fn same_devices(existing: &ResourceSliceSpec, node: &str, devices: &[DraDevice]) -> bool {
    let want = spec(node, existing.pool.generation, devices);
    existing.devices == want.devices
        && existing.node_name == want.node_name
        && existing.driver == want.driver
        && existing.pool == want.pool
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests fail loudly on the unexpected
mod tests {
    use super::*;
    use crate::devices::DeviceKind;

    fn device(name: &str, numa: i64) -> DraDevice {
        DraDevice {
            name: name.into(),
            kind: DeviceKind::Hca,
            physical: format!("0000:{name}"),
            attributes: BTreeMap::from([
                ("type".to_string(), Attr::Str("hca".into())),
                ("numaNode".to_string(), Attr::Int(numa)),
                ("qosReady".to_string(), Attr::Bool(true)),
            ]),
            capacity: BTreeMap::from([("bandwidth".to_string(), "400G".to_string())]),
        }
    }

    #[test]
    fn one_pool_per_node_with_typed_attributes() {
        let slice = resource_slice("node-a", 3, &[device("hca-mlx5-0", 1)]);
        assert_eq!(slice.metadata.name.as_deref(), Some("node-a-rocefabric.io"));
        let spec = &slice.spec;
        assert_eq!(spec.driver, "rocefabric.io");
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.pool.name, "node-a");
        assert_eq!(spec.pool.generation, 3);
        assert_eq!(spec.pool.resource_slice_count, 1);
        let json = serde_json::to_value(&spec.devices.as_ref().unwrap()[0]).unwrap();
        assert_eq!(
            json["attributes"]["numaNode"],
            serde_json::json!({"int": 1})
        );
        assert_eq!(
            json["attributes"]["type"],
            serde_json::json!({"string": "hca"})
        );
        assert_eq!(
            json["attributes"]["qosReady"],
            serde_json::json!({"bool": true})
        );
    }

    #[test]
    fn unchanged_devices_need_no_write_and_a_change_does() {
        let devices = [device("hca-mlx5-0", 0), device("hca-mlx5-1", 1)];
        let existing = spec("n", 7, &devices);
        assert!(same_devices(&existing, "n", &devices));
        assert!(!same_devices(&existing, "n", &devices[..1]));
        assert!(!same_devices(
            &existing,
            "n",
            &[device("hca-mlx5-0", 1), device("hca-mlx5-1", 1)]
        ));
        assert!(!same_devices(&existing, "other", &devices));
    }
}
