//! The device plugin config file: defaults, parsing, and validation errors that name the field
//! and the value.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use rocefabric_node_model::config::{Config, ConfigError, QosGate};

fn err(yaml: &str) -> String {
    Config::from_yaml(yaml).unwrap_err().to_string()
}

#[test]
fn defaults_for_everything() {
    let c = Config::default();
    assert_eq!(c.poll_interval, Duration::from_secs(1));
    assert_eq!(c.hca.resource_name, "rdma/hca");
    assert_eq!(c.hca.shared_replicas, 1);
    assert!(c.hca.selector.is_empty());
    // GPUs are NVIDIA's device plugin's by default, and so are the pairs that hand them out.
    assert!(!c.gpu.enabled);
    assert_eq!(c.gpu.resource_name, "nvidia.com/gpu");
    assert!(!c.gpu_hca.enabled);
    assert_eq!(c.gpu_hca.resource_name, "rdma/gpu-hca");
    assert_eq!(c.traffic_class, None);
    assert_eq!(c.qos_gate, QosGate::Auto);
    assert_eq!(Config::from_yaml("").unwrap(), c);
    assert_eq!(Config::from_yaml("{}\n").unwrap(), c);
    assert_eq!(Config::from_yaml("hca: {}\n").unwrap(), c);
}

#[test]
fn a_full_file_loads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(
        &path,
        r#"
pollInterval: 500ms
hca:
  resourceName: example.com/roce
  sharedReplicas: 4
  selector:
    vendors: ["15b3"]
    deviceIds: ["0x1021"]
    pciAddresses: ["18:00.0"]
    rdmaDevices: [mlx5_0]
    netdevs: [enp24s0np0]
gpu:
  enabled: false
  resourceName: example.com/gpu
gpuHca:
  enabled: true
  resourceName: example.com/rail
trafficClass: 106
qosGate: disabled
"#,
    )
    .unwrap();
    let c = Config::load(&path).unwrap();
    assert_eq!(c.poll_interval, Duration::from_millis(500));
    assert_eq!(c.hca.resource_name, "example.com/roce");
    assert_eq!(c.hca.shared_replicas, 4);
    assert_eq!(c.hca.selector.vendors, ["15b3"]);
    assert_eq!(c.hca.selector.device_ids, ["0x1021"]);
    assert_eq!(c.hca.selector.pci_addresses, ["18:00.0"]);
    assert_eq!(c.hca.selector.rdma_devices, ["mlx5_0"]);
    assert_eq!(c.hca.selector.netdevs, ["enp24s0np0"]);
    assert!(!c.gpu.enabled);
    assert_eq!(c.gpu.resource_name, "example.com/gpu");
    assert!(c.gpu_hca.enabled);
    assert_eq!(c.gpu_hca.resource_name, "example.com/rail");
    assert_eq!(c.traffic_class, Some(106));
    assert_eq!(c.qos_gate, QosGate::Disabled);
    assert_eq!(
        Config::from_yaml("qosGate: enabled").unwrap().qos_gate,
        QosGate::Enabled
    );
    assert_eq!(
        Config::from_yaml("pollInterval: 2m").unwrap().poll_interval,
        Duration::from_secs(120)
    );
}

#[test]
fn typos_are_rejected_not_defaulted() {
    let e = err("hca:\n  sharedReplica: 2\n");
    assert!(e.contains("sharedReplica"), "{e}");
    let e = err("pollIntervall: 1s\n");
    assert!(e.contains("pollIntervall"), "{e}");
    let e = err("hca:\n  selector:\n    vendor: [\"15b3\"]\n");
    assert!(e.contains("vendor"), "{e}");
    let e = err("qosGate: on\n");
    assert!(e.contains("on"), "{e}");
}

#[test]
fn invalid_values_name_field_and_value() {
    let cases = [
        ("hca:\n  sharedReplicas: 0\n", "hca.sharedReplicas", "0"),
        (
            "hca:\n  sharedReplicas: 5000\n",
            "hca.sharedReplicas",
            "5000",
        ),
        ("hca:\n  resourceName: hca\n", "hca.resourceName", "\"hca\""),
        (
            "gpu:\n  resourceName: GPU/x\n",
            "gpu.resourceName",
            "\"GPU/x\"",
        ),
        (
            "gpuHca:\n  resourceName: kubernetes.io/rail\n",
            "gpuHca.resourceName",
            "\"kubernetes.io/rail\"",
        ),
        (
            "hca:\n  selector:\n    deviceIds: [cx7]\n",
            "hca.selector.deviceIds",
            "\"cx7\"",
        ),
        (
            "hca:\n  selector:\n    vendors: [\"15b3x\"]\n",
            "hca.selector.vendors",
            "\"15b3x\"",
        ),
        (
            "hca:\n  selector:\n    pciAddresses: [\"18:00\"]\n",
            "hca.selector.pciAddresses",
            "\"18:00\"",
        ),
        ("pollInterval: 0s\n", "pollInterval", "0s"),
        ("pollInterval: 0ms\n", "pollInterval", "0s"),
    ];
    for (yaml, field, value) in cases {
        match Config::from_yaml(yaml) {
            Err(e @ ConfigError::Invalid { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains(&format!("{field} = {value}")),
                    "{yaml:?}: {text}"
                );
            }
            other => panic!("{yaml:?}: expected an Invalid error, got {other:?}"),
        }
    }
}

#[test]
fn malformed_values_fail_to_parse_with_the_value() {
    for (yaml, needle) in [
        ("pollInterval: 1\n", "\"1\""),
        ("pollInterval: fast\n", "\"fast\""),
        ("trafficClass: 300\n", "300"),
        ("hca:\n  sharedReplicas: -1\n", "-1"),
    ] {
        match Config::from_yaml(yaml) {
            Err(e @ ConfigError::Parse { .. }) => {
                let text = e.to_string();
                assert!(text.contains(needle), "{yaml:?}: {text}");
            }
            other => panic!("{yaml:?}: expected a Parse error, got {other:?}"),
        }
    }
}

#[test]
fn resources_need_distinct_names() {
    let e = err("gpuHca:\n  enabled: true\n  resourceName: rdma/hca\n");
    assert!(e.contains("gpuHca.resourceName = \"rdma/hca\""), "{e}");
    assert!(e.contains("hca.resourceName"), "{e}");
    // A disabled resource does not claim its name.
    let c = Config::from_yaml("gpu:\n  enabled: false\n  resourceName: rdma/hca\n").unwrap();
    assert!(!c.gpu.enabled);
    let c = Config::from_yaml("gpuHca:\n  resourceName: rdma/hca\n").unwrap();
    assert!(!c.gpu_hca.enabled, "off by default, so its name is free");
}

/// Serving HCAs or pairs as `nvidia.com/gpu` would register a second plugin for NVIDIA's GPU
/// resource: the two displace each other and pods asking for GPUs get HCAs.
#[test]
fn only_the_gpu_resource_may_be_called_nvidia_com_gpu() {
    for (yaml, field) in [
        ("hca:\n  resourceName: nvidia.com/gpu\n", "hca.resourceName"),
        (
            "gpuHca:\n  enabled: true\n  resourceName: nvidia.com/gpu\n",
            "gpuHca.resourceName",
        ),
    ] {
        let e = err(yaml);
        assert!(e.contains(&format!("{field} = \"nvidia.com/gpu\"")), "{e}");
        assert!(e.contains("NVIDIA's device plugin"), "{e}");
    }
    let c = Config::from_yaml("gpu:\n  enabled: true\n").unwrap();
    assert_eq!(c.gpu.resource_name, "nvidia.com/gpu");
    // A disabled pair resource does not register its name.
    assert!(Config::from_yaml("gpuHca:\n  resourceName: nvidia.com/gpu\n").is_ok());
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let e = Config::load(&missing).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(e.to_string().contains("missing.yaml"), "{e}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "hca:\n  sharedReplicas: 0\n").unwrap();
    let e = Config::load(&bad).unwrap_err();
    assert!(e.to_string().contains("bad.yaml"), "{e}");
    assert!(e.to_string().contains("hca.sharedReplicas = 0"), "{e}");
    assert_eq!(e.metric_label(), "invalid");
}

#[test]
fn a_key_given_twice_is_refused_naming_key_and_line() {
    match Config::from_yaml("pollInterval: 1s\nhca:\n  sharedReplicas: 2\nhca: {}\n") {
        Err(e @ ConfigError::Parse { .. }) => assert_eq!(
            e.to_string(),
            "failed to parse config: invalid YAML: document 1: duplicate key \"hca\" at line 4"
        ),
        other => panic!("expected a Parse error, got {other:?}"),
    }
    let e = err("hca:\n  sharedReplicas: 2\n  sharedReplicas: 3\n");
    assert!(
        e.contains("duplicate key \"sharedReplicas\" at line 3"),
        "{e}"
    );
}

#[test]
fn type_errors_name_the_field_path() {
    assert_eq!(
        err("hca:\n  sharedReplicas: many\n"),
        "failed to parse config: hca.sharedReplicas: invalid type: string \"many\", expected u32"
    );
    let e = err("hca:\n  selector:\n    vendors: [[\"15b3\"]]\n");
    assert!(e.contains("hca.selector.vendors[0]: invalid type"), "{e}");
    // A file of comments only is an empty document: the defaults.
    assert_eq!(
        Config::from_yaml("# nothing set\n").unwrap(),
        Config::default()
    );
}

#[test]
fn a_config_file_over_1_mib_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    // Sparse: 2 MiB of NULs without writing them.
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let e = Config::load(&big).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "cannot load config: {} is larger than the 1 MiB limit",
            big.display()
        )
    );
    // The path is named once, by the read error.
    let missing = dir.path().join("missing.yaml");
    let text = rocefabric_api::errors::one_line(&Config::load(&missing).unwrap_err());
    assert_eq!(text.matches("missing.yaml").count(), 1, "{text}");
}
