//! A monitoring claim with `adminAccess` reaches a device without owning it: it neither blocks
//! nor is blocked by the workload's claim, and leaves no hold behind (nor after a restart).

use super::*;

#[tokio::test]
async fn admin_access_results_take_no_place_in_the_ledger() {
    let setup = Setup::new();
    let options = setup.options();
    let (gpu, hca) = setup.pair(0);
    setup
        .claims
        .add("work", "uid-w", &[("gpu", &gpu), ("hca", &hca)]);
    setup.claims.add_admin("watch", "uid-m", &[("hca", &hca)]);
    let driver = setup.driver(options.clone());

    // The monitor first: it must not block the workload.
    let m = plugin::Preparer::prepare(&*driver, vec![claim("watch", "uid-m")]).await;
    assert_eq!(m["uid-m"].error, "");
    assert!(
        setup.ledger.claimed().is_empty(),
        "admin access holds nothing"
    );
    let w = plugin::Preparer::prepare(&*driver, vec![claim("work", "uid-w")]).await;
    assert_eq!(w["uid-w"].error, "");
    let held = setup.ledger.claimed();
    assert_eq!(held.len(), 2, "{held:?}");

    // ... nor be blocked by it, once more after a restart from the checkpoint.
    let driver = setup.driver(options.clone());
    let m = plugin::Preparer::prepare(&*driver, vec![claim("watch", "uid-m")]).await;
    assert_eq!(m["uid-m"].error, "");
    let on_disk = checkpoint::load(&options.checkpoint_path()).unwrap();
    assert!(
        on_disk.claims["uid-m"]
            .devices
            .iter()
            .all(|d| d.admin_access)
    );
    let restored = Arc::new(Ledger::default());
    rocefabric_dra::driver::restore_ledger(&options.checkpoint_path(), &restored).unwrap();
    assert_eq!(
        restored.claimed(),
        held,
        "only the workload's devices come back held"
    );

    // The monitor going away frees nothing of the workload's.
    let u = plugin::Preparer::unprepare(&*driver, vec![claim("watch", "uid-m")]).await;
    assert_eq!(u["uid-m"].error, "");
    assert_eq!(setup.ledger.claimed(), held);
    // A device plugin grant is no obstacle to a monitor either.
    let (_, other_hca) = setup.pair(1);
    let granted = setup
        .inventory
        .hcas
        .iter()
        .find(|h| hca_device_name(h) == other_hca)
        .unwrap()
        .id
        .clone();
    setup
        .ledger
        .grant(
            "rdma/hca",
            &BTreeSet::from([granted]),
            std::time::Instant::now(),
        )
        .unwrap();
    setup
        .claims
        .add_admin("watch2", "uid-m2", &[("hca", &other_hca)]);
    let m = plugin::Preparer::prepare(&*driver, vec![claim("watch2", "uid-m2")]).await;
    assert_eq!(m["uid-m2"].error, "");
}
