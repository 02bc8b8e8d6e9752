//! DRA mode's kubelet side over real unix sockets: plugin registration, NodePrepareResources and
//! NodeUnprepareResources (v1 and v1beta1), CDI specs on disk, the checkpoint across a restart in
//! the middle of a prepare, and the ledger shared with the device plugin. Claims come from a map
//! instead of the API server; the cluster suite runs the same code against a real kubelet.
#![allow(clippy::unwrap_used)] // tests fail loudly on the unexpected

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimStatus,
};
use rocefabric_dra::cdi;
use rocefabric_dra::checkpoint::{self, ClaimState};
use rocefabric_dra::devices::{gpu_device_name, hca_device_name};
use rocefabric_dra::driver::{ClaimSource, DraOptions, NodeDriver, NodeView};
use rocefabric_dra::ledger::Ledger;
use rocefabric_kubelet_api::pb_plugin_registration::InfoRequest;
use rocefabric_kubelet_api::pb_plugin_registration::registration_client::RegistrationClient;
use rocefabric_kubelet_api::uds_uri;
use rocefabric_kubelet_api::{dra as plugin, pb_dra_v1 as pb_v1, pb_dra_v1beta1 as pb_v1beta1};
use rocefabric_node_model::config::Config;
use rocefabric_node_model::inventory;
use rocefabric_node_model::model::Inventory;
use rocefabric_node_model::topology;
use rocefabric_node_testing::fixtures::{self, FixtureNode};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

const NODE: &str = "node-a";

mod admin_access;
mod consistency;
mod dra_gpus;
mod grants_unknown;
mod per_request;

/// Claims by `namespace/name`, counting reads; reads of the names in `hung` never answer (an API
/// server that does not respond).
#[derive(Default)]
struct Claims {
    claims: Mutex<BTreeMap<String, ResourceClaim>>,
    reads: AtomicUsize,
    hung: Mutex<BTreeSet<String>>,
}

impl ClaimSource for Claims {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if self.hung.lock().unwrap().contains(name) {
            std::future::pending::<()>().await;
        }
        self.claims
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned()
            .ok_or_else(|| format!("ResourceClaim {namespace}/{name} not found"))
    }
}

impl Claims {
    /// Add claim `ns/name` with uid `uid` allocated `(request, device)` of our pool.
    fn add(&self, name: &str, uid: &str, devices: &[(&str, &str)]) {
        self.add_with(name, uid, devices, false);
    }

    /// [`Claims::add`] with every result allocated with `adminAccess`.
    fn add_admin(&self, name: &str, uid: &str, devices: &[(&str, &str)]) {
        self.add_with(name, uid, devices, true);
    }

    fn add_with(&self, name: &str, uid: &str, devices: &[(&str, &str)], admin: bool) {
        let mut claim = ResourceClaim::default();
        claim.metadata.name = Some(name.into());
        claim.metadata.namespace = Some("ns".into());
        claim.metadata.uid = Some(uid.into());
        let results = devices
            .iter()
            .map(|(request, device)| DeviceRequestAllocationResult {
                request: request.to_string(),
                driver: "rocefabric.io".into(),
                pool: NODE.into(),
                device: device.to_string(),
                admin_access: admin.then_some(true),
                ..Default::default()
            })
            .collect();
        claim.status = Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.claims
            .lock()
            .unwrap()
            .insert(format!("ns/{name}"), claim);
    }
}

/// A node's directories and its DRA driver (not started yet).
struct Setup {
    dir: tempfile::TempDir,
    inventory: Inventory,
    claims: Arc<Claims>,
    ledger: Arc<Ledger>,
}

impl Setup {
    fn new() -> Self {
        let dir = fixtures::tempdir().unwrap();
        let sysfs = dir.path().join("sys");
        FixtureNode::dgx_h100().write_to(&sysfs).unwrap();
        let inventory = inventory::discover(&sysfs, &Default::default()).unwrap();
        Self {
            dir,
            inventory,
            claims: Arc::default(),
            ledger: Arc::default(),
        }
    }

    fn options(&self) -> DraOptions {
        DraOptions {
            plugin_dir: self.dir.path().join("plugins/rocefabric.io"),
            registry_dir: self.dir.path().join("plugins_registry"),
            cdi_dir: self.dir.path().join("cdi"),
            pod_resources_socket: None,
            device_plugin: false,
            node_name: NODE.into(),
            host_dev_root: PathBuf::from("/dev"),
            publish_gpus: true,
            pause_after_checkpoint: None,
            metrics: Arc::default(),
        }
    }

    /// A driver over the current directories (as after a daemon restart).
    fn driver(&self, options: DraOptions) -> Arc<NodeDriver<Arc<Claims>>> {
        let view = Arc::new(NodeView {
            inventory: self.inventory.clone(),
            traffic_class: Some(106),
        });
        let (_tx, rx) = watch::channel(view);
        Arc::new(
            NodeDriver::new(
                Arc::clone(&self.claims),
                options,
                Arc::new(Config::default()),
                Arc::clone(&self.ledger),
                rx,
            )
            .unwrap(),
        )
    }

    fn cdi_dir(&self) -> PathBuf {
        self.options().cdi_dir
    }

    /// GPU i and its rail HCA as pool device names.
    fn pair(&self, i: usize) -> (String, String) {
        let (gpu, hca, _) = topology::gpu_hca_pairs(&self.inventory)[i];
        (gpu_device_name(gpu), hca_device_name(hca))
    }
}

async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(uds_uri(socket).unwrap())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn claim(name: &str, uid: &str) -> pb_v1::Claim {
    pb_v1::Claim {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

async fn prepare(
    client: &mut pb_v1::dra_plugin_client::DraPluginClient<Channel>,
    claims: Vec<pb_v1::Claim>,
) -> BTreeMap<String, pb_v1::NodePrepareResourceResponse> {
    client
        .node_prepare_resources(pb_v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
}

async fn unprepare(
    client: &mut pb_v1::dra_plugin_client::DraPluginClient<Channel>,
    claims: Vec<pb_v1::Claim>,
) -> BTreeMap<String, pb_v1::NodeUnprepareResourceResponse> {
    client
        .node_unprepare_resources(pb_v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
}

fn spec_json(dir: &Path, uid: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(cdi::spec_file_name(uid))).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn registration_names_the_dra_socket_and_both_versions() {
    let setup = Setup::new();
    let options = setup.options();
    let (registered, mut verdict) = watch::channel(None);
    let _server = plugin::serve_registration(
        &options.registration_socket(),
        plugin::RegistrationService::new(
            rocefabric_dra::DRIVER_NAME,
            &options.dra_socket(),
            registered,
        ),
    )
    .unwrap();
    let mut client = RegistrationClient::new(channel(&options.registration_socket()).await);
    let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "rocefabric.io");
    assert_eq!(info.endpoint, options.dra_socket().to_string_lossy());
    assert_eq!(
        info.supported_versions,
        vec!["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert!(
        options
            .registration_socket()
            .ends_with("plugins_registry/rocefabric.io-reg.sock")
    );

    client
        .notify_registration_status(
            rocefabric_kubelet_api::pb_plugin_registration::RegistrationStatus {
                plugin_registered: false,
                error: "version mismatch".into(),
            },
        )
        .await
        .unwrap();
    verdict.changed().await.unwrap();
    assert_eq!(*verdict.borrow(), Some(Err("version mismatch".to_string())));
}

#[tokio::test]
async fn prepare_answers_cdi_ids_writes_the_spec_and_is_idempotent() {
    let setup = Setup::new();
    let options = setup.options();
    let (gpu, hca) = setup.pair(0);
    setup
        .claims
        .add("pair", "uid-1", &[("gpu", &gpu), ("hca", &hca)]);
    let driver = setup.driver(options.clone());
    let _server = plugin::serve_dra(&options.dra_socket(), driver).unwrap();
    let mut client =
        pb_v1::dra_plugin_client::DraPluginClient::new(channel(&options.dra_socket()).await);

    let answer = prepare(&mut client, vec![claim("pair", "uid-1")]).await;
    let response = &answer["uid-1"];
    assert_eq!(response.error, "");
    // One entry per device with its request's CDI device, then the whole-claim entry.
    let entries: Vec<(&str, &[String], &[String])> = response
        .devices
        .iter()
        .map(|d| {
            assert_eq!(d.pool_name, NODE);
            (
                d.device_name.as_str(),
                d.request_names.as_slice(),
                d.cdi_device_ids.as_slice(),
            )
        })
        .collect();
    let id = |name: &str| vec![format!("rocefabric.io/claim={name}")];
    let whole = [rocefabric_dra::prepare::WHOLE_CLAIM_REQUEST.to_string()];
    assert_eq!(
        entries,
        [
            (gpu.as_str(), &["gpu".to_string()][..], &id("uid-1-gpu")[..]),
            (hca.as_str(), &["hca".to_string()][..], &id("uid-1-hca")[..]),
            (hca.as_str(), &whole[..], &id("uid-1")[..]),
        ]
    );

    // The spec on disk: a device per request, and the whole claim's environment.
    let spec = spec_json(&options.cdi_dir, "uid-1");
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "rocefabric.io/claim");
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["uid-1-gpu", "uid-1-hca", "uid-1"]);
    let env = spec["devices"][2]["containerEdits"]["env"].to_string();
    assert!(
        env.contains("NCCL_IB_TC=106") && env.contains("NVIDIA_VISIBLE_DEVICES="),
        "{env}"
    );
    assert!(spec.get("containerEdits").is_none(), "no spec-wide edits");

    // Again (the kubelet retries after a lost answer): the same answer, from the checkpoint.
    let reads = setup.claims.reads.load(Ordering::SeqCst);
    let again = prepare(&mut client, vec![claim("pair", "uid-1")]).await;
    assert_eq!(again, answer);
    assert_eq!(
        setup.claims.reads.load(Ordering::SeqCst),
        reads,
        "no second API read"
    );

    // v1beta1 speaks to the same driver.
    setup
        .claims
        .add("solo", "uid-2", &[("hca", &setup.pair(1).1)]);
    let mut beta =
        pb_v1beta1::dra_plugin_client::DraPluginClient::new(channel(&options.dra_socket()).await);
    let answer = beta
        .node_prepare_resources(pb_v1beta1::NodePrepareResourcesRequest {
            claims: vec![pb_v1beta1::Claim {
                namespace: "ns".into(),
                name: "solo".into(),
                uid: "uid-2".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["uid-2"].error, "");
    assert_eq!(answer.claims["uid-2"].devices.len(), 1);

    // Unprepare removes the spec and the record; an unknown claim unprepares fine.
    let answer = unprepare(
        &mut client,
        vec![claim("pair", "uid-1"), claim("x", "uid-9")],
    )
    .await;
    assert!(answer.values().all(|r| r.error.is_empty()), "{answer:?}");
    assert!(!options.cdi_dir.join(cdi::spec_file_name("uid-1")).exists());
    let cp = checkpoint::load(&options.checkpoint_path()).unwrap();
    assert_eq!(cp.claims.keys().collect::<Vec<_>>(), vec!["uid-2"]);

    // What /metrics says.
    let mut registry = prometheus_client::registry::Registry::default();
    options.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        r#"rocefabric_dra_prepares_total{result="success"} 3"#,
        r#"rocefabric_dra_unprepares_total{result="success"} 2"#,
        "rocefabric_dra_prepared_claims 1",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
}

#[tokio::test]
async fn errors_name_the_claim_and_what_is_wrong() {
    let setup = Setup::new();
    let options = setup.options();
    setup
        .claims
        .add("ghost", "uid-g", &[("hca", "hca-mlx5-99")]);
    setup
        .claims
        .add("replaced", "uid-new", &[("hca", &setup.pair(0).1)]);
    let driver = setup.driver(options.clone());
    let _server = plugin::serve_dra(&options.dra_socket(), driver).unwrap();
    let mut client =
        pb_v1::dra_plugin_client::DraPluginClient::new(channel(&options.dra_socket()).await);
    let answer = prepare(
        &mut client,
        vec![
            claim("missing", "uid-m"),
            claim("ghost", "uid-g"),
            claim("replaced", "uid-old"),
        ],
    )
    .await;
    assert_eq!(answer["uid-m"].error, "ResourceClaim ns/missing not found");
    assert_eq!(
        answer["uid-g"].error,
        "claim ns/ghost: device hca-mlx5-99 (request hca) is not on this node"
    );
    assert!(
        answer["uid-old"].error.contains("uid uid-new"),
        "{}",
        answer["uid-old"].error
    );
    assert!(answer.values().all(|r| r.devices.is_empty()));
    assert!(cdi::spec_claims(&options.cdi_dir).unwrap().is_empty());
}

#[tokio::test]
async fn a_restart_in_the_middle_of_a_prepare_neither_leaks_nor_double_prepares() {
    let setup = Setup::new();
    let (_, hca) = setup.pair(0);
    setup.claims.add("first", "uid-1", &[("hca", &hca)]);
    setup.claims.add("second", "uid-2", &[("hca", &hca)]);
    // A spec some earlier run left without a record.
    std::fs::create_dir_all(setup.cdi_dir()).unwrap();
    std::fs::write(setup.cdi_dir().join(cdi::spec_file_name("uid-stale")), "{}").unwrap();

    // The daemon dies while pausing between the checkpoint and the CDI spec.
    let mut pausing = setup.options();
    pausing.pause_after_checkpoint = Some(Duration::from_secs(3600));
    let driver = setup.driver(pausing);
    let task = tokio::spawn({
        let driver = Arc::clone(&driver);
        async move { plugin::Preparer::prepare(&*driver, vec![claim("first", "uid-1")]).await }
    });
    let checkpoint_path = setup.options().checkpoint_path();
    let recorded = async {
        loop {
            if let Ok(cp) = checkpoint::load(&checkpoint_path)
                && cp.claims.get("uid-1").map(|r| r.state) == Some(ClaimState::Preparing)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), recorded)
        .await
        .expect("the preparing record is written first");
    task.abort();
    drop(driver);
    assert!(!setup.cdi_dir().join(cdi::spec_file_name("uid-1")).exists());

    // A new daemon: a fresh ledger filled from the checkpoint.
    let restarted = Setup {
        dir: setup.dir,
        inventory: setup.inventory.clone(),
        claims: Arc::clone(&setup.claims),
        ledger: Arc::default(),
    };
    let options = restarted.options();
    let driver = restarted.driver(options.clone());
    assert!(
        !options
            .cdi_dir
            .join(cdi::spec_file_name("uid-stale"))
            .exists(),
        "a spec without a record is removed at start"
    );
    assert_eq!(
        restarted.ledger.claimed().len(),
        1,
        "the half-prepared claim still holds its HCA"
    );
    let _server = plugin::serve_dra(&options.dra_socket(), driver).unwrap();
    let mut client =
        pb_v1::dra_plugin_client::DraPluginClient::new(channel(&options.dra_socket()).await);

    // Another claim on the same HCA (a stale allocation) is refused, naming the holder.
    let answer = prepare(&mut client, vec![claim("second", "uid-2")]).await;
    assert!(
        answer["uid-2"]
            .error
            .contains("held by DRA claim ns/first (uid-1)"),
        "{}",
        answer["uid-2"].error
    );
    // The kubelet's retry completes the first claim.
    let answer = prepare(&mut client, vec![claim("first", "uid-1")]).await;
    assert_eq!(answer["uid-1"].error, "");
    assert!(options.cdi_dir.join(cdi::spec_file_name("uid-1")).exists());
    let cp = checkpoint::load(&options.checkpoint_path()).unwrap();
    assert_eq!(cp.claims["uid-1"].state, ClaimState::Prepared);
    assert_eq!(cp.claims.len(), 1);
    // Unprepared, the HCA is free for the other claim.
    unprepare(&mut client, vec![claim("first", "uid-1")]).await;
    let answer = prepare(&mut client, vec![claim("second", "uid-2")]).await;
    assert_eq!(answer["uid-2"].error, "");
}

#[tokio::test]
async fn a_device_the_device_plugin_granted_is_not_prepared() {
    let setup = Setup::new();
    let options = setup.options();
    let (gpu, hca) = setup.pair(2);
    let (gpu_dev, hca_dev) = {
        let (g, h, _) = topology::gpu_hca_pairs(&setup.inventory)[2];
        (g.pci_address.clone(), h.id.clone())
    };
    setup
        .claims
        .add("pair", "uid-1", &[("gpu", &gpu), ("hca", &hca)]);
    setup
        .ledger
        .grant(
            "rdma/gpu-hca",
            &BTreeSet::from([gpu_dev.clone(), hca_dev]),
            std::time::Instant::now(),
        )
        .unwrap();
    let driver = setup.driver(options.clone());
    let answer = plugin::Preparer::prepare(&*driver, vec![claim("pair", "uid-1")]).await;
    assert!(
        answer["uid-1"]
            .error
            .contains("held by a rdma/gpu-hca device plugin grant"),
        "{}",
        answer["uid-1"].error
    );
    assert!(cdi::spec_claims(&options.cdi_dir).unwrap().is_empty());
    assert!(
        checkpoint::load(&options.checkpoint_path())
            .unwrap()
            .claims
            .is_empty()
    );
}
