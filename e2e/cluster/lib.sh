# Shared by e2e/cluster/up, down and reaper: where things live, who owns the cluster, and how a
# component is started and stopped. Sourced, not run.
#
# One machine, one cluster, one owner. Everything the cluster makes lives in one place per machine,
# outside every checkout: $STATE (/var/lib/rocefabric-e2e; etcd, the kubelet's root dir and its
# mounts, containerd's root, logs, the PKI, images). `up` and `down` take $LOCK for as long as they
# run, and print who holds it while they wait. The cluster belongs to one run (a process: `.ci/run`,
# or the shell that ran `up`; $OWNER_FILE names it and its checkout): every component runs in the
# run's cgroup ($RUN_CGROUP), and a reaper started by `up` runs `down` as soon as that process is
# gone, however it ended (SIGKILL included). A second checkout's `up` or `down` refuses, naming the
# owner, while the owner lives; once it is gone, whatever it left is removed (and said) first.
#
# Besides $STATE, everything the cluster makes is named rfe2e*: the bridge rfe2e0 (the only
# interface `up` creates; pods' veths hang off it), the cgroup subtrees /rocefabric-e2e (pods) and
# $RUN_CGROUP (components), the CNI network namespaces of its pods, and the iptables chains
# kube-proxy and the kubelet add (recorded before start, removed by `down`). The machine's own
# interfaces, routes, MTUs are never touched: the bridge plugin runs with isGateway=false (so it
# does not turn on ip_forward), kube-proxy with conntrack sizing and localhost node ports off. The
# kubelet sets a few kernel tunables (vm.overcommit_memory, kernel.panic, ...): their values are
# recorded once per boot, before the first kubelet of that boot, and `down` restores them.

set -euo pipefail

CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$CLUSTER_DIR/../.." && pwd)
STATE=${ROCEFABRIC_CLUSTER_STATE:-/var/lib/rocefabric-e2e}
# Beside $STATE, not in it: `down --purge` removes $STATE while holding the lock.
LOCK=$STATE.lock
OWNER_FILE=$STATE/owner
# How long `up`/`down` wait for another one to finish before refusing.
LOCK_WAIT=${ROCEFABRIC_E2E_LOCK_WAIT:-1800}
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
# The run's own cgroup: every component `start` starts, and what they fork (containerd's shims).
RUN_CGROUP=rocefabric-e2e-run
CONTAINERD_SOCK=$STATE/run/containerd.sock
CNI_BIN=${ROCEFABRIC_CNI_BIN:-/usr/lib/cni}
KUBECONFIG_ADMIN=$STATE/kubeconfig
# Fixed in the kubelet (pluginapi.DevicePluginPath), not under --root-dir.
DEVICE_PLUGIN_DIR=/var/lib/kubelet/device-plugins
# Where containerd reads CDI specs a DRA driver writes (the other, /etc/cdi, is configuration).
CDI_DIR=/var/run/cdi
# Directories outside $STATE that the node's components make: the CDI specs, the kubelet's device
# plugin directory and container log links, the CNI plugins' cache, pod network namespaces. `up`
# records those missing before it (`down` removes them then); host-snapshot lists their files.
HOST_DIRS=("$CDI_DIR" /var/lib/kubelet /var/lib/cni /var/log/containers /var/log/pods /run/netns)

# Kernel tunables the kubelet sets (protectKernelDefaults off); `down` puts them back from
# $SYSCTLS_FILE, written once per boot (its first line is the boot id).
SYSCTLS_FILE=$STATE/sysctls.boot
KUBELET_SYSCTLS=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)

# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)

say() { printf '== cluster: %s\n' "$*"; }
die() {
  printf '== cluster: FAILED: %s\n' "$*" >&2
  exit 1
}
# What `up`/`down` removed that an earlier run left or made, one line each.
removed() { say "removed $*"; }

# --- Resources -------------------------------------------------------------------------------

# require_room WHAT DISK_GIB MEM_GIB [DIR...]: refuse, with the figures, when a DIR's filesystem has
# less than DISK_GIB free or the machine less than MEM_GIB available (MemAvailable: there is no
# swap to fall back on).
require_room() {
  local what=$1 disk=$2 mem=$3 dir free avail
  shift 3
  avail=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
  [ "$avail" -ge "$mem" ] || die "$what needs $mem GiB of available memory, the machine has $avail GiB (a leftover VM or build?)"
  for dir in "$@"; do
    while [ ! -e "$dir" ]; do dir=$(dirname "$dir"); done
    free=$(df -P -k "$dir" | awk 'NR == 2 {print int($4 / 1048576)}')
    [ "$free" -ge "$disk" ] || die "$what needs $disk GiB free on $(df -P "$dir" | awk 'NR == 2 {print $6}') (for $dir), there are $free GiB (cargo clean? go clean -cache?)"
  done
}

# --- The lock and the owner ------------------------------------------------------------------

# A process's identity that survives pid reuse: "PID START" (START: its start time in clock ticks
# since boot, field 22 of /proc/PID/stat).
process_id() {
  local pid=$1 stat
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  # shellcheck disable=SC2086 # the fields after the command name: $1 is field 3
  set -- $stat
  echo "$pid ${20}"
}
pid_of_id() { echo "${1%% *}"; }
alive() { # "PID START"
  [ -n "$1" ] && [ "$(process_id "$(pid_of_id "$1")" 2>/dev/null)" = "$1" ]
}

# The run that owns a cluster this invocation starts: $ROCEFABRIC_E2E_OWNER (a pid; `.ci/run` sets
# its own), else the process that ran us, past sudo, timeout and the like. 1 means nobody: the
# cluster then stays until `down`.
owner_pid() {
  if [ -n "${ROCEFABRIC_E2E_OWNER:-}" ]; then
    echo "$ROCEFABRIC_E2E_OWNER"
    return 0
  fi
  local pid=$PPID comm
  while [ "$pid" -gt 1 ]; do
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || break
    case $comm in
      sudo | su | doas | timeout | env | setsid | nice | flock) pid=$(awk '{print $4}' "/proc/$pid/stat") ;;
      *) break ;;
    esac
  done
  echo "$pid"
}

owner_field() { sed -n "s/^$1=//p" "$OWNER_FILE" 2>/dev/null; }

# One line naming the owner recorded in $OWNER_FILE.
owner_text() {
  [ -f "$OWNER_FILE" ] || { echo "nobody"; return 0; }
  echo "checkout $(owner_field checkout), run pid $(pid_of_id "$(owner_field process)") ($(owner_field command)), since $(owner_field since)"
}

# Whether the recorded owner still runs (pid 1: kept until `down`).
owner_alive() {
  local id
  id=$(owner_field process)
  [ "$(pid_of_id "$id")" = 1 ] || alive "$id"
}

# write_owner PID: the run PID owns the cluster from now on.
write_owner() {
  local pid=$1 id command
  if [ "$pid" = 1 ]; then
    id="1 0"
  else
    id=$(process_id "$pid") || die "the owner, pid $pid, is not running"
  fi
  command=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120 || true)
  mkdir -p "$STATE"
  printf 'checkout=%s\nprocess=%s\ncommand=%s\nsince=%s\n' "$ROOT" "$id" "${command% }" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$OWNER_FILE.tmp"
  mv "$OWNER_FILE.tmp" "$OWNER_FILE"
}

# Refuse when a live run of another checkout owns the cluster (unless ROCEFABRIC_E2E_TAKEOVER=1).
refuse_foreign_owner() { # WHAT
  [ -f "$OWNER_FILE" ] || return 0
  [ "$(owner_field checkout)" = "$ROOT" ] && return 0
  owner_alive || return 0
  [ "${ROCEFABRIC_E2E_TAKEOVER:-0}" = 1 ] && return 0
  die "$1: the e2e cluster on this machine belongs to another run: $(owner_text). Wait for it to end, or run e2e/cluster/down in that checkout (ROCEFABRIC_E2E_TAKEOVER=1 takes it over)"
}

# take_lock WHAT: hold $LOCK until this process exits; while another holds it, say who and wait
# up to $LOCK_WAIT seconds, then refuse naming it.
take_lock() {
  local what=$1
  # `up` runs `down` with the lock held: the child inherits it.
  [ "${ROCEFABRIC_E2E_LOCK_HELD:-}" = "$PPID" ] && return 0
  mkdir -p "$(dirname "$LOCK")"
  # Root's alone: anyone who can open the lock can hold it, and stop every `up` and `down`.
  [ -e "$LOCK" ] || install -m 600 /dev/null "$LOCK"
  chmod 600 "$LOCK"
  exec 9<>"$LOCK"
  if ! flock -n 9; then
    say "waiting up to ${LOCK_WAIT}s for the e2e cluster's lock ($LOCK), held by: $(cat "$LOCK.holder" 2>/dev/null || echo unknown)"
    flock -w "$LOCK_WAIT" 9 \
      || die "$what: the e2e cluster's lock is still held after ${LOCK_WAIT}s, by: $(cat "$LOCK.holder" 2>/dev/null || echo unknown)"
  fi
  echo "$what from $ROOT, pid $$, since $(date -u +%H:%M:%SZ)" >"$LOCK.holder"
  export ROCEFABRIC_E2E_LOCK_HELD=$$
}

# --- The run's cgroup --------------------------------------------------------------------------

# The run's cgroup directory: in the unified hierarchy on cgroup v2, in the pids controller's on
# v1 (one hierarchy is enough to hold and list processes).
run_cgroup_dir() {
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    echo "/sys/fs/cgroup/$RUN_CGROUP"
  else
    echo "/sys/fs/cgroup/pids/$RUN_CGROUP"
  fi
}

# Move the calling (sub)shell into the run's cgroup; its children follow.
join_run_cgroup() {
  local dir
  dir=$(run_cgroup_dir)
  mkdir -p "$dir" 2>/dev/null || return 0
  echo "$BASHPID" >"$dir/cgroup.procs" 2>/dev/null || true
}

# Move the calling shell out of the run's cgroup (the reaper and `down`, which kill it).
leave_run_cgroup() {
  echo "$BASHPID" >"$(dirname "$(run_cgroup_dir)")/cgroup.procs" 2>/dev/null || true
}

# kill_cgroup_tree DIR...: SIGKILL every process in the cgroups under each DIR until none is left
# (one forked meanwhile is caught on the next pass); prints how many it killed.
kill_cgroup_tree() {
  local procs count=0
  for _ in $(seq 50); do
    procs=$(find "$@" -name cgroup.procs -exec cat {} + 2>/dev/null | grep -vx "$$" | sort -u || true)
    [ -n "$procs" ] || break
    count=$((count + $(wc -w <<<"$procs")))
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $procs 2>/dev/null || true
    sleep 0.2
  done
  echo "$count"
}

# --- Components --------------------------------------------------------------------------------

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

# Logs are capped: a log over this size is moved to NAME.log.1 (replacing the one before) when its
# component starts, so a component keeps at most about twice this much.
LOG_CAP_BYTES=$((64 << 20))
rotate_log() {
  local log=$1
  if [ -f "$log" ] && [ "$(stat -c %s "$log")" -gt "$LOG_CAP_BYTES" ]; then mv -f "$log" "$log.1"; fi
  return 0
}

# start NAME COMMAND...: run in its own session and in the run's cgroup, log to logs/NAME.log,
# remember the pid.
start() {
  local name=$1
  shift
  mkdir -p "$LOGS" "$PIDS"
  readlink -f "$(command -v "$1")" >"$PIDS/$name.exe"
  rotate_log "$LOGS/$name.log"
  (
    join_run_cgroup
    # fd 9 is the lock of the `up` that starts it: a component must not hold it.
    exec setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 9>&-
  ) &
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

# wait_for WHAT SECONDS COMMAND...: poll every half second, each try bounded to 30 s (a program
# under `timeout`; a function here bounds its own calls, as kubectl_admin and ctr_e2e do).
wait_for() {
  local what=$1 seconds=$2 bound=(timeout -k 2 30)
  shift 2
  local deadline=$((SECONDS + seconds))
  declare -F "$1" >/dev/null && bound=()
  until "${bound[@]}" "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "$what not within ${seconds}s (logs: $LOGS)"
    sleep 0.5
  done
}

# Every request bounded: a hung API server fails the call, not the run.
kubectl_admin() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" --request-timeout=30s "$@"; }

# The ctr built with our containerd (Debian's, if installed, is 1.6), on our socket, each call
# bounded by CTR_TIMEOUT. Quiet about deprecations: on a cgroup v1 host every call would warn that
# containerd 2.2 deprecates v1 (its log says so once).
CTR_TIMEOUT=${CTR_TIMEOUT:-60s}
ctr_e2e() {
  CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=true "$BIN/ctr" --address "$CONTAINERD_SOCK" \
    --timeout "$CTR_TIMEOUT" "$@"
}
