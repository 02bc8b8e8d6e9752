//! `dra` mode beside NVIDIA's device plugin: no device plugin of ours runs, yet every grant of
//! the GPU resource the kubelet's pod resources API lists holds its GPU (named by UUID or bus ID),
//! so the driver neither publishes nor prepares it; while the API cannot be read every GPU is
//! withheld, and the HCAs (no device plugin serves them) stay free.

use rocefabric_dra::devices::Withdrawn;
use rocefabric_node_model::fabric_view::FabricView;
use rocefabric_node_testing::pod_resources::{Grant, PodResourcesEmulator};

use super::*;

/// `dra` mode publishing GPUs, as the daemon sets it up: grants read from `socket`, unknown until
/// the first answer, no device plugin of ours.
fn dra_mode(setup: &mut Setup, socket: &Path) -> DraOptions {
    setup.ledger = Arc::new(Ledger::awaiting_grants());
    let mut options = setup.options();
    options.pod_resources_socket = Some(socket.to_path_buf());
    options.device_plugin = false;
    options.publish_gpus = true;
    options
}

/// The withdrawn devices of the slice, by name.
fn withdrawn(driver: &NodeDriver<Arc<Claims>>, inv: &Inventory) -> BTreeMap<String, Withdrawn> {
    driver
        .listing(inv, &FabricView::default())
        .withdrawn
        .into_iter()
        .map(|(d, why)| (d.name, why))
        .collect()
}

#[tokio::test]
async fn a_gpu_another_plugin_granted_is_withheld_and_its_claims_refused() {
    let mut setup = Setup::new();
    for (i, gpu) in setup.inventory.gpus.iter_mut().enumerate() {
        gpu.uuid = Some(format!("GPU-{i:04}"));
    }
    let socket = setup.dir.path().join("pod-resources/kubelet.sock");
    let options = dra_mode(&mut setup, &socket);
    let (gpu0, hca0) = setup.pair(0);
    let (gpu1, hca1) = setup.pair(1);
    let (gpu2, _) = setup.pair(2);
    let physical = |name: &str| {
        let inv = &setup.inventory;
        inv.gpus
            .iter()
            .find(|g| gpu_device_name(g) == name)
            .map(|g| (g.uuid.clone().unwrap(), g.pci_address.clone()))
            .unwrap()
    };
    let (uuid0, _) = physical(&gpu0);
    let (_, bus1) = physical(&gpu1);
    let (uuid2, _) = physical(&gpu2);
    // nvidia-smi's form of the bus ID: an 8-digit domain, upper case.
    let bus1 = format!("0000{}", bus1.to_uppercase());
    setup
        .claims
        .add("pair", "uid-1", &[("gpu", &gpu0), ("hca", &hca0)]);
    setup.claims.add("gpu1", "uid-2", &[("gpu", &gpu1)]);
    setup.claims.add("nic", "uid-3", &[("hca", &hca1)]);
    setup.claims.add("gpu2", "uid-4", &[("gpu", &gpu2)]);
    let driver = setup.driver(options.clone());

    // Before the kubelet answers: every GPU withheld, no HCA (no device plugin of ours serves
    // one in `dra` mode); a claim that needs a GPU is refused, one of HCAs only is not.
    let out = withdrawn(&driver, &setup.inventory);
    assert_eq!(out.len(), setup.inventory.gpus.len(), "{out:?}");
    assert!(
        out.iter()
            .all(|(name, why)| name.starts_with("gpu-") && *why == Withdrawn::GrantsUnknown),
        "{out:?}"
    );
    assert_eq!(options.metrics.grants_known.get(), 0);
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-1")]).await;
    let error = &answer["uid-1"].error;
    assert!(
        error.contains("may be held by a device plugin grant")
            && error.contains("pod resources API cannot be read"),
        "{error}"
    );
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("nic", "uid-3")]).await;
    assert_eq!(answer["uid-3"].error, "");

    // The kubelet answers: NVIDIA's plugin gave GPU 0 (by UUID) and GPU 1 (by bus ID) to
    // running pods. Both are withdrawn and refused, naming the grant; GPU 2 is free.
    let kubelet = PodResourcesEmulator::start(&socket).await.unwrap();
    kubelet.set(vec![
        Grant::new("ns/train", "nvidia.com/gpu", &[&uuid0]),
        Grant::new("ns/infer", "nvidia.com/gpu", &[&bus1]),
        Grant::new("ns/other", "example.com/gpu", &[&uuid2]),
    ]);
    driver.refresh_grants().await;
    assert_eq!(options.metrics.grants_known.get(), 1);
    let out = withdrawn(&driver, &setup.inventory);
    assert_eq!(
        out,
        BTreeMap::from([
            (gpu0.clone(), Withdrawn::HeldByDevicePlugin),
            (gpu1.clone(), Withdrawn::HeldByDevicePlugin),
        ])
    );
    for (name, uid) in [("pair", "uid-1"), ("gpu1", "uid-2")] {
        let answer = plugin::Preparer::prepare(&*driver, vec![claim(name, uid)]).await;
        let error = &answer[uid].error;
        assert!(
            error.contains("is held by a nvidia.com/gpu device plugin grant"),
            "{uid}: {error}"
        );
        assert!(!options.cdi_dir.join(cdi::spec_file_name(uid)).exists());
    }
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("gpu2", "uid-4")]).await;
    assert_eq!(
        answer["uid-4"].error, "",
        "a grant of another resource holds nothing"
    );
    let records = checkpoint::load(&options.checkpoint_path()).unwrap().claims;
    assert_eq!(
        records.keys().collect::<Vec<_>>(),
        ["uid-3", "uid-4"],
        "refused claims leave no record"
    );

    // The pods end: their GPUs are free again.
    kubelet.set(Vec::new());
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-1")]).await;
    assert_eq!(answer["uid-1"].error, "");
    assert!(
        withdrawn(&driver, &setup.inventory).is_empty(),
        "nothing held by a device plugin (claimed devices stay in the slice: allocated)"
    );

    // The kubelet goes away (a restart): every GPU is withheld again, the HCAs are not.
    kubelet.stop();
    driver.refresh_grants().await;
    let out = withdrawn(&driver, &setup.inventory);
    assert_eq!(out.len(), setup.inventory.gpus.len(), "{out:?}");
    assert!(out.values().all(|why| *why == Withdrawn::GrantsUnknown));
}

#[tokio::test]
async fn without_gpus_dra_mode_reads_no_grants_and_withholds_nothing() {
    let setup = Setup::new();
    let mut options = setup.options();
    options.publish_gpus = false;
    let driver = setup.driver(options.clone());
    driver.refresh_grants().await;
    let listing = driver.listing(&setup.inventory, &FabricView::default());
    assert!(listing.withdrawn.is_empty(), "{:?}", listing.withdrawn);
    assert!(listing.published.iter().all(|d| d.name.starts_with("hca-")));
    assert_eq!(listing.published.len(), setup.inventory.hcas.len());
}
