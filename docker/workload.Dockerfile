# syntax=docker/dockerfile:1
# A small workload image with the data plane CLI `rocefabric-dsm` (serve, read, write, cas, add,
# session, probe) and rdma-core's user space (libibverbs and the providers: mlx5, rxe, ...), which
# the binary loads at run time. Base it on your own training image the same way: copy the binary
# and install `ibverbs-providers`.
#
#   docker build -f docker/workload.Dockerfile -t rocefabric/rocefabric-dsm:0.1.0 .
ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Nothing beyond the Rust image: the verbs binding needs no headers or cmake, since libibverbs is
# loaded when the binary runs (the runtime stage installs it).
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rocefabric-dsm \
 && install -D -m 0755 target/release/rocefabric-dsm /out/rocefabric-dsm

FROM docker.io/library/debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/rocefabric-dsm /usr/local/bin/rocefabric-dsm
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rocefabric-dsm"]
CMD ["serve"]
