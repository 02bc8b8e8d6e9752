//! Defaults fill in, and every out-of-range value and every CEL rule is rejected with a message
//! naming the field, as the API server would reject it.

use kube::CustomResourceExt;
use rocefabric_api::validate::{self, FieldError};
use rocefabric_api::{LossySoftRoce, QosSpec, RoceFabric, RoceFabricSpec, Trust};
use serde_json::{Value, json};

fn fabric(spec: Value) -> Value {
    json!({
        "apiVersion": "rocefabric.io/v1alpha1",
        "kind": "RoceFabric",
        "metadata": { "name": "f" },
        "spec": spec,
    })
}

fn errors(spec: Value) -> Vec<FieldError> {
    match validate::fabric_value(&fabric(spec)) {
        Ok(()) => Vec::new(),
        Err(e) => {
            assert!(e.to_string().contains("RoceFabric \"f\""), "{e}");
            e.errors
        }
    }
}

/// Assert that `spec` is rejected on `field` with a message containing `needle`.
#[track_caller]
fn assert_rejected(spec: Value, field: &str, needle: &str) {
    let errs = errors(spec.clone());
    assert!(
        errs.iter()
            .any(|e| e.field == field && e.message.contains(needle)),
        "spec {spec} should be rejected on {field} with {needle:?}, got {errs:?}"
    );
}

#[test]
fn empty_spec_gets_the_standard_lossless_defaults() {
    let f: RoceFabric = serde_json::from_value(fabric(json!({}))).expect("empty spec parses");
    let q = &f.spec.qos;
    assert_eq!(q.trust, Trust::Dscp);
    assert_eq!((q.roce_dscp, q.roce_priority), (26, 3));
    assert_eq!(q.pfc_priorities, vec![3]);
    assert!(q.ecn.enabled);
    assert_eq!(
        q.ecn_priorities(),
        vec![3],
        "ECN defaults to the RoCE priority"
    );
    assert_eq!((q.cnp.dscp, q.cnp.priority), (48, 6));
    assert_eq!(q.mtu, 4200);
    assert_eq!(q.traffic_class(), 106);
    assert_eq!(f.spec.rollout.budget(10), 1);
    assert!(f.spec.shared_memory.is_none());
    assert!(errors(json!({})).is_empty());
    f.validate_cel().expect("defaults pass the CEL rules");
}

/// `lossySoftRoce` keeps today's rule unless a fabric says otherwise: absent is `Refuse`, in
/// the typed default, in the CRD's default for the API server and in the rendered RoceNode QoS;
/// only its two values are valid, spelled as the API spells them.
#[test]
fn lossy_soft_roce_defaults_to_refuse_and_takes_only_its_two_values() {
    let f: RoceFabric = serde_json::from_value(fabric(json!({}))).expect("empty spec parses");
    assert_eq!(f.spec.qos.lossy_soft_roce, LossySoftRoce::Refuse);
    assert_eq!(QosSpec::default().lossy_soft_roce, LossySoftRoce::Refuse);
    let crd = serde_json::to_value(RoceFabric::crd()).expect("json");
    let qos = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["qos"];
    let field = &qos["properties"]["lossySoftRoce"];
    assert_eq!(field["default"], "Refuse");
    assert_eq!(field["enum"], json!(["Refuse", "Accept"]));
    assert_eq!(field["type"], "string");
    assert!(
        field["description"]
            .as_str()
            .is_some_and(|d| d.contains("SoftRoceAccepted") && d.contains("ConnectX")),
        "the CRD states the rule: {field}"
    );
    assert_eq!(qos["default"]["lossySoftRoce"], "Refuse");

    let accept: RoceFabric =
        serde_json::from_value(fabric(json!({"qos": {"lossySoftRoce": "Accept"}})))
            .expect("Accept parses");
    assert_eq!(accept.spec.qos.lossy_soft_roce, LossySoftRoce::Accept);
    assert_eq!(
        accept.spec.qos.rendered().lossy_soft_roce,
        LossySoftRoce::Accept,
        "rendering keeps it"
    );
    assert!(errors(json!({"qos": {"lossySoftRoce": "Accept"}})).is_empty());
    assert!(errors(json!({"qos": {"lossySoftRoce": "Refuse"}})).is_empty());
    accept.validate_cel().expect("Accept passes the CEL rules");
    for bad in [json!("accept"), json!("Allow"), json!(true), json!("")] {
        assert_rejected(
            json!({"qos": {"lossySoftRoce": bad}}),
            "spec.qos.lossySoftRoce",
            &bad.to_string(),
        );
    }
    let q = validate::qos_value(&json!({"lossySoftRoce": "Accept"})).expect("a bare QoS block");
    assert_eq!(q.lossy_soft_roce, LossySoftRoce::Accept);
    let e = validate::qos_value(&json!({"lossySoftRoce": "accept"})).expect_err("wrong case");
    assert_eq!(e.errors[0].field, "lossySoftRoce", "{e}");
}

#[test]
fn ecn_priorities_follow_a_changed_roce_priority() {
    let f: RoceFabric = serde_json::from_value(fabric(
        json!({"qos": {"rocePriority": 5, "pfcPriorities": [5]}}),
    ))
    .expect("parses");
    assert_eq!(f.spec.qos.ecn_priorities(), vec![5]);
    let rendered = f.spec.qos.rendered();
    assert_eq!(rendered.ecn.priorities, Some(vec![5]));
    let off: QosSpec = serde_json::from_value(json!({"ecn": {"enabled": false}})).expect("parses");
    assert!(off.ecn_priorities().is_empty());
}

#[test]
fn the_crd_schema_carries_the_defaults_for_the_api_server() {
    let crd = serde_json::to_value(RoceFabric::crd()).expect("json");
    let qos = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["qos"];
    assert_eq!(qos["properties"]["roceDscp"]["default"], 26);
    assert_eq!(qos["properties"]["rocePriority"]["default"], 3);
    assert_eq!(qos["properties"]["pfcPriorities"]["default"], json!([3]));
    assert_eq!(
        qos["properties"]["cnp"]["default"],
        json!({"dscp": 48, "priority": 6})
    );
    assert_eq!(qos["properties"]["mtu"]["default"], 4200);
    assert_eq!(qos["properties"]["trust"]["default"], "dscp");
    assert_eq!(
        qos["properties"]["pfcPriorities"]["x-kubernetes-list-type"],
        "set"
    );
    assert_eq!(crd["spec"]["scope"], "Cluster");
    assert_eq!(crd["spec"]["names"]["shortNames"], json!(["rf"]));
}

#[test]
fn out_of_range_values_are_rejected_naming_the_field() {
    let cases = [
        (json!({"qos": {"roceDscp": 64}}), "spec.qos.roceDscp", "64"),
        (json!({"qos": {"roceDscp": -1}}), "spec.qos.roceDscp", "-1"),
        (
            json!({"qos": {"rocePriority": 8, "pfcPriorities": [3]}}),
            "spec.qos.rocePriority",
            "8",
        ),
        (
            json!({"qos": {"pfcPriorities": [3, 9]}}),
            "spec.qos.pfcPriorities[1]",
            "9",
        ),
        (
            json!({"qos": {"cnp": {"dscp": 70}}}),
            "spec.qos.cnp.dscp",
            "70",
        ),
        (
            json!({"qos": {"cnp": {"priority": 8}}}),
            "spec.qos.cnp.priority",
            "8",
        ),
        (json!({"qos": {"mtu": 1279}}), "spec.qos.mtu", "1279"),
        (json!({"qos": {"mtu": 9217}}), "spec.qos.mtu", "9217"),
        (json!({"qos": {"trust": "pfc"}}), "spec.qos.trust", "pfc"),
        (
            json!({"sharedMemory": {"regionSize": "1Gi", "maxRegions": 0}}),
            "spec.sharedMemory.maxRegions",
            "0",
        ),
        (
            json!({"sharedMemory": {"regionSize": "1Gi", "maxRegions": 1048577}}),
            "spec.sharedMemory.maxRegions",
            "1048577",
        ),
        (
            json!({"sharedMemory": {"regionSize": "1Gi"}}),
            "spec.sharedMemory",
            "maxRegions",
        ),
        (
            json!({"sharedMemory": {"regionSize": "1Gi", "maxRegions": 8, "namespaces": ["Team_A"]}}),
            "spec.sharedMemory.namespaces[0]",
            "Team_A",
        ),
        (
            json!({"sharedMemory": {"regionSize": "1Gi", "maxRegions": 8, "reclaimUnboundAfterSeconds": 5}}),
            "spec.sharedMemory.reclaimUnboundAfterSeconds",
            "5",
        ),
    ];
    for (spec, field, value) in cases {
        assert_rejected(spec, field, value);
    }
}

#[test]
fn roce_priority_must_be_pfc_enabled() {
    let msg = "rocePriority must be one of pfcPriorities";
    assert_rejected(
        json!({"qos": {"rocePriority": 4}}),
        "spec.qos.rocePriority",
        msg,
    );
    assert_rejected(
        json!({"qos": {"pfcPriorities": [4]}}),
        "spec.qos.rocePriority",
        msg,
    );
    assert!(errors(json!({"qos": {"rocePriority": 4, "pfcPriorities": [3, 4]}})).is_empty());
    let typed = RoceFabric::new(
        "f",
        RoceFabricSpec {
            qos: QosSpec {
                roce_priority: 5,
                ..QosSpec::default()
            },
            ..RoceFabricSpec::default()
        },
    );
    let err = typed
        .validate_cel()
        .expect_err("kube's client-side CEL rejects it too");
    assert!(err.to_string().contains(msg), "{err}");
}

#[test]
fn cnp_dscp_must_differ_from_roce_dscp() {
    let msg = "cnp.dscp must differ from roceDscp";
    assert_rejected(
        json!({"qos": {"cnp": {"dscp": 26}}}),
        "spec.qos.cnp.dscp",
        msg,
    );
    assert_rejected(json!({"qos": {"roceDscp": 48}}), "spec.qos.cnp.dscp", msg);
    assert!(errors(json!({"qos": {"roceDscp": 48, "cnp": {"dscp": 46}}})).is_empty());
}

#[test]
fn ecn_priorities_must_be_within_0_to_7() {
    let msg = "every ECN priority must be within 0..7";
    assert_rejected(
        json!({"qos": {"ecn": {"priorities": [3, 8]}}}),
        "spec.qos.ecn.priorities",
        msg,
    );
    assert_rejected(
        json!({"qos": {"ecn": {"priorities": [-1]}}}),
        "spec.qos.ecn.priorities",
        msg,
    );
    assert!(errors(json!({"qos": {"ecn": {"priorities": [0, 7]}}})).is_empty());
}

#[test]
fn region_size_must_be_positive_whole_pages() {
    let msg = "regionSize must be a positive quantity of whole 4096-byte pages";
    // 16Ei is past 64 bits: the rule's message, not the CEL library's "quantity too large".
    for bad in ["1000", "0", "6Ki", "1.5", "16Ei", "100000Ei"] {
        assert_rejected(
            json!({"sharedMemory": {"regionSize": bad, "maxRegions": 8}}),
            "spec.sharedMemory.regionSize",
            msg,
        );
    }
    for good in ["4Ki", "1Gi", "2Mi", "8192"] {
        let errs = errors(json!({"sharedMemory": {"regionSize": good, "maxRegions": 8}}));
        assert!(errs.is_empty(), "{good}: {errs:?}");
    }
}

#[test]
fn max_unavailable_is_a_positive_integer_or_percentage() {
    let msg = "maxUnavailable must be an integer of at least 1 or a percentage";
    for bad in [json!(0), json!("0%"), json!("101%"), json!("ten")] {
        assert_rejected(
            json!({"rollout": {"maxUnavailable": bad}}),
            "spec.rollout.maxUnavailable",
            msg,
        );
    }
    for good in [json!(1), json!(25), json!("10%"), json!("100%")] {
        let errs = errors(json!({"rollout": {"maxUnavailable": good}}));
        assert!(errs.is_empty(), "{good}: {errs:?}");
    }
}

#[test]
fn fabric_names_must_fit_a_label_value() {
    let long = "f".repeat(64);
    let mut object = fabric(json!({}));
    object["metadata"]["name"] = json!(long);
    let err = validate::fabric_value(&object).expect_err("64 characters is too long");
    assert!(
        err.errors
            .iter()
            .any(|e| e.field == "metadata.name" && e.message.contains("at most 63")),
        "{err}"
    );
    object["metadata"]["name"] = json!("f".repeat(63));
    validate::fabric_value(&object).expect("63 characters fit");
}

/// The CRD's item patterns (the API server's rule, not a second one here) refuse what
/// `NicSelector::check` would: every value they accept, `check` accepts too.
#[test]
fn nic_selector_hex_typos_are_rejected() {
    for (field, bad) in [
        ("vendors", "mellanox"),
        ("deviceIds", "0x12345"),
        ("pciAddresses", "0000:18:00"),
        ("pciAddresses", "18:20.0"),
        ("pciAddresses", "0000:18:00.8"),
    ] {
        assert_rejected(
            json!({"nicSelector": {field: [bad]}}),
            &format!("spec.nicSelector.{field}[0]"),
            &format!("\"{bad}\""),
        );
        let sel: rocefabric_api::NicSelector =
            serde_json::from_value(json!({ field: [bad] })).unwrap();
        assert!(sel.check().is_err(), "{field} {bad}");
    }
    for (field, good) in [
        ("vendors", "15b3"),
        ("vendors", "0x8086"),
        ("deviceIds", "1021"),
        ("pciAddresses", "0000:18:00.0"),
        ("pciAddresses", "18:1f.7"),
        ("pciAddresses", "0001:aa:00.1"),
    ] {
        let object = fabric(json!({"nicSelector": {field: [good]}}));
        let schema_ok = validate::fabric_value(&object).is_ok();
        let sel: rocefabric_api::NicSelector =
            serde_json::from_value(json!({ field: [good] })).unwrap();
        assert_eq!(schema_ok, sel.check().is_ok(), "{field} {good}");
    }
}

#[test]
fn rollout_budget_rounds_percentages_up_and_is_at_least_one() {
    let r = |v: Value| -> rocefabric_api::RolloutSpec {
        serde_json::from_value(json!({ "maxUnavailable": v })).expect("parses")
    };
    assert_eq!(r(json!("10%")).budget(100), 10);
    assert_eq!(r(json!("10%")).budget(5), 1);
    assert_eq!(r(json!("25%")).budget(10), 3);
    assert_eq!(r(json!(4)).budget(2), 4);
    assert_eq!(r(json!("100%")).budget(0), 1);
}

#[test]
fn qos_block_alone_is_validated_with_the_same_rules() {
    let q = validate::qos_value(&json!({"roceDscp": 24, "pfcPriorities": [3]})).expect("valid");
    assert_eq!(q.roce_dscp, 24);
    let e = validate::qos_value(&json!({"mtu": 100})).expect_err("mtu too small");
    assert_eq!(e.errors[0].field, "mtu");
    assert!(e.to_string().contains("100"), "{e}");
}

#[test]
fn unknown_fields_are_errors_naming_the_path_as_strict_field_validation_does() {
    let errs = errors(json!({"nodeSelectr": {"matchLabels": {"a": "b"}}}));
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "spec.nodeSelectr");
    assert_eq!(
        errs[0].message,
        "unknown field \"nodeSelectr\" (did you mean \"nodeSelector\"?)"
    );
    assert_rejected(
        json!({"qos": {"ecn": {"enable": true}}}),
        "spec.qos.ecn.enable",
        "unknown field",
    );
    let mut f = fabric(json!({}));
    f["metadata"]["labelz"] = json!({});
    f["extra"] = json!(1);
    let e = validate::fabric_value(&f).expect_err("unknown metadata and root fields");
    let fields: Vec<&str> = e.errors.iter().map(|e| e.field.as_str()).collect();
    assert!(
        fields.contains(&"metadata.labelz") && fields.contains(&"extra"),
        "{fields:?}"
    );
    // Free-form maps are not "unknown fields".
    assert!(errors(json!({"nodeSelector": {"matchLabels": {"any/key": "v"}}})).is_empty());
}

#[test]
fn set_lists_refuse_duplicates() {
    assert_rejected(
        json!({"qos": {"pfcPriorities": [3, 3]}}),
        "spec.qos.pfcPriorities[1]",
        "Duplicate value: 3",
    );
    assert_rejected(
        json!({"qos": {"ecn": {"priorities": [3, 4, 3]}}}),
        "spec.qos.ecn.priorities[2]",
        "Duplicate value: 3",
    );
}

#[test]
fn api_version_kind_and_name_are_checked() {
    let mut f = fabric(json!({}));
    f["apiVersion"] = json!("rocefabric.io/v9");
    let e = validate::fabric_value(&f).expect_err("v9");
    assert_eq!(e.errors[0].field, "apiVersion");
    assert!(
        e.errors[0].message.contains("\"rocefabric.io/v1alpha1\""),
        "{e}"
    );
    for bad in ["", "Training", "a_b", "x\ny"] {
        let mut f = fabric(json!({}));
        f["metadata"]["name"] = json!(bad);
        let e = validate::fabric_value(&f).expect_err(bad);
        assert!(
            e.errors.iter().any(|e| e.field == "metadata.name"),
            "{bad:?}: {e}"
        );
        assert!(
            !e.to_string().contains('\n'),
            "control characters are escaped: {e}"
        );
    }
}

#[test]
fn bounds_print_as_integers() {
    let errs = errors(json!({"qos": {"roceDscp": 99}}));
    assert!(
        errs.iter()
            .any(|e| e.message == "99 is greater than the maximum of 63"),
        "{errs:?}"
    );
    let errs = errors(
        json!({"sharedMemory": {"regionSize": "1Gi", "maxRegions": 18_446_744_073_709_551_615u64}}),
    );
    assert!(
        errs.iter()
            .any(|e| e.field == "spec.sharedMemory.maxRegions"
                && e.message
                    .contains("18446744073709551615 is greater than the maximum of 1048576")),
        "{errs:?}"
    );
}

#[test]
fn the_qos_block_refuses_duplicate_priorities_and_unknown_fields() {
    let e = validate::qos_value(&json!({"pfcPriorities": [3, 3]})).expect_err("duplicate");
    assert!(
        e.to_string()
            .contains("pfcPriorities[1]: Duplicate value: 3"),
        "{e}"
    );
    let e = validate::qos_value(&json!({"roceDscpp": 26})).expect_err("typo");
    assert!(e.to_string().contains("roceDscpp: unknown field"), "{e}");
}
