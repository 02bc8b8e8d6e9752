# Worker nodes of the e2e cluster: qemu VMs with Soft-RoCE on their NIC, running containerd, the
# kubelet and kube-proxy from the host's build (e2e/cluster/up --workers N). Sourced by up and down
# after lib.sh, not run.
#
# Each worker rfe2e-wI (I = 1..N) is booted from e2e/vm's Debian kernel with three initramfs layers:
# base.cpio, worker.cpio (e2e/vm/build --worker: modules, runc, iptables, CNI plugins, the init in
# e2e/cluster/worker/init) and its own (certificates, configs, addresses). The host's
# target/cluster/bin and images reach it read-only over 9p; its components log to
# $LOGS/workers/rfe2e-wI/ over 9p, its console to $LOGS/worker-rfe2e-wI.log.
#
# Network, all of it made here and nowhere else. Each worker has two NICs, as a GPU node has a
# front-end NIC and RoCE rails:
# - eth0, the node's NIC: a tap rfe2e-wI on the cluster bridge rfe2e0, the worker at
#   10.244.0.(200+I) in the bridge's subnet (the host's pods take .2-.199), its pods in
#   10.244.I.0/24 on its own bridge inside the VM. Workers route each other's pod subnets directly
#   over the bridge, so pods on different nodes talk with their own addresses. The host itself
#   gets no route: worker pods reach the control plane masqueraded as their node, and host pods do
#   not reach worker pods.
# - eth1, the fabric NIC with Soft-RoCE (rxe0) on it: a tap rfe2e-fI on the fabric bridge rfe2e1,
#   which has no address on the host, the worker at 10.245.0.(200+I). RoCE v2 (UDP 4791) runs
#   between the VMs' rxe0 devices there; the fabric's QoS (MTU) is applied to it.
# Each worker has a qemu monitor socket ($STATE/workers/rfe2e-wI/monitor.sock): `set_link fabric
# off` pulls the fabric NIC's cable (the node stays reachable over eth0), `set_link fabric on`
# plugs it back. Who may cross what: $STATE/workers/ is root's alone (0700: the node's private keys
# in its layer and initrd, and the monitor socket); the VM writes only its log directory on the
# host (9p), reads the binaries and images read-only; from the cluster bridge it reaches what the
# host node's pods reach (the API server and kubelet ports, both authenticated).

WORKER_PREFIX=rfe2e-w
FABRIC_TAP_PREFIX=rfe2e-f
FABRIC_BRIDGE=rfe2e1
WORKER_TAINT=rocefabric.io/vm-worker=true:NoSchedule
WORKER_LABEL=rocefabric.io/vm-worker=true
WORKER_MEMORY=${ROCEFABRIC_WORKER_MEMORY:-3072}
# 2 MiB hugepages reserved at boot (before the kubelet reads its capacity): the user story backs a
# 256 MiB window with them (128 pages), the rest of the memory backs anonymous windows of 64 MiB.
WORKER_HUGEPAGES=${ROCEFABRIC_WORKER_HUGEPAGES:-160}
WORKER_CPUS=${ROCEFABRIC_WORKER_CPUS:-2}
# How long all workers together may take to be Ready (TCG on 2 cores: about 90 s each, side by side).
WORKER_BOOT_LIMIT=${ROCEFABRIC_WORKER_BOOT_LIMIT:-900}
# The taps carry jumbo frames so a fabric MTU up to 9000 on the workers' NICs reaches the other VM
# (the bridge forwards by the egress port's MTU).
WORKER_TAP_MTU=9000
VM_OUT=$ROOT/target/vm

# A directory's tree as a newc cpio archive on stdout, every entry owned by root (an initramfs layer).
worker_newc() {
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0)
}

worker_name() { echo "$WORKER_PREFIX$1"; }
worker_ip() { echo "10.244.0.$((200 + $1))"; }
worker_pod_cidr() { echo "10.244.$1.0/24"; }
worker_fabric_ip() { echo "10.245.0.$((200 + $1))"; }

# The accelerator qemu gets: TCG unless ROCEFABRIC_E2E_KVM=1 asks for KVM. Never probed: a nested
# or paravirtualised /dev/kvm may exist and still hang a guest, and a probe that oopses the host
# kernel reboots it while the kubelet has set kernel.panic_on_oops (e2e/vm/README.md).
worker_accel() {
  if [ "${ROCEFABRIC_E2E_KVM:-0}" = 1 ]; then
    [ -w /dev/kvm ] || die "ROCEFABRIC_E2E_KVM=1, but /dev/kvm is not there or not writable"
    echo kvm
  else
    echo tcg
  fi
}

# The worker's own layer: its facts, certificates, kubeconfigs and component configs.
worker_layer() { # INDEX COUNT
  local i=$1 count=$2 name ip pod_cidr dir conf routes="" j
  name=$(worker_name "$i")
  ip=$(worker_ip "$i")
  pod_cidr=$(worker_pod_cidr "$i")
  dir=$STATE/workers/$name/layer
  conf=$dir/etc/rocefabric-worker
  rm -rf "$dir"
  # Root only: the layer and the initrd hold the node's private keys, and the monitor socket
  # beside them controls the VM.
  mkdir -p "$STATE/workers/$name" "$conf/pki"
  chmod 700 "$STATE/workers" "$STATE/workers/$name"
  for j in $(seq "$count"); do
    [ "$j" = "$i" ] || routes+="$(worker_pod_cidr "$j")@$(worker_ip "$j") "
  done
  cert "kubelet-$name" "system:node:$name" system:nodes
  cert "kubelet-serving-$name" "system:node:$name" system:nodes "IP:$ip,DNS:$name"
  cp "$PKI/ca.crt" "$conf/pki/"
  cp "$PKI/kubelet-serving-$name.crt" "$conf/pki/kubelet-serving.crt"
  cp "$PKI/kubelet-serving-$name.key" "$conf/pki/kubelet-serving.key"
  # kubeconfig() reads $PKI/<user>.{crt,key}: the node's client certificate under a per-node name.
  kubeconfig "$conf/kubelet.kubeconfig" "kubelet-$name"
  kubeconfig "$conf/kube-proxy.kubeconfig" kube-proxy
  cat >"$conf/env" <<EOF
NODE_NAME=$name
NODE_IP=$ip
HOST_IP=$NODE_IP
HOST_SUBNET=10.244.0.0/24
POD_CIDR=$pod_cidr
POD_ROUTES="$routes"
SERVICE_CIDR=$SERVICE_CIDR
FABRIC_IP=$(worker_fabric_ip "$i")
FABRIC_MTU=1500
NODE_LABELS=$WORKER_LABEL
NODE_TAINTS=$WORKER_TAINT
EOF
  cat >"$conf/containerd.toml" <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "$PAUSE_IMAGE"
[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # The root is the initramfs, which pivot_root cannot leave.
        NoPivotRoot = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
EOF
  cat >"$conf/10-worker.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "rocefabric-e2e",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$conf/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/rocefabric-worker/pki/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: /etc/rocefabric-worker/pki/kubelet-serving.crt
tlsPrivateKeyFile: /etc/rocefabric-worker/pki/kubelet-serving.key
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
nodeStatusUpdateFrequency: 3s
nodeStatusReportFrequency: 30s
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
maxPods: 30
shutdownGracePeriod: 0s
EOF
  cat >"$conf/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: /etc/rocefabric-worker/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: 10.244.0.0/16
hostnameOverride: $name
bindAddress: $ip
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$ip/32"]
EOF
  # The kubeconfigs name the host's paths for nothing: certificates are inline. The scenario starts
  # the worker's init from the worker layer.
  printf '#!/bin/sh\nexec sh /usr/lib/rocefabric/worker-init\n' >"$dir/scenario"
}

start_worker() { # INDEX COUNT ACCEL
  local i=$1 count=$2 accel=$3 name ip tap dir cpu=(-cpu max)
  name=$(worker_name "$i")
  running "worker-$name" && return 0
  ip=$(worker_ip "$i")
  tap=$name
  dir=$STATE/workers/$name
  worker_layer "$i" "$count"
  cat "$VM_OUT/base.cpio" "$VM_OUT/worker.cpio" >"$dir/initrd"
  worker_newc "$dir/layer" >>"$dir/initrd"
  mkdir -p "$LOGS/workers/$name"
  rm -f "$LOGS/workers/$name"/*.log
  : >"$LOGS/worker-$name.log"
  if ! ip link show "$tap" >/dev/null 2>&1; then
    ip tuntap add dev "$tap" mode tap
  fi
  ip link set "$tap" master "$BRIDGE" mtu "$WORKER_TAP_MTU" up
  if ! ip link show "$FABRIC_BRIDGE" >/dev/null 2>&1; then
    ip link add "$FABRIC_BRIDGE" type bridge
  fi
  ip link set "$FABRIC_BRIDGE" up
  local fabric_tap=$FABRIC_TAP_PREFIX$i
  if ! ip link show "$fabric_tap" >/dev/null 2>&1; then
    ip tuntap add dev "$fabric_tap" mode tap
  fi
  ip link set "$fabric_tap" master "$FABRIC_BRIDGE" mtu "$WORKER_TAP_MTU" up
  [ "$accel" = kvm ] && cpu=(-cpu host)
  rm -f "$dir/monitor.sock"
  start "worker-$name" qemu-system-x86_64 -name "$name" -accel "$accel" "${cpu[@]}" \
    -smp "$WORKER_CPUS" -m "$WORKER_MEMORY" -display none -no-reboot -serial stdio \
    -monitor "unix:$dir/monitor.sock,server,nowait" \
    -kernel "$VM_OUT/vmlinuz" -initrd "$dir/initrd" \
    -append "console=ttyS0 panic=-1 quiet hugepagesz=2M hugepages=$WORKER_HUGEPAGES" \
    -netdev "tap,id=net0,ifname=$tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=net0,mac=52:54:00:e2:00:$(printf %02x "$i")" \
    -netdev "tap,id=fabric,ifname=$fabric_tap,script=no,downscript=no" \
    -device "virtio-net-pci,netdev=fabric,mac=52:54:00:e2:01:$(printf %02x "$i")" \
    -virtfs "local,path=$BIN,mount_tag=bin,security_model=none,readonly=on" \
    -virtfs "local,path=$STATE/images,mount_tag=images,security_model=none,readonly=on" \
    -virtfs "local,path=$LOGS/workers/$name,mount_tag=logs,security_model=none"
  say "worker $name ($ip, pods $(worker_pod_cidr "$i"), $accel) booting; console: $LOGS/worker-$name.log"
}

start_workers() { # COUNT
  local count=$1 i accel started=$SECONDS
  [ "$count" -gt 0 ] || return 0
  [ "$count" -le 9 ] || die "--workers takes 0..9"
  # worker.cpio: built by `up` before it starts anything.
  accel=$(worker_accel)
  for i in $(seq "$count"); do start_worker "$i" "$count" "$accel"; done
  # The workers boot side by side; one deadline for them all (a wedged one restarts it, once each).
  WORKERS_DEADLINE=$((SECONDS + WORKER_BOOT_LIMIT))
  for i in $(seq "$count"); do wait_worker_ready "$i" "$count" "$accel"; done
  say "$count workers Ready in $((SECONDS - started))s ($accel)"
}

# Wait for worker INDEX's Node to be Ready. Under TCG on a busy host a guest can wedge at boot:
# every vCPU in a soft lockup, RCU stalled, the kubelet never heard from (seen once in a CI run
# on 2 cores, the other VM booting fine beside it). Its console says so within two minutes,
# long before the deadline; such a worker is booted again, once (its console kept as .wedged).
wait_worker_ready() { # INDEX COUNT ACCEL
  local i=$1 count=$2 accel=$3 name log deadline rebooted=
  name=$(worker_name "$i")
  log=$LOGS/worker-$name.log
  deadline=$WORKERS_DEADLINE
  until kubectl_admin wait --for=condition=Ready "node/$name" --timeout=2s >/dev/null 2>&1; do
    if [ -z "$rebooted" ] && grep -q "soft lockup" "$log" 2>/dev/null; then
      say "worker $name wedged at boot (soft lockup on its console, kept in $log.wedged); booting it again"
      cp "$log" "$log.wedged"
      stop "worker-$name"
      start_worker "$i" "$count" "$accel"
      rebooted=1
      deadline=$((SECONDS + WORKER_BOOT_LIMIT))
    fi
    [ $SECONDS -lt $deadline ] || die "worker $name Ready (console: $log) not within ${WORKER_BOOT_LIMIT}s of the workers' boot (logs: $LOGS)"
    sleep 0.5
  done
}

# The names of the workers whose VM runs, space-separated.
running_workers() {
  local pidfile name
  for pidfile in "$PIDS"/worker-*.pid; do
    [ -e "$pidfile" ] || continue
    name=$(basename "$pidfile" .pid)
    running "$name" && printf '%s ' "${name#worker-}"
  done
  return 0
}

# Every worker VM and tap, whatever their count; their Node objects go with the control plane's
# etcd (or are deleted here when the control plane stays).
stop_workers() {
  local pidfile name
  for pidfile in "$PIDS"/worker-*.pid; do
    [ -e "$pidfile" ] || continue
    name=$(basename "$pidfile" .pid)
    running "$name" && say "removed process $name"
    stop "$name"
  done
  for name in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 \
    | grep -E "^($WORKER_PREFIX|$FABRIC_TAP_PREFIX)[0-9]+$"); do
    ip link del "$name" 2>/dev/null || true
  done
  if ip link show "$FABRIC_BRIDGE" >/dev/null 2>&1; then ip link del "$FABRIC_BRIDGE" || true; fi
}
