//! `both` mode fails closed: while the kubelet's pod resources API cannot be read, every device
//! the device plugin serves is withheld from the slice and refused to a prepare; once it answers,
//! they are free again.

use rocefabric_node_testing::pod_resources::PodResourcesEmulator;

use super::*;

#[tokio::test]
async fn while_grants_are_unknown_what_the_device_plugin_serves_is_withheld_and_refused() {
    let mut setup = Setup::new();
    setup.ledger = Arc::new(Ledger::awaiting_grants());
    let mut options = setup.options();
    let socket = setup.dir.path().join("pod-resources/kubelet.sock");
    options.pod_resources_socket = Some(socket.clone());
    options.device_plugin = true;
    let (gpu, hca) = setup.pair(0);
    let (_, hca1) = setup.pair(1);
    setup
        .claims
        .add("pair", "uid-1", &[("gpu", &gpu), ("hca", &hca)]);
    setup.claims.add("gpu", "uid-2", &[("gpu", &gpu)]);
    setup.claims.add("nic", "uid-3", &[("hca", &hca1)]);
    let driver = setup.driver(options.clone());
    let rail = |name: &str| {
        setup
            .inventory
            .hcas
            .iter()
            .find(|h| hca_device_name(h) == name)
            .unwrap()
            .id
            .clone()
    };

    // No answer from the kubelet: the device plugin's HCAs are withheld and refused.
    let out = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-1")]).await;
    let error = &out["uid-1"].error;
    assert!(
        error.contains("may be held by a device plugin grant")
            && error.contains("pod resources API cannot be read"),
        "{error}"
    );
    assert!(setup.ledger.claimed().is_empty());
    assert!(!options.cdi_dir.join(cdi::spec_file_name("uid-1")).exists());
    assert_eq!(options.metrics.grants_known.get(), 0);
    let withheld = driver.withheld(&setup.inventory);
    assert!(withheld.contains(&rail(&hca)), "{withheld:?}");
    assert_eq!(
        withheld.len(),
        setup.inventory.hcas.len() + setup.inventory.gpus.len(),
        "our HCAs, and every GPU: NVIDIA's plugin may have granted one"
    );
    let out = plugin::Preparer::prepare(&*driver, vec![claim("gpu", "uid-2")]).await;
    assert!(
        out["uid-2"].error.contains("may be held"),
        "{:?}",
        out["uid-2"].error
    );

    // The kubelet answers (no grants): the HCA and the GPU are free.
    let kubelet = PodResourcesEmulator::start(&socket).await.unwrap();
    let out = plugin::Preparer::prepare(&*driver, vec![claim("nic", "uid-3")]).await;
    assert_eq!(out["uid-3"].error, "");
    let out = plugin::Preparer::prepare(&*driver, vec![claim("gpu", "uid-2")]).await;
    assert_eq!(out["uid-2"].error, "");
    assert_eq!(options.metrics.grants_known.get(), 1);
    assert!(driver.withheld(&setup.inventory).is_empty());

    // It goes away again (a kubelet restart): closed again.
    kubelet.stop();
    let u = plugin::Preparer::unprepare(&*driver, vec![claim("gpu", "uid-2")]).await;
    assert_eq!(u["uid-2"].error, "", "an unprepare needs no grants");
    let out = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-1")]).await;
    assert!(
        out["uid-1"].error.contains("may be held"),
        "{:?}",
        out["uid-1"].error
    );
    assert_eq!(options.metrics.grants_known.get(), 0);
}
