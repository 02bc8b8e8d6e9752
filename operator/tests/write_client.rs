//! The writes' client against a TLS API server (the scale harness's, which chooses HTTP/2 or
//! HTTP/1.1 by ALPN as kube-apiserver does): it speaks HTTP/2 where kube's own client speaks
//! HTTP/1.1, its writes land, and it refuses a server whose certificate it was not told to
//! trust, and a `tls-server-name` that is no name. The RoceNode applies skip kube's request
//! queue (the direct stack): they land, and an error answer is the server's `Status`.

use std::path::Path;

use http::Version;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rocefabric_operator::apply::{Executor, Outcome};
use rocefabric_operator::planner::Write;
use rocefabric_operator::write_client::{WriteClientError, build, negotiated_version};
use rocefabric_operator_testing::scale::apiserver::{ApiServer, Options, Resource};
use rocefabric_operator_testing::scale::cluster::{GeneratedCluster, Sizes};

const SIZES: Sizes = Sizes {
    nodes: 2,
    pods: 2,
    fabric_pods: 1,
    namespaces: 1,
};

async fn server() -> ApiServer {
    ApiServer::start(GeneratedCluster::new(SIZES), Options::default())
        .await
        .expect("the API server starts")
}

async fn config_of(kubeconfig: Kubeconfig) -> Config {
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a client configuration")
}

async fn config(dir: &Path, server: &ApiServer) -> Config {
    let path = server.write_kubeconfig(dir).expect("a kubeconfig");
    config_of(Kubeconfig::read_from(path).expect("a readable kubeconfig")).await
}

#[tokio::test]
async fn writes_go_over_http2_where_kubes_client_speaks_http1() {
    let dir = tempfile::tempdir().unwrap();
    let server = server().await;
    let config = config(dir.path(), &server).await;
    let writer = build(&config).expect("the write client");
    assert_eq!(
        negotiated_version(&writer.client).await.unwrap(),
        Version::HTTP_2
    );
    let reader = Client::try_from(config).unwrap();
    assert_eq!(negotiated_version(&reader).await.unwrap(), Version::HTTP_11);
}

fn spec(generation: i64) -> rocefabric_api::RoceNodeSpec {
    rocefabric_api::RoceNodeSpec {
        fabric: "f".into(),
        fabric_generation: generation,
        qos: Default::default(),
        nic_selector: Default::default(),
        pending: false,
    }
}

#[tokio::test]
async fn an_apply_through_kubes_client_lands() {
    let dir = tempfile::tempdir().unwrap();
    let server = server().await;
    let writer = build(&config(dir.path(), &server).await).unwrap();
    let body =
        rocefabric_operator::planner::writes::roce_node_object("node-x", "f", "uid-f", &spec(7));
    let api: kube::Api<rocefabric_api::RoceNode> = kube::Api::all(writer.client);
    let params = kube::api::PatchParams::apply("rocefabric-operator").force();
    api.patch("node-x", &params, &kube::api::Patch::Apply(&body))
        .await
        .expect("the apply is accepted");
    let stored = server
        .object(Resource::RoceNodes, None, "node-x")
        .expect("the RoceNode is stored");
    assert_eq!(stored["spec"]["fabricGeneration"], 7);
}

#[tokio::test]
async fn a_rollout_apply_goes_through_the_direct_stack_and_lands() {
    let dir = tempfile::tempdir().unwrap();
    let server = server().await;
    let mut config = config(dir.path(), &server).await;
    let writer = build(&config).unwrap();
    assert!(
        writer.direct.is_some(),
        "no proxy: the applies skip the queue"
    );
    // kube's client of this writer points at a closed port: the apply lands only through the
    // direct stack.
    config.cluster_url = "https://127.0.0.1:1".parse().unwrap();
    let writer = rocefabric_operator::write_client::WriteClient {
        client: Client::try_from(config).unwrap(),
        direct: writer.direct,
    };
    let executor = Executor::new(writer, "op-0");
    for generation in [3, 4] {
        let write = Write::ApplyRoceNode {
            name: "node-y".into(),
            fabric_name: "f".into(),
            fabric_uid: "uid-f".into(),
            spec: spec(generation),
        };
        assert_eq!(executor.execute(&write).await.unwrap(), Outcome::Done);
        let stored = server
            .object(Resource::RoceNodes, None, "node-y")
            .expect("the RoceNode is stored");
        assert_eq!(stored["spec"]["fabricGeneration"], generation);
        assert_eq!(stored["metadata"]["ownerReferences"][0]["uid"], "uid-f");
    }
}

#[tokio::test]
async fn an_error_answer_through_the_direct_stack_is_the_servers_status() {
    let dir = tempfile::tempdir().unwrap();
    let server = server().await;
    let writer = build(&config(dir.path(), &server).await).unwrap();
    let direct = writer.direct.expect("a direct stack");
    let request = http::Request::get("/apis/rocefabric.io/v1alpha1/nosuchkind/x")
        .body(Vec::new())
        .unwrap();
    match direct.send(request).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 404, "{status:?}");
            assert!(status.message.contains("nosuchkind"), "{status:?}");
        }
        other => panic!("expected the server's 404, got {other:?}"),
    }
}

#[tokio::test]
async fn a_server_it_was_not_told_to_trust_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = server().await;
    let path = server.write_kubeconfig(dir.path()).unwrap();
    let mut kubeconfig = Kubeconfig::read_from(path).unwrap();
    for named in &mut kubeconfig.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            // Another server's certificate: ours does not chain to it.
            cluster.certificate_authority_data = Some(base64_of(
                &rocefabric_operator_testing::scale::apiserver::self_signed_pem().unwrap(),
            ));
        }
    }
    let writer = build(&config_of(kubeconfig).await).unwrap();
    let error = negotiated_version(&writer.client)
        .await
        .expect_err("an untrusted server");
    assert!(
        format!("{error:?}").contains("InvalidCertificate"),
        "{error:?}"
    );
    let request = http::Request::get("/version").body(Vec::new()).unwrap();
    let error = writer
        .direct
        .expect("a direct stack")
        .send(request)
        .await
        .expect_err("an untrusted server, directly");
    assert!(
        format!("{error:?}").contains("InvalidCertificate"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_tls_server_name_that_is_no_name_is_refused_by_value() {
    let dir = tempfile::tempdir().unwrap();
    let server = server().await;
    let mut config = config(dir.path(), &server).await;
    config.tls_server_name = Some("not a name!".into());
    match build(&config) {
        Err(error @ WriteClientError::TlsServerName { .. }) => {
            assert!(error.to_string().contains("\"not a name!\""), "{error}");
        }
        other => panic!("expected a refused tls-server-name, got {:?}", other.err()),
    }
}

fn base64_of(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}
