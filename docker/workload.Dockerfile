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
COPY --from=build /out/rocefabric-dsm /usr/local/bin/rocefabric-dsm
# The image's user is not root, and a capability the pod adds (IPC_LOCK, to pin a window past the
# 8 MiB RLIMIT_MEMLOCK) reaches a non-root process only through a file capability on the binary.
# Permitted only (`=p`, no effective bit): rocefabric-dsm raises it itself, so a pod that does not
# add IPC_LOCK still runs it and gets a message naming the fix, not EPERM from exec. Set in this
# stage, after the COPY, since a COPY does not carry extended attributes. Do the same in your image.
RUN apt-get update && apt-get install -y --no-install-recommends libibverbs1 ibverbs-providers libcap2-bin \
 && setcap cap_ipc_lock=p /usr/local/bin/rocefabric-dsm \
 && apt-get purge -y libcap2-bin && rm -rf /var/lib/apt/lists/*
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/rocefabric-dsm"]
CMD ["serve"]
