//! Compiles the kubelet's gRPC APIs into `OUT_DIR` with `protox` (a pure-Rust protobuf compiler),
//! so building needs no system `protoc`: the device plugin API, and for DRA mode the DRA plugin
//! API (v1 and v1beta1), plugin registration and pod resources. The generated code is included by
//! `src/lib.rs` and never checked in.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "deviceplugin/v1beta1/api.proto",
        "dra/v1/api.proto",
        "dra/v1beta1/api.proto",
        "pluginregistration/v1/api.proto",
        "podresources/v1/api.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Map fields as BTreeMap so responses are ordered and comparable in tests.
        .btree_map(".")
        .compile_fds(descriptors)?;
    Ok(())
}
