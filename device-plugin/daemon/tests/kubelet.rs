//! The kubelet-facing gRPC layer on its own: a `DevicePlugin` server over a fixed backend, the
//! registration client and the kubelet emulator, all over real unix sockets in a temp dir.

mod raw_h2;

use std::sync::Arc;
use std::time::Duration;

use rocefabric_h2_authority::frame;
use rocefabric_kubelet_api::device_plugin::{PluginServer, plugin_options};
use rocefabric_kubelet_api::registration::{self, RegistrationError};
use rocefabric_kubelet_api::{self as kubelet, pb};
use rocefabric_node_testing::fixed_plugin::FixedBackend;
use rocefabric_node_testing::fixtures;
use rocefabric_node_testing::kubelet_emulator::{EmulatorError, KubeletEmulator};

const WAIT: Duration = Duration::from_secs(5);
const RESOURCE: &str = "example.com/fake";

/// A backend over `ids`; allocation echoes the IDs in `FAKE_IDS`.
fn fake(ids: &[&str]) -> Arc<FixedBackend> {
    FixedBackend::new(RESOURCE, ids, Some(0), "FAKE_IDS")
}

async fn serve_and_register(
    dir: &std::path::Path,
    backend: Arc<FixedBackend>,
) -> (KubeletEmulator, PluginServer) {
    let kubelet = KubeletEmulator::start(dir).await.expect("emulator");
    let endpoint = kubelet::socket_file_name(RESOURCE);
    let server = PluginServer::start(&dir.join(&endpoint), backend)
        .await
        .expect("serve");
    registration::register(
        kubelet.socket_path(),
        registration::register_request(RESOURCE, &endpoint),
    )
    .await
    .expect("register");
    kubelet
        .wait_for_resources(&[RESOURCE], WAIT)
        .await
        .expect("listed");
    (kubelet, server)
}

#[tokio::test]
async fn the_emulator_refuses_a_plugin_that_is_not_serving_yet() {
    let dir = fixtures::tempdir().expect("temp dir");
    let kubelet = KubeletEmulator::start(dir.path()).await.expect("emulator");
    let request = registration::register_request(RESOURCE, "rocefabric-example.com_fake.sock");
    let err = registration::register(kubelet.socket_path(), request)
        .await
        .expect_err("refused");
    assert!(matches!(err, RegistrationError::Rejected { .. }), "{err}");
    let snapshot = kubelet.snapshot();
    assert_eq!(snapshot.registrations.len(), 1);
    let reason = snapshot.registrations[0]
        .rejected
        .as_deref()
        .expect("recorded as refused");
    assert!(
        reason.contains("rocefabric-example.com_fake.sock"),
        "{reason}"
    );
}

#[tokio::test]
async fn the_emulator_refuses_bad_versions_and_resource_names() {
    let dir = fixtures::tempdir().expect("temp dir");
    let kubelet = KubeletEmulator::start(dir.path()).await.expect("emulator");
    let endpoint = kubelet::socket_file_name(RESOURCE);
    let _server = PluginServer::start(&dir.path().join(&endpoint), fake(&["a"]))
        .await
        .expect("serve");

    let mut request = registration::register_request(RESOURCE, &endpoint);
    request.version = "v1alpha".into();
    let err = registration::register(kubelet.socket_path(), request)
        .await
        .expect_err("version");
    assert!(err.to_string().contains("v1alpha"), "{err}");

    let request = registration::register_request("hca", &endpoint);
    let err = registration::register(kubelet.socket_path(), request)
        .await
        .expect_err("name");
    let RegistrationError::Rejected { status, .. } = err else {
        panic!("{err}")
    };
    assert!(status.message().contains("\"hca\""), "{}", status.message());
    assert!(kubelet.snapshot().registered().is_empty());
}

#[tokio::test]
async fn list_and_watch_sends_the_full_list_then_every_change() {
    let dir = fixtures::tempdir().expect("temp dir");
    let backend = fake(&["a", "b"]);
    let (kubelet, server) = serve_and_register(dir.path(), Arc::clone(&backend)).await;
    let devices = kubelet
        .snapshot()
        .devices_of(RESOURCE)
        .expect("listed")
        .to_vec();
    assert_eq!(
        devices,
        vec![
            kubelet::device("a", true, Some(0)),
            kubelet::device("b", true, Some(0))
        ]
    );
    let topology = devices[0].topology.as_ref().expect("topology");
    assert_eq!(topology.nodes[0].id, 0);

    backend.update(|list| list[1].health = "Unhealthy".into());
    let devices = kubelet
        .wait_for_devices(RESOURCE, WAIT, |d| {
            d.len() == 2 && d[1].health == "Unhealthy"
        })
        .await
        .expect("update reached the kubelet");
    assert_eq!(
        devices[0].health, "Healthy",
        "the full list is sent, not a delta"
    );

    backend.update(|list| list.push(kubelet::device("c", true, None)));
    kubelet
        .wait_for_devices(RESOURCE, WAIT, |d| d.len() == 3)
        .await
        .expect("membership change");
    assert_eq!(kubelet.snapshot().list_updates[RESOURCE], 3);
    server.stop().await;
}

#[tokio::test]
async fn options_pre_start_preferred_and_allocate_over_the_socket() {
    let dir = fixtures::tempdir().expect("temp dir");
    let (kubelet, server) = serve_and_register(dir.path(), fake(&["a", "b", "c"])).await;
    let mut client = kubelet.client(RESOURCE).await.expect("client");

    let options = client
        .get_device_plugin_options(pb::Empty {})
        .await
        .expect("options");
    assert!(options.get_ref().get_preferred_allocation_available);
    let pre = client
        .pre_start_container(pb::PreStartContainerRequest {
            devices_ids: vec!["a".into()],
        })
        .await
        .expect("pre-start");
    assert_eq!(pre.into_inner(), pb::PreStartContainerResponse {});

    let preferred = kubelet
        .preferred_allocation(RESOURCE, &["a", "b", "c"], &["c"], 2)
        .await
        .expect("pref");
    assert_eq!(preferred, ["c", "a"]);
    let negative = kubelet
        .preferred_allocation(RESOURCE, &["a"], &[], -1)
        .await
        .expect_err("neg");
    let EmulatorError::Rpc(status) = negative else {
        panic!("{negative}")
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    let response = kubelet
        .allocate(RESOURCE, &["a", "b"])
        .await
        .expect("allocate");
    assert_eq!(response.envs["FAKE_IDS"], "a,b");
    let err = kubelet
        .allocate(RESOURCE, &["zz"])
        .await
        .expect_err("unknown");
    let EmulatorError::Rpc(status) = err else {
        panic!("{err}")
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("\"zz\""), "{}", status.message());

    // Several containers in one request get one response each, in order.
    let two = client
        .allocate(pb::AllocateRequest {
            container_requests: vec![
                pb::ContainerAllocateRequest {
                    devices_ids: vec!["a".into()],
                },
                pb::ContainerAllocateRequest {
                    devices_ids: vec!["c".into()],
                },
            ],
        })
        .await
        .expect("two containers")
        .into_inner();
    let envs: Vec<&str> = two
        .container_responses
        .iter()
        .map(|r| r.envs["FAKE_IDS"].as_str())
        .collect();
    assert_eq!(envs, ["a", "c"]);
    server.stop().await;
}

#[tokio::test]
async fn stopping_a_server_ends_its_stream_and_removes_its_socket() {
    let dir = fixtures::tempdir().expect("temp dir");
    let (kubelet, server) = serve_and_register(dir.path(), fake(&["a"])).await;
    let socket = server.socket_path().to_path_buf();
    assert!(socket.exists());
    tokio::time::timeout(WAIT, server.stop())
        .await
        .expect("stops promptly with a stream open");
    assert!(!socket.exists());
    assert!(
        kubelet.client(RESOURCE).await.is_err(),
        "nothing answers any more"
    );
}

#[tokio::test]
async fn a_server_replaces_a_stale_socket_file() {
    let dir = fixtures::tempdir().expect("temp dir");
    let socket = dir.path().join(kubelet::socket_file_name(RESOURCE));
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("stale socket"));
    let server = PluginServer::start(&socket, fake(&["a"]))
        .await
        .expect("serve over stale");
    assert!(server.is_running());
    server.stop().await;
}

#[tokio::test]
async fn the_emulator_restart_deletes_every_socket_and_serves_a_new_kubelet_sock() {
    let dir = fixtures::tempdir().expect("temp dir");
    let (mut kubelet, server) = serve_and_register(dir.path(), fake(&["a"])).await;
    let mut watcher =
        kubelet::watcher::DirWatcher::start(dir.path(), kubelet.socket_path()).expect("watch");
    kubelet.restart().await.expect("restart");
    assert!(
        !server.socket_path().exists(),
        "plugin sockets deleted like the kubelet does"
    );
    let mut events = Vec::new();
    while !events.contains(&kubelet::watcher::DirEvent::KubeletSocketCreated) {
        let event = tokio::time::timeout(WAIT, watcher.next())
            .await
            .expect("inotify event");
        events.push(event.expect("watch open"));
    }
    assert!(
        events.contains(&kubelet::watcher::DirEvent::OwnSocketRemoved(
            kubelet::socket_file_name(RESOURCE)
        ))
    );
    let snapshot = kubelet.snapshot();
    assert_eq!(snapshot.generation, 1);
    assert!(snapshot.registered().is_empty());
    assert!(snapshot.devices.is_empty());
    server.stop().await;

    // The new kubelet accepts a plugin that serves again.
    let endpoint = kubelet::socket_file_name(RESOURCE);
    let server = PluginServer::start(&dir.path().join(&endpoint), fake(&["a"]))
        .await
        .expect("serve");
    registration::register(
        kubelet.socket_path(),
        registration::register_request(RESOURCE, &endpoint),
    )
    .await
    .expect("register with the new kubelet");
    let snapshot = kubelet
        .wait_for_resources(&[RESOURCE], WAIT)
        .await
        .expect("listed");
    assert_eq!(snapshot.registered()[RESOURCE].generation, 1);
    server.stop().await;
}

/// Check a `GetDevicePluginOptions` answer: 200, a gRPC body holding our options, status 0.
fn assert_options_answer(response: &raw_h2::Response) {
    use prost::Message;
    assert_eq!(response.headers[":status"], "200", "{response:?}");
    assert_eq!(response.headers["content-type"], "application/grpc");
    assert_eq!(
        response.data,
        raw_h2::grpc_message(&plugin_options().encode_to_vec())
    );
    assert_eq!(response.trailers["grpc-status"], "0", "{response:?}");
}

/// `GetDevicePluginOptions` through the kubelet emulator's tonic client.
async fn options_over_tonic(kubelet: &KubeletEmulator) -> pb::DevicePluginOptions {
    kubelet
        .client(RESOURCE)
        .await
        .expect("client")
        .get_device_plugin_options(pb::Empty {})
        .await
        .expect("options over tonic")
        .into_inner()
}

#[tokio::test]
async fn clients_that_send_the_socket_path_as_authority_are_served() {
    // grpcurl, grpcio and grpc-java send `:authority: <socket path>`, which h2 alone resets.
    let dir = fixtures::tempdir().expect("temp dir");
    let socket = dir.path().join(kubelet::socket_file_name(RESOURCE));
    let server = PluginServer::start(&socket, fake(&["a"]))
        .await
        .expect("serve");
    let authority = socket.to_str().expect("UTF-8 path");
    let mut client = raw_h2::Client::connect(&socket).await;

    let block = client.request_block(raw_h2::OPTIONS_PATH, authority);
    assert_options_answer(&client.unary(1, &block).await);

    // The same request again comes wholly from the client's dynamic and static tables: the
    // front's decoder must mirror the client's table to read it.
    let block = client.request_block(raw_h2::OPTIONS_PATH, authority);
    assert!(
        block.iter().all(|b| b & 0x80 != 0),
        "all indexed: {block:?}"
    );
    assert_options_answer(&client.unary(3, &block).await);

    // A header block in a padded HEADERS frame with priority fields, then two CONTINUATIONs.
    let block = client.request_block(raw_h2::OPTIONS_PATH, "/some/other.sock");
    let (first, rest) = block.split_at(2);
    let (second, third) = rest.split_at(1);
    let mut headers = vec![3, 0, 0, 0, 0, 15];
    headers.extend_from_slice(first);
    headers.extend_from_slice(&[0; 3]);
    let mut bytes =
        raw_h2::frame_bytes(frame::HEADERS, frame::PADDED | frame::PRIORITY, 5, &headers);
    bytes.extend(raw_h2::frame_bytes(frame::CONTINUATION, 0, 5, second));
    bytes.extend(raw_h2::frame_bytes(
        frame::CONTINUATION,
        frame::END_HEADERS,
        5,
        third,
    ));
    bytes.extend(raw_h2::empty_message(5));
    client.send(&bytes).await;
    assert_options_answer(&client.response(5).await);
    // Gone before the stop: graceful shutdown waits for open connections.
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn a_valid_authority_passes_and_the_kubelet_client_still_works() {
    let dir = fixtures::tempdir().expect("temp dir");
    let (kubelet, server) = serve_and_register(dir.path(), fake(&["a"])).await;
    let mut client = raw_h2::Client::connect(server.socket_path()).await;
    for (stream, authority) in [(1, "localhost"), (3, "localhost:1234")] {
        let block = client.request_block(raw_h2::OPTIONS_PATH, authority);
        assert_options_answer(&client.unary(stream, &block).await);
    }
    assert_eq!(options_over_tonic(&kubelet).await, plugin_options());
    assert_eq!(kubelet.snapshot().options[RESOURCE], plugin_options());
    drop(client);
    server.stop().await;
}

#[tokio::test]
async fn garbage_closes_that_connection_and_the_server_serves_on() {
    let dir = fixtures::tempdir().expect("temp dir");
    let (kubelet, server) = serve_and_register(dir.path(), fake(&["a"])).await;
    let socket = server.socket_path().to_path_buf();

    // Not HTTP/2 at all.
    let mut plain = tokio::net::UnixStream::connect(&socket)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut plain, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("send");
    let mut sink = Vec::new();
    // An end of stream or a reset (our bytes unread) both say closed.
    let _ = tokio::time::timeout(
        WAIT,
        tokio::io::AsyncReadExt::read_to_end(&mut plain, &mut sink),
    )
    .await
    .expect("closed in time");

    // A CONTINUATION with no HEADERS before it and a header block that does not decode (index 0),
    // both refused by the front; DATA on stream 0, passed on and refused by the server.
    for garbage in [
        raw_h2::frame_bytes(frame::CONTINUATION, frame::END_HEADERS, 1, &[0x82]),
        raw_h2::frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x80]),
        raw_h2::frame_bytes(0x0, 0, 0, b"\xde\xad\xbe\xef"),
    ] {
        let mut client = raw_h2::Client::connect(&socket).await;
        client.send(&garbage).await;
        client.expect_closed().await;
    }

    assert!(server.is_running());
    let mut client = raw_h2::Client::connect(&socket).await;
    let block = client.request_block(raw_h2::OPTIONS_PATH, socket.to_str().expect("UTF-8"));
    assert_options_answer(&client.unary(1, &block).await);
    assert_eq!(options_over_tonic(&kubelet).await, plugin_options());
    drop(client);
    server.stop().await;
}
