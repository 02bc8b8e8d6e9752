# Shared by e2e/cluster/up, down and restart: where things live and how a component is started and
# stopped. Sourced, not run.
#
# Everything the cluster makes lives under .state/ (ignored by git) or is named rfe2e*: the bridge
# rfe2e0 (the only interface `up` creates; pods' veths hang off it), the cgroup subtree
# /rocefabric-e2e, the CNI network namespaces of its pods, and the iptables chains kube-proxy and
# the kubelet add (recorded before start, removed by `down`). The machine's own interfaces, routes,
# MTUs are never touched: the bridge plugin runs with isGateway=false (so it does not turn on
# ip_forward), kube-proxy with conntrack sizing and localhost node ports off. The kubelet sets a few
# kernel tunables (vm.overcommit_memory, kernel.panic, ...): `up` records them, `down` restores them.

set -euo pipefail

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$CLUSTER_DIR/../.." && pwd)
STATE=${ROCEFABRIC_CLUSTER_STATE:-$CLUSTER_DIR/.state}
BIN=$ROOT/target/cluster/bin
LOGS=$STATE/logs
PIDS=$STATE/pids
PKI=$STATE/pki

# The Kubernetes release, chosen in README "Try it on a local cluster": the newest release that runs
# on a cgroup v1 host by default (1.35 needs failCgroupV1: false), and has DRA (resource.k8s.io/v1)
# and ValidatingAdmissionPolicy GA.
K8S_VERSION=v1.34.4
# containerd v2 from Go modules, not Debian's 1.6: DRA needs CDI in the runtime (the kubelet passes
# the CDI device ids a DRA driver's NodePrepareResources returns in CreateContainer, and containerd
# resolves them from the specs in /etc/cdi and /var/run/cdi); 1.6 has no CDI. Its shim and ctr too,
# at the same version. runc stays Debian's.
CONTAINERD_MODULE=github.com/containerd/containerd/v2
CONTAINERD_VERSION=v2.2.9
HELM_MODULE=helm.sh/helm/v4/cmd/helm
HELM_VERSION=v4.3.2
# grpcurl: a debugging client the node daemon's plugin sockets must answer (it sends the socket
# path as :authority).
GRPCURL_MODULE=github.com/fullstorydev/grpcurl/cmd/grpcurl
GRPCURL_VERSION=v1.9.4

NODE_NAME=rfe2e-node
BRIDGE=rfe2e0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1
APISERVER_PORT=6443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
CGROUP_ROOT=/rocefabric-e2e
CONTAINERD_SOCK=$STATE/run/containerd.sock
CNI_BIN=${ROCEFABRIC_CNI_BIN:-/usr/lib/cni}
KUBECONFIG_ADMIN=$STATE/kubeconfig
# Fixed in the kubelet (pluginapi.DevicePluginPath), not under --root-dir.
DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins
# Where containerd reads CDI specs a DRA driver writes (the other, /etc/cdi, is configuration).
CDI_DIR=/var/run/cdi

# Kernel tunables the kubelet sets (protectKernelDefaults off); `down` puts them back.
KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)

say() { printf '== cluster: %s\n' "$*"; }
die() {
  printf '== cluster: FAILED: %s\n' "$*" >&2
  exit 1
}

# The pid of a component we started, only while that pid still runs the program we started (a pid
# file left from before a reboot must never make us signal an unrelated process).
pid_of() {
  local file=$PIDS/$1.pid
  [ -f "$file" ] || return 1
  local pid exe
  pid=$(cat "$file")
  kill -0 "$pid" 2>/dev/null || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$exe" = "$(cat "$PIDS/$1.exe" 2>/dev/null)" ] || return 1
  echo "$pid"
}

running() { pid_of "$1" >/dev/null; }

# start NAME COMMAND...: run in its own session, log to logs/NAME.log, remember the pid.
start() {
  local name=$1
  shift
  mkdir -p "$LOGS" "$PIDS"
  readlink -f "$(command -v "$1")" >"$PIDS/$name.exe"
  setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
  echo $! >"$PIDS/$name.pid"
}

# stop NAME: SIGTERM, then SIGKILL after 10 s; the whole process group (containerd's shims are
# their own sessions and are handled by `down`).
stop() {
  local name=$1 pid
  pid=$(pid_of "$name") || {
    rm -f "$PIDS/$name.pid"
    return 0
  }
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$PIDS/$name.pid"
}

# wait_for WHAT SECONDS COMMAND...: poll every half second.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what not within ${seconds}s (logs: $LOGS)"
    sleep 0.5
  done
}

kubectl_admin() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# The ctr built with our containerd (Debian's, if installed, is 1.6), on our socket. Quiet about
# deprecations: on a cgroup v1 host every call would warn that containerd 2.2 deprecates v1 (its log
# says so once).
ctr_e2e() { CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=true "$BIN/ctr" --address "$CONTAINERD_SOCK" "$@"; }
