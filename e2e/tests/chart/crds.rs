//! The CRDs: the chart ships the generated ones, byte for byte, and keeps them on uninstall.

use rocefabric_e2e::manifests::{object_ref, of_kind};
use rocefabric_e2e::workspace_root;
use serde_json::{Value, json};

use crate::helpers::{chart_dir, engine, render};

#[test]
fn chart_crds_are_byte_copies_of_the_generated_crds() {
    let root = workspace_root();
    let generated = rocefabric_api::crdgen::manifests();
    assert_eq!(generated.len(), 2, "two CRDs are generated");
    for (file, yaml) in generated {
        let in_crds = std::fs::read_to_string(root.join("crds").join(&file))
            .unwrap_or_else(|e| panic!("crds/{file}: {e}"));
        assert!(
            in_crds == yaml,
            "crds/{file} is stale: run `cargo run -p rocefabric-api --bin crdgen -- --write`"
        );
        let in_chart = std::fs::read_to_string(chart_dir().join("files/crds").join(&file))
            .unwrap_or_else(|e| panic!("charts/rocefabric/files/crds/{file}: {e}"));
        assert!(
            in_chart == yaml,
            "charts/rocefabric/files/crds/{file} differs from crds/{file}: \
             run `cargo run -p rocefabric-api --bin crdgen -- --write` and commit"
        );
        let template = chart_dir().join("templates/crds").join(&file);
        assert!(
            template.exists(),
            "no template renders {file}: {}",
            template.display()
        );
    }
}

#[test]
fn rendered_crds_are_the_generated_crds_kept_on_uninstall() {
    let Some(engine) = engine("rendered_crds_are_the_generated_crds_kept_on_uninstall") else {
        return;
    };
    let objects = render(&engine, Value::Null);
    let crds = of_kind(&objects, "CustomResourceDefinition");
    assert_eq!(crds.len(), 2);
    for (file, yaml) in rocefabric_api::crdgen::manifests() {
        let mut generated: Value = yaml_serde::from_str(&yaml).expect("generated CRD parses");
        let name = generated["metadata"]["name"]
            .as_str()
            .expect("CRD has a name")
            .to_string();
        let rendered = crds
            .iter()
            .find(|c| c["metadata"]["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{file}: no rendered CRD {name}"));
        assert_eq!(
            rendered["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name} survives helm uninstall"
        );
        assert_eq!(
            rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "Helm"
        );
        // Apart from the chart's metadata, the rendered CRD is exactly what crdgen generates.
        generated["metadata"]["annotations"] = rendered["metadata"]["annotations"].clone();
        generated["metadata"]["labels"] = rendered["metadata"]["labels"].clone();
        assert!(
            **rendered == generated,
            "{name}: rendered CRD differs from crds/{file}"
        );
    }

    let without_keep = render(&engine, json!({"crds": {"keep": false}}));
    for crd in of_kind(&without_keep, "CustomResourceDefinition") {
        assert!(
            crd["metadata"]["annotations"].is_null(),
            "crds.keep=false: {}",
            object_ref(crd)
        );
    }
    let without_crds = render(&engine, json!({"crds": {"install": false}}));
    assert!(
        of_kind(&without_crds, "CustomResourceDefinition").is_empty(),
        "crds.install=false"
    );
}
