//! Each container gets its own devices' environment: the answers and the specs on disk, taken
//! through what the kubelet and a CDI runtime do with them (`cdi_runtime`), and a claim prepared
//! before CDI devices were per request still answered as it was.

use rocefabric_node_testing::cdi_runtime::{ClaimEntry, Injected, cdi_ids, inject, specs_in};

use super::*;

/// HCA `name`'s `NCCL_IB_HCA` entry (`mlx5_0:1`).
fn port(inv: &Inventory, name: &str) -> String {
    let h = inv
        .hcas
        .iter()
        .find(|h| hca_device_name(h) == name)
        .unwrap();
    format!("{}:{}", h.name, h.port)
}

fn set(items: &[String]) -> BTreeSet<String> {
    items.iter().cloned().collect()
}

/// What a container whose `resources.claims` are `entries` gets, from the specs in `cdi_dir`.
fn container(cdi_dir: &Path, entries: &[ClaimEntry<'_>]) -> Injected {
    inject(&specs_in(cdi_dir).unwrap(), &cdi_ids(entries)).unwrap()
}

#[tokio::test]
async fn a_container_gets_the_environment_of_the_requests_it_is_given() {
    let setup = Setup::new();
    let options = setup.options();
    let (gpu0, hca0) = setup.pair(0);
    let (gpu1, hca1) = setup.pair(1);
    let (gpu2, hca2) = setup.pair(2);
    setup.claims.add(
        "pairs",
        "uid-1",
        &[
            ("gpu-0", &gpu0),
            ("hca-0", &hca0),
            ("gpu-1", &gpu1),
            ("hca-1", &hca1),
        ],
    );
    setup
        .claims
        .add("third", "uid-2", &[("gpu", &gpu2), ("hca", &hca2)]);
    let driver = setup.driver(options.clone());
    let _server = plugin::serve_dra(&options.dra_socket(), driver).unwrap();
    let mut client =
        pb_v1::dra_plugin_client::DraPluginClient::new(channel(&options.dra_socket()).await);
    let answer = prepare(
        &mut client,
        vec![claim("pairs", "uid-1"), claim("third", "uid-2")],
    )
    .await;
    assert!(answer.values().all(|r| r.error.is_empty()), "{answer:?}");
    let (pairs, third) = (&answer["uid-1"].devices, &answer["uid-2"].devices);
    let entry = |devices, request| ClaimEntry { devices, request };
    let inv = &setup.inventory;

    // The whole claim: both HCAs, both GPUs.
    let whole = container(&options.cdi_dir, &[entry(pairs, None)]);
    assert_eq!(
        whole.list("NCCL_IB_HCA"),
        set(&[port(inv, &hca0), port(inv, &hca1)])
    );
    assert_eq!(whole.list("NVIDIA_VISIBLE_DEVICES").len(), 2);
    assert_eq!(whole.list("PCIDEVICE_ROCEFABRIC_IO").len(), 4);

    // One request: only its HCA, and no GPU.
    let one = container(&options.cdi_dir, &[entry(pairs, Some("hca-0"))]);
    assert_eq!(one.list("NCCL_IB_HCA"), set(&[port(inv, &hca0)]));
    assert!(!one.env.contains_key("NVIDIA_VISIBLE_DEVICES"), "{one:?}");
    assert_eq!(
        one.device_nodes
            .keys()
            .filter(|p| p.contains("uverbs"))
            .count(),
        1,
        "{one:?}"
    );

    // Two claims: every device node of both, the later claim's variables (the limit the
    // README states).
    let two = container(&options.cdi_dir, &[entry(pairs, None), entry(third, None)]);
    assert_eq!(
        two.device_nodes
            .keys()
            .filter(|p| p.contains("uverbs"))
            .count(),
        3
    );
    assert_eq!(two.list("NCCL_IB_HCA"), set(&[port(inv, &hca2)]));
}

/// A record and its spec as the driver wrote them before CDI devices were per request.
const OLD_RECORD: &str = r#"{
  "version": 1,
  "claims": {
    "uid-old": {
      "namespace": "ns",
      "name": "old",
      "state": "prepared",
      "devices": [
        {
          "requestNames": ["hca"],
          "pool": "node-a",
          "device": "HCA",
          "physical": "PHYSICAL",
          "cdiDeviceIds": ["rocefabric.io/claim=uid-old-HCA"]
        }
      ]
    }
  }
}
"#;

#[tokio::test]
async fn a_claim_prepared_before_per_request_devices_answers_as_it_did() {
    let setup = Setup::new();
    let options = setup.options();
    let (_, hca) = setup.pair(0);
    let physical = setup
        .inventory
        .hcas
        .iter()
        .find(|h| hca_device_name(h) == hca)
        .unwrap()
        .id
        .clone();
    std::fs::create_dir_all(&options.plugin_dir).unwrap();
    std::fs::create_dir_all(&options.cdi_dir).unwrap();
    let record = OLD_RECORD
        .replace("PHYSICAL", &physical)
        .replace("HCA", &hca);
    std::fs::write(options.checkpoint_path(), record).unwrap();
    let old_spec = format!(
        r#"{{"cdiVersion": "0.6.0", "kind": "rocefabric.io/claim",
            "containerEdits": {{"env": ["NCCL_IB_HCA=={}"]}},
            "devices": [{{"name": "uid-old-{hca}", "containerEdits": {{"deviceNodes": [{{"path": "/dev/infiniband/uverbs0"}}]}}}}]}}"#,
        port(&setup.inventory, &hca)
    );
    let spec_path = options.cdi_dir.join(cdi::spec_file_name("uid-old"));
    std::fs::write(&spec_path, &old_spec).unwrap();
    setup.claims.add("old", "uid-old", &[("hca", &hca)]);
    setup.claims.add("new", "uid-new", &[("hca", &hca)]);

    let driver = setup.driver(options.clone());
    assert_eq!(setup.ledger.claimed(), BTreeSet::from([physical]));
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("old", "uid-old")]).await;
    let response = &answer["uid-old"];
    assert_eq!(response.error, "");
    assert_eq!(
        response.devices,
        [pb_v1::Device {
            request_names: vec!["hca".into()],
            pool_name: NODE.into(),
            device_name: hca.clone(),
            cdi_device_ids: vec![format!("rocefabric.io/claim=uid-old-{hca}")],
        }]
    );
    assert_eq!(
        setup.claims.reads.load(Ordering::SeqCst),
        0,
        "from the checkpoint"
    );
    assert_eq!(
        std::fs::read_to_string(&spec_path).unwrap(),
        old_spec,
        "the old spec stays as written: a container restarted in place needs its ids"
    );
    let got = container(
        &options.cdi_dir,
        &[ClaimEntry {
            devices: &response.devices,
            request: None,
        }],
    );
    assert_eq!(got.list("NCCL_IB_HCA").len(), 1);

    // Its HCA stays held until it is unprepared; then a new claim gets it, per request.
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("new", "uid-new")]).await;
    assert!(answer["uid-new"].error.contains("held by DRA claim ns/old"));
    plugin::Preparer::unprepare(&*driver, vec![claim("old", "uid-old")]).await;
    assert!(!spec_path.exists());
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("new", "uid-new")]).await;
    assert_eq!(answer["uid-new"].error, "");
    assert_eq!(
        answer["uid-new"].devices[0].cdi_device_ids,
        ["rocefabric.io/claim=uid-new-hca"]
    );
}
