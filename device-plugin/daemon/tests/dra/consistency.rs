//! What a prepare or an unprepare leaves behind when the disk or the API server fails it: memory
//! and checkpoint never disagree, and a hung API call stalls no other claim.

use super::*;

/// Put a directory where the checkpoint file goes, so the next save fails (as on a full or
/// read-only disk; a directory fails it for root too).
fn block_saves(path: &Path) {
    std::fs::remove_file(path).unwrap();
    std::fs::create_dir_all(path.join("blocker")).unwrap();
}

#[tokio::test]
async fn an_unprepare_whose_checkpoint_save_fails_keeps_the_claim_on_disk_and_in_memory() {
    let setup = Setup::new();
    let options = setup.options();
    let (gpu, hca) = setup.pair(0);
    setup
        .claims
        .add("pair", "uid-1", &[("gpu", &gpu), ("hca", &hca)]);
    let driver = setup.driver(options.clone());
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-1")]).await;
    assert_eq!(answer["uid-1"].error, "");
    let held = setup.ledger.claimed();
    assert_eq!(held.len(), 2, "{held:?}");

    let path = options.checkpoint_path();
    let before = std::fs::read(&path).unwrap();
    block_saves(&path);
    let out = plugin::Preparer::unprepare(&*driver, vec![claim("pair", "uid-1")]).await;
    let error = &out["uid-1"].error;
    assert!(
        error.contains("claim ns/pair stays prepared")
            && error.contains(&path.display().to_string()),
        "{error}"
    );
    assert_eq!(
        setup.ledger.claimed(),
        held,
        "the devices stay held, as the disk says"
    );

    // A restart now finds what memory had: the claim, holding the same devices.
    std::fs::remove_dir_all(&path).unwrap();
    std::fs::write(&path, &before).unwrap();
    let ledger = Arc::new(Ledger::default());
    rocefabric_dra::driver::restore_ledger(&path, &ledger).unwrap();
    assert_eq!(ledger.claimed(), held);

    // The kubelet's retry unprepares it for good, on disk and in memory.
    let out = plugin::Preparer::unprepare(&*driver, vec![claim("pair", "uid-1")]).await;
    assert_eq!(out["uid-1"].error, "");
    assert!(setup.ledger.claimed().is_empty());
    assert!(checkpoint::load(&path).unwrap().claims.is_empty());
    assert!(!options.cdi_dir.join(cdi::spec_file_name("uid-1")).exists());
}

#[tokio::test]
async fn a_prepare_whose_checkpoint_save_fails_holds_nothing() {
    let setup = Setup::new();
    let options = setup.options();
    let (gpu, hca) = setup.pair(1);
    setup
        .claims
        .add("pair", "uid-2", &[("gpu", &gpu), ("hca", &hca)]);
    let driver = setup.driver(options.clone());
    // A first prepare writes the file; a second claim then finds the disk blocked.
    let (gpu0, hca0) = setup.pair(0);
    setup
        .claims
        .add("first", "uid-0", &[("gpu", &gpu0), ("hca", &hca0)]);
    let ok = plugin::Preparer::prepare(&*driver, vec![claim("first", "uid-0")]).await;
    assert_eq!(ok["uid-0"].error, "");
    let held = setup.ledger.claimed();
    block_saves(&options.checkpoint_path());

    let out = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-2")]).await;
    assert!(
        out["uid-2"].error.contains("cannot write checkpoint"),
        "{:?}",
        out["uid-2"].error
    );
    assert_eq!(
        setup.ledger.claimed(),
        held,
        "uid-2's devices are free again"
    );
    assert!(!options.cdi_dir.join(cdi::spec_file_name("uid-2")).exists());
}

#[tokio::test]
async fn a_hung_claim_read_stalls_no_other_prepare_or_unprepare() {
    let setup = Setup::new();
    let options = setup.options();
    let (_, hca0) = setup.pair(0);
    let (_, hca1) = setup.pair(1);
    setup.claims.add("slow", "uid-s", &[("hca", &hca0)]);
    setup.claims.add("fast", "uid-f", &[("hca", &hca1)]);
    setup.claims.hung.lock().unwrap().insert("slow".into());
    let driver = setup.driver(options);

    let stuck = tokio::spawn({
        let driver = Arc::clone(&driver);
        async move { plugin::Preparer::prepare(&*driver, vec![claim("slow", "uid-s")]).await }
    });
    // Wait until the slow read is under way.
    while setup.claims.reads.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let others = async {
        let p = plugin::Preparer::prepare(&*driver, vec![claim("fast", "uid-f")]).await;
        assert_eq!(p["uid-f"].error, "");
        let u = plugin::Preparer::unprepare(&*driver, vec![claim("fast", "uid-f")]).await;
        assert_eq!(u["uid-f"].error, "");
        // A claim the driver never saw unprepares without any API call too.
        let u = plugin::Preparer::unprepare(&*driver, vec![claim("gone", "uid-g")]).await;
        assert_eq!(u["uid-g"].error, "");
    };
    tokio::time::timeout(Duration::from_secs(30), others)
        .await
        .expect("no prepare or unprepare waits on another claim's hung API read");
    assert!(!stuck.is_finished(), "the slow read is still hanging");
    stuck.abort();
    assert!(setup.ledger.claimed().is_empty());
}
