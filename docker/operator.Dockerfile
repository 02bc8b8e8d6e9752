# syntax=docker/dockerfile:1
# The operator image: one static-ish Rust binary on distroless (glibc + libgcc, no shell, no package
# manager), running as the distroless `nonroot` user (65532).
#
#   docker build -f docker/operator.Dockerfile -t rocefabric/rocefabric-operator:0.1.0 .
#
# Build context: the repository root (docker/operator.Dockerfile.dockerignore keeps target/ out).
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and build artefacts between builds; the binary is copied out of the
# cached target dir because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rocefabric-operator \
 && install -D -m 0755 target/release/rocefabric-operator /out/rocefabric-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/rocefabric-operator /usr/local/bin/rocefabric-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/rocefabric-operator"]
CMD ["run"]
