//! `rocefabric-device-plugin discover` driven as a user would: the built binary on fixture trees.

#![allow(clippy::unwrap_used)]

use std::process::{Command, Output};

use rocefabric_node_testing::fixtures::{self, FixtureNode, write_variant};
use serde_json::Value;

fn bin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rocefabric-device-plugin"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> Value {
    let out = bin(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn json_output_has_the_documented_fields() {
    let dir = fixtures::tempdir().unwrap();
    FixtureNode::dgx_h100().write_to(dir.path()).unwrap();
    let root = dir.path().to_str().unwrap();
    let v = json(&["discover", "--sysfs-root", root, "--output", "json"]);

    let hcas = v["hcas"].as_array().unwrap();
    assert_eq!(hcas.len(), 14);
    let h = &hcas[0];
    assert_eq!(h["name"], "mlx5_0");
    assert_eq!(h["pciAddress"], "0000:18:00.0");
    // A PCI HCA's device ID is its PCI address; its device path is its PCI function's.
    assert_eq!(h["id"], "0000:18:00.0");
    assert_eq!(h["virtual"], false);
    assert_eq!(h["pciPath"], h["devicePath"]);
    assert!(h["pciPath"].as_str().unwrap().ends_with("/0000:18:00.0"));
    assert_eq!(h["netdev"], "enp24s0np0");
    assert_eq!(h["numaNode"], 0);
    assert_eq!(h["state"], "ACTIVE");
    assert_eq!(h["roceV2GidIndex"], 3);
    assert_eq!(h["health"], "Healthy");
    assert_eq!(h["uverbs"], "uverbs2");
    assert_eq!(h["vendor"], "0x15b3");
    assert_eq!(h["deviceId"], "0x1021");

    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[0]["pciAddress"], "0000:1b:00.0");
    assert_eq!(gpus[0]["index"], 0);
    assert_eq!(gpus[0]["numaNode"], 0);
    assert_eq!(gpus[7]["pciAddress"], "0000:df:00.0");
    assert_eq!(gpus[7]["index"], 7);
    assert_eq!(gpus[7]["numaNode"], 1);

    let topo = v["topology"].as_object().unwrap();
    assert_eq!(topo.len(), 8);
    assert_eq!(topo["0000:1b:00.0"]["0000:18:00.0"], "PXB");
    assert_eq!(topo["0000:1b:00.0"]["0000:40:00.0"], "NODE");
    assert_eq!(topo["0000:1b:00.0"]["0000:9a:00.0"], "SYS");
    assert_eq!(topo["0000:df:00.0"]["0000:dc:00.0"], "PXB");
    assert_eq!(topo["0000:df:00.0"].as_object().unwrap().len(), 14);

    let pairs = v["gpuHcaPairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 8);
    assert_eq!(pairs[1]["gpuPciAddress"], "0000:43:00.0");
    assert_eq!(pairs[1]["rdmaDevice"], "mlx5_3");
    assert_eq!(pairs[1]["distance"], "PXB");
}

/// Each device names the resource `serve` lists it under with the config: by default `rdma/hca`
/// for every HCA and none for GPUs; with `gpuHca` on, the rails and their GPUs are the pairs'.
#[test]
fn each_device_names_the_resource_that_serves_it() {
    let v = json(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "-o",
        "json",
    ]);
    let resources = |v: &Value, list: &str| -> Vec<Value> {
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["resource"].clone())
            .collect()
    };
    assert!(resources(&v, "hcas").iter().all(|r| r == "rdma/hca"));
    assert!(resources(&v, "gpus").iter().all(Value::is_null));
    assert!(resources(&v, "gpuHcaPairs").iter().all(Value::is_null));

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "gpu:\n  enabled: true\ngpuHca:\n  enabled: true\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let v = json(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "--config",
        cfg,
        "-o",
        "json",
    ]);
    let by_name: Vec<(&str, &str)> = v["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["name"].as_str().unwrap(), h["resource"].as_str().unwrap()))
        .collect();
    let pairs = by_name.iter().filter(|(_, r)| *r == "rdma/gpu-hca").count();
    assert_eq!(pairs, 8, "the compute rails: {by_name:?}");
    assert!(by_name.contains(&("mlx5_0", "rdma/gpu-hca")));
    assert!(by_name.contains(&("mlx5_1", "rdma/hca")), "a storage port");
    assert!(by_name.contains(&("irdma0", "rdma/hca")));
    assert!(resources(&v, "gpus").iter().all(|r| r == "rdma/gpu-hca"));
    assert!(
        resources(&v, "gpuHcaPairs")
            .iter()
            .all(|r| r == "rdma/gpu-hca")
    );

    // The table shows it too.
    let out = bin(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "--config",
        cfg,
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let row = |prefix: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("{prefix} in {text}"))
            .split_whitespace()
            .last()
            .unwrap()
            .to_string()
    };
    assert!(text.contains("RESOURCE"), "{text}");
    assert_eq!(row("mlx5_0 "), "rdma/gpu-hca");
    assert_eq!(row("mlx5_1 "), "rdma/hca");
    assert_eq!(row("GPU0 "), "rdma/gpu-hca", "{text}");
}

#[test]
fn json_reports_unknown_numa_and_down_ports_as_such() {
    let dir = fixtures::tempdir().unwrap();
    FixtureNode::dgx_h100()
        .with_port_down("mlx5_3")
        .with_gpu_numa("0000:61:00.0", None)
        .write_to(dir.path())
        .unwrap();
    let v = json(&[
        "discover",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
        "-o",
        "json",
    ]);
    let mlx5_3 = v["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "mlx5_3")
        .unwrap();
    assert_eq!(mlx5_3["state"], "DOWN");
    assert_eq!(mlx5_3["health"], "Unhealthy");
    assert_eq!(v["gpus"][3]["numaNode"], Value::Null);
    assert_eq!(v["topology"]["0000:61:00.0"]["0000:18:00.0"], "SYS");
}

#[test]
fn table_output_shows_the_matrix() {
    let out = bin(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text
        .lines()
        .find(|l| l.trim_start().starts_with("mlx5_0  mlx5_1"))
        .unwrap();
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(cols.len(), 15, "14 HCAs and NUMA: {header}");
    assert_eq!(cols[14], "NUMA");
    let matrix = &text[text.find("Topology").unwrap()..];
    let gpu0: Vec<&str> = matrix
        .lines()
        .find(|l| l.starts_with("GPU0 "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(gpu0[0], "GPU0");
    assert_eq!(
        gpu0[1..],
        [
            "PXB", "NODE", "NODE", "NODE", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS", "SYS",
            "SYS", "SYS", "SYS", "0"
        ]
    );
    assert!(text.contains("mlx5_0   0000:18:00.0"), "{text}");
}

#[test]
fn config_selector_narrows_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "hca:\n  selector:\n    vendors: [\"8086\"]\n").unwrap();
    let v = json(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "--config",
        cfg.to_str().unwrap(),
        "--output",
        "json",
    ]);
    let names: Vec<&str> = v["hcas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["irdma0", "irdma1"]);
    assert!(v["gpuHcaPairs"].as_array().unwrap().is_empty());
}

#[test]
fn variants_are_available_as_fixtures() {
    let v = json(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100-ib-port").unwrap().arg(),
        "--output",
        "json",
    ]);
    assert_eq!(v["hcas"].as_array().unwrap().len(), 13);
    let v = json(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100-no-rdma").unwrap().arg(),
        "--output",
        "json",
    ]);
    assert!(v["hcas"].as_array().unwrap().is_empty());
    assert_eq!(v["gpus"].as_array().unwrap().len(), 8);
    let out = bin(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100-no-rdma").unwrap().arg(),
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("(none)"));
}

#[test]
fn errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(&cfg, "hca:\n  sharedReplicas: 0\n").unwrap();
    let out = bin(&[
        "discover",
        "--sysfs-root",
        write_variant("dgx-h100").unwrap().arg(),
        "--config",
        cfg.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hca.sharedReplicas = 0"), "{err}");

    let out = bin(&["discover", "--sysfs-root", "/nonexistent/sys"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/sys"));
}

#[test]
fn malformed_device_is_skipped_with_a_warning() {
    let dir = fixtures::tempdir().unwrap();
    FixtureNode::dgx_h100().write_to(dir.path()).unwrap();
    std::fs::write(
        dir.path().join("class/infiniband/mlx5_4/ports/1/state"),
        "bogus\n",
    )
    .unwrap();
    let out = bin(&[
        "discover",
        "--sysfs-root",
        dir.path().to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["hcas"].as_array().unwrap().len(), 13);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mlx5_4") && err.contains("bogus"), "{err}");
}

#[test]
fn a_soft_roce_device_is_listed_as_virtual_without_pci_fields() {
    let v = json(&[
        "discover",
        "--sysfs-root",
        write_variant("vm-soft-roce").unwrap().arg(),
        "--output",
        "json",
    ]);
    let h = &v["hcas"][0];
    assert_eq!(h["id"], "virtual-505400fffe123456");
    assert_eq!(h["name"], "rxe0");
    assert_eq!(h["virtual"], true);
    assert_eq!(h["netdev"], "eth0");
    assert_eq!(h["roceV2GidIndex"], 1);
    for field in ["pciAddress", "vendor", "deviceId", "numaNode", "pciPath"] {
        assert!(h[field].is_null(), "{field}: {}", h[field]);
    }
    assert_eq!(h["devicePath"], "/devices/virtual/infiniband/rxe0");
    let table = bin(&[
        "discover",
        "--sysfs-root",
        write_variant("vm-soft-roce").unwrap().arg(),
    ]);
    let text = String::from_utf8_lossy(&table.stdout);
    let row = text.lines().find(|l| l.starts_with("rxe0")).unwrap();
    assert!(
        row.contains("virtual-505400fffe123456") && row.contains("virtual"),
        "{row}"
    );
}
