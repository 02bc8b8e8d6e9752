# The worker layer of the VM (e2e/vm/build --worker): what turns the Soft-RoCE VM into a Kubernetes
# worker node for e2e/cluster/up --workers. Sourced by e2e/vm/build after the base is built (it uses
# its KO, visit_module, copy_modules, resolve_libs and newc). The Kubernetes binaries and images are
# not in it: the worker mounts them from the host over 9p (e2e/cluster/workers.sh).

# Modules, in addition to base's: overlayfs (containerd's snapshotter), the bridge CNI plugin and
# br_netfilter, 9p over virtio (the host's binaries and images), and what kube-proxy's and the
# worker's iptables rules use (legacy iptables: its tables and matches are fixed modules, where
# nf_tables would load expressions on demand, and the guest has no modprobe database).
WORKER_MODULE_ROOTS=(overlay bridge br_netfilter 9p 9pnet_virtio
  nf_conntrack nf_nat ip_tables iptable_filter iptable_nat iptable_mangle iptable_raw
  ip6_tables ip6table_filter ip6table_nat ip6table_mangle ip6table_raw
  xt_conntrack xt_comment xt_mark xt_MASQUERADE xt_addrtype xt_statistic xt_nat xt_multiport
  xt_recent xt_tcpudp ipt_REJECT ip6t_REJECT xt_physdev xt_set)

# libcrc32c (conntrack's dependency) asks the crypto API for "crc32c" at init, as rdma_rxe does for
# "crc32": not in its depends=.
HIDDEN_DEPS[libcrc32c]=crc32c_generic

XTABLES=/usr/sbin/xtables-legacy-multi
XTABLES_EXT=/usr/lib/x86_64-linux-gnu/xtables
# The CNI plugins containerd's CRI and the worker's network config run.
WORKER_CNI=(bridge host-local loopback portmap)

build_worker() {
  local stage=$OUT/worker-root layer cni=${ROCEFABRIC_CNI_BIN:-/usr/lib/cni} p
  local runc
  runc=$(command -v runc) || die "runc is not installed (e2e/cluster/up installs it)"
  [ -x "$XTABLES" ] || die "$XTABLES missing (Debian package iptables)"
  for p in "${WORKER_CNI[@]}"; do [ -x "$cni/$p" ] || die "CNI plugin $cni/$p missing (containernetworking-plugins)"; done
  resolve_libs "$runc" "$XTABLES" "$XTABLES_EXT"/libxt_standard.so
  local stamp
  stamp=$( {
    cat "$VM_DIR/worker.sh" "$ROOT/e2e/cluster/worker/init"
    echo "$KPKG ${WORKER_MODULE_ORDER[*]}"
    stat -L -c '%n %s %Y' "$runc" "$XTABLES" "${LIBS[@]}" "$XTABLES_EXT" "${WORKER_CNI[@]/#/$cni/}"
  } | sha256sum | cut -d' ' -f1)
  if [ -s "$OUT/worker.cpio" ] && [ "$(cat "$OUT/worker.stamp" 2>/dev/null)" = "$stamp" ]; then
    say "worker.cpio is up to date"
    return
  fi
  say "assembling worker.cpio (${#WORKER_MODULE_ORDER[@]} modules: ${WORKER_MODULE_ORDER[*]})"
  rm -rf "$stage"
  mkdir -p "$stage"/{usr/sbin,usr/lib/rocefabric,opt/cni/bin,etc}
  copy_modules "$stage" "${WORKER_MODULE_ORDER[@]}" >"$stage/usr/lib/rocefabric/worker-modules.order"
  cp -L "$runc" "$stage/usr/sbin/runc"
  cp -L "$XTABLES" "$stage/usr/sbin/xtables-legacy-multi"
  for p in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -s xtables-legacy-multi "$stage/usr/sbin/$p"
  done
  mkdir -p "$stage$XTABLES_EXT"
  cp -L "$XTABLES_EXT"/*.so "$stage$XTABLES_EXT/"
  local lib dst
  for lib in "${LIBS[@]}"; do
    dst=$stage$(guest_lib_path "$lib")
    mkdir -p "$(dirname "$dst")"
    cp -L "$lib" "$dst"
  done
  for p in "${WORKER_CNI[@]}"; do cp -L "$cni/$p" "$stage/opt/cni/bin/$p"; done
  install -m 0755 "$ROOT/e2e/cluster/worker/init" "$stage/usr/lib/rocefabric/worker-init"
  newc "$stage" >"$OUT/worker.cpio.tmp"
  mv "$OUT/worker.cpio.tmp" "$OUT/worker.cpio"
  echo "$stamp" >"$OUT/worker.stamp"
}
