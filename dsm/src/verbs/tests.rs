use super::*;

#[test]
fn a_missing_libibverbs_is_named_with_what_to_install() {
    let Err(e) = Verbs::load("libibverbs-not-here.so.1") else {
        panic!("loaded a library that does not exist");
    };
    assert!(e.contains("cannot load libibverbs-not-here.so.1"), "{e}");
    assert!(e.contains("ibverbs-providers"), "{e}");
}

#[test]
fn the_installed_libibverbs_resolves_every_entry_point() {
    // Where rdma-core is installed (the build machine has it): every symbol is there.
    match Verbs::load(ibv::LIBRARY) {
        Ok(_) => {}
        Err(e) if e.starts_with("cannot load") => eprintln!("skipped: {e}"),
        Err(e) => panic!("{e}"),
    }
}
