//! Compiles the kubelet device plugin API (`proto/deviceplugin/v1beta1/api.proto`) into `OUT_DIR`
//! with `protox` (a pure-Rust protobuf compiler), so building needs no system `protoc`. The generated
//! code is included by `src/kubelet/mod.rs` and never checked in.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed=proto/{proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Map fields as BTreeMap so responses are ordered and comparable in tests.
        .btree_map(".v1beta1")
        .compile_fds(descriptors)?;
    Ok(())
}
