//! The committed CRD YAML in `crds/` must be exactly what the Rust types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    for (file, generated) in rocefabric_api::crdgen::manifests() {
        let path = dir.join(&file);
        match std::fs::read_to_string(&path) {
            Ok(committed) if committed == generated => {}
            Ok(_) => stale.push(format!("{file} differs from the types")),
            Err(e) => stale.push(format!("{file} cannot be read: {e}")),
        }
    }
    assert!(
        stale.is_empty(),
        "CRD YAML is out of date ({}).\nRegenerate it with: cargo run -p rocefabric-api --bin crdgen -- --write",
        stale.join(", ")
    );
}

#[test]
fn crd_files_are_named_plural_dot_group() {
    let names: Vec<String> = rocefabric_api::crdgen::manifests()
        .into_iter()
        .map(|(f, _)| f)
        .collect();
    assert_eq!(
        names,
        [
            "rocefabrics.rocefabric.io.yaml",
            "rocenodes.rocefabric.io.yaml"
        ]
    );
}

#[test]
fn kubectl_get_rf_shows_readiness_nodes_qos_and_regions() {
    use kube::CustomResourceExt;
    let crd = rocefabric_api::RoceFabric::crd();
    let version = &crd.spec.versions[0];
    let columns: Vec<(&str, i32)> = version
        .additional_printer_columns
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| (c.name.as_str(), c.priority.unwrap_or(0)))
        .collect();
    let default_view: Vec<&str> = columns
        .iter()
        .filter(|(_, p)| *p == 0)
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        default_view,
        [
            "Ready",
            "Configured",
            "Selected",
            "DSCP",
            "Prio",
            "Regions",
            "Age"
        ]
    );
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
}

#[test]
fn rocenode_is_cluster_scoped_with_a_status_subresource() {
    use kube::CustomResourceExt;
    let crd = rocefabric_api::RoceNode::crd();
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(crd.spec.names.plural, "rocenodes");
    assert!(
        crd.spec.versions[0]
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
}
