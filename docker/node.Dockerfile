# syntax=docker/dockerfile:1
# The node daemon image: `rocefabric-device-plugin` (discover, serve, qos, agent) on distroless.
#
#   docker build -f docker/node.Dockerfile -t rocefabric/rocefabric-node:0.1.0 .
#
# The image's default user is distroless `nonroot` (65532): `discover` and `qos show` need nothing
# more. In the chart's DaemonSet both containers run as uid 0, for different reasons and with
# different capabilities (see charts/rocefabric/README.md, "Privileges"):
# - device-plugin (`serve`): no capabilities at all; uid 0 only because the kubelet's socket
#   directory and kubelet.sock are root-owned and a plugin must create its socket there and connect
#   to kubelet.sock;
# - qos-agent (`agent`): NET_ADMIN only, for DCB netlink and the MTU; uid 0 owns the driver's
#   sysfs/debugfs/configfs files it writes.
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rocefabric-device-plugin \
 && install -D -m 0755 target/release/rocefabric-device-plugin /out/rocefabric-device-plugin

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/rocefabric-device-plugin /usr/local/bin/rocefabric-device-plugin
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rocefabric-device-plugin"]
CMD ["discover"]
