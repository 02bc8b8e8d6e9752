//! The two VMs' shell scenarios: the pods' network namespaces, their session scripts (one command
//! per line, answered in JSON), and the one-shot steps (CLI data, intruders, a killed holder).

use std::collections::BTreeMap;

use rocefabric_e2e::vm::SHELL_PRELUDE;

use super::{B1_NEW, PERF_ROUNDS, PODS, Planned};

/// Shell functions this suite's scenarios add to [`SHELL_PRELUDE`].
const PRELUDE: &str = r#"
D=$B/rocefabric-dsm
# The RoCE v2 GID of the IPv4 address (what the device plugin hands out as NCCL_IB_GID_INDEX).
roce_v2_ipv4_gid() {
  p=/sys/class/infiniband/rxe0/ports/1
  for i in 0 1 2 3 4 5 6 7; do
    case "$(cat $p/gid_attrs/types/$i 2>/dev/null):$(cat $p/gids/$i)" in
      "RoCE v2:0000:0000:0000:0000:0000:ffff:"*) echo $i; return 0 ;;
    esac
  done
  return 1
}
# pod NAME IP: a network namespace with a veth to the VM, routed like a CNI does (/32 + gateway).
pod() {
  $IP netns add $1
  $IP link add h-$1 type veth peer name eth0 netns $1
  $IP addr add 10.88.0.1/32 dev h-$1 && $IP link set h-$1 up && $IP route add $2/32 dev h-$1
  $IP -n $1 link set lo up && $IP -n $1 link set eth0 up && $IP -n $1 addr add $2/32 dev eth0
  $IP -n $1 route add 10.88.0.1 dev eth0 && $IP -n $1 route add default via 10.88.0.1
}
# session NAME UID: the pod's session in its namespace, commands from /tmp/dsm/NAME.in.
session() {
  POD_NAME=$1 POD_UID=$2 ROCEFABRIC_REGION_FILE=/tmp/dsm/$1.region \
    $IP netns exec ${3:-$1} $D session </tmp/dsm/$1.in >/tmp/dsm/$1.out 2>/tmp/dsm/$1.err
}
# cli_data UID: a1's one-shot commands move real data into b2's window (idle by then): a file
# and stdin written, read back to a file and to stdout; stdin longer than the window refused.
cli_data() {
  A="env POD_NAME=a1 POD_UID=$1 ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region $IP netns exec a1 $D"
  seq 1 70000 >/tmp/in.txt
  $A write --addr b2+0x10000 --file /tmp/in.txt || return 1
  $A read --addr b2+0x10000 --len $(stat -c %s /tmp/in.txt) --out /tmp/out.txt || return 2
  cmp /tmp/in.txt /tmp/out.txt && echo "file round trip: same"
  $A write --addr b2+0x80000 --file - </tmp/in.txt || return 3
  $A read --addr b2+0x80000 --len $(stat -c %s /tmp/in.txt) --out - >/tmp/stdout.txt || return 4
  cmp /tmp/in.txt /tmp/stdout.txt && echo "stdin and stdout round trip: same"
  head -c 2200000 /dev/zero | $A write --addr b2+0x1000 --file -; echo "too long: exit $?"
  $A read --addr b2+0x10000 --len 6
}
# intruder UID: a process on vm-a (10.88.1.9) that copied a1's name, uid and region file from
# the directory reads b2's window: first holding another namespace's key (a pod of namespace
# "other"), then a forged key in the fabric's namespace. Both must be refused, saying why.
intruder() {
  pod x1 10.88.1.9 || return 1
  mkdir -p /tmp/dsm/other /tmp/dsm/forged
  printf '%s' 'another-namespace-fabric-key-32b' >/tmp/dsm/other/key && echo other >/tmp/dsm/other/namespace
  printf '%s' 'a-forged-key-in-the-same-ns-32by' >/tmp/dsm/forged/key && echo default >/tmp/dsm/forged/namespace
  env POD_NAME=a1 POD_UID=$1 ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region $IP netns exec a1 $D \
    read --addr b2+0x10000 --len 64 >/tmp/dsm/b2-before || return 2
  for k in other forged; do
    env POD_NAME=a1 POD_UID=$1 ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region ROCEFABRIC_KEY_DIR=/tmp/dsm/$k \
      $IP netns exec x1 $D write --addr b2+0x10000 --word 0x5a5a5a5a
    echo "intruder with the $k key: exit $?"
  done
}
# crossing A1UID B2UID: after the intruder, x1 crosses b2's rendezvous as nobody may: a hello
# naming another fabric, one without b2's uid, a slow loris (while a1 is served), 1,000 silent
# connects from 12 addresses (b2 serves 64 connections at once: under TCG its default 256 is
# more than the silent ones the handshake deadline lets pile up); then a1 opens 40 member
# connections from its one address at once. b2's window must be unchanged by all of it.
crossing() {
  A="env POD_NAME=a1 POD_UID=$1 ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region $IP netns exec a1"
  X="$IP netns exec x1 $B/rocefabric-dsm-crossing"
  O="--to 10.88.2.3:18516"
  echo "other fabric: $($X hello $O --fabric other --namespace default --from-pod a1 --from-uid $1 --to-pod b2 --to-uid $2)"
  echo "no uid: $($X hello $O --fabric dsm --namespace default --from-pod a1 --from-uid $1 --to-pod b2)"
  $X loris $O >/tmp/dsm/loris.out 2>&1 & L=$!
  sleep 1
  $A $D read --addr b2+0x10000 --len 8 >/dev/null && echo "member served at $(date +%s%3N)"
  wait $L; echo "loris answered at $(date +%s%3N): $(cat /tmp/dsm/loris.out)"
  S=
  for i in $(seq 10 21); do
    $IP -n x1 addr add 10.88.1.$i/32 dev eth0 && $IP route add 10.88.1.$i/32 dev h-x1 || return 1
    S=$S${S:+,}10.88.1.$i
  done
  ulimit -n 4096
  echo "flood: $($X flood $O --count 1000 --sources $S)"
  echo "members: $($A $B/rocefabric-dsm-crossing members --addr b2+0x10000 --count 40 --hold-ms 3000)"
  $A $D read --addr b2+0x10000 --len 64 >/tmp/dsm/b2-after || return 2
  cmp -s /tmp/dsm/b2-before /tmp/dsm/b2-after && echo "b2's window: unchanged"
}
# sample NAME: the pod's rocefabric-dsm process, sampled until it exits: "THREADS QUEUE_PAIRS"
# (rdma's restrack names a queue pair by the thread that made it: an owner's are its peer threads').
sample() {
  p=; i=0
  until [ -n "$p" ]; do
    for e in /proc/[0-9]*/environ; do
      q=${e#/proc/}; q=${q%/environ}
      [ "$(cat /proc/$q/comm 2>/dev/null)" = rocefabric-dsm ] && grep -qxz "POD_NAME=$1" $e 2>/dev/null && p=$q
    done
    i=$((i+1)); [ $i -gt 100 ] && return 1; sleep 0.1
  done
  while [ -d /proc/$p ]; do
    t=$(awk '/^Threads/{print $2}' /proc/$p/status 2>/dev/null) || break
    echo "$t $(/usr/sbin/rdma res show qp 2>/dev/null | awk -v tids="$(ls /proc/$p/task 2>/dev/null | tr '\n' ' ')" \
      'BEGIN {n = split(tids, a); for (i = 1; i <= n; i++) s[a[i]] = 1}
       {for (i = 1; i < NF; i++) if ($i == "pid" && ($(i + 1) in s)) c++} END {print c + 0}')"
    sleep 0.2
  done
}
# dead_holder A1UID A2UID: a2's process takes the lock word in b2's window and is killed (-9)
# holding it; a1 then takes the lock, which it may only break after the lease (10 s).
dead_holder() {
  A1="env POD_NAME=a1 POD_UID=$1 ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region $IP netns exec a1 $D"
  echo "hold-lock b2+0x100200 600000" | env POD_NAME=a2 POD_UID=$2 ROCEFABRIC_REGION_FILE=/tmp/dsm/a2.region \
    $IP netns exec a2 $D session >/tmp/dsm/holder.out 2>&1 &
  H=$!
  i=0; w=0000000000000000
  while [ "$w" = 0000000000000000 ]; do
    i=$((i+1)); [ $i -gt 300 ] && { kill -9 $H; return 1; }
    sleep 0.2; w=$($A1 read --addr b2+0x100200 --len 8) || { kill -9 $H; return 2; }
  done
  echo "held: $w"
  kill -9 $H; wait $H 2>/dev/null
  # Through cat: on the VM's console the log would be coloured.
  echo "locked-write b2+0x100200 b2+0x100240 8 1 21" | $A1 session 2>&1 | cat
}
# set_directory FILE: replace the mounted directory atomically, as the kubelet does.
set_directory() { cp "$1" /tmp/dsm/regions.tmp && mv /tmp/dsm/regions.tmp /tmp/dsm/regions.json; }
mkdir -p /tmp/dsm/key
# The fabric key both VMs' pods hold (the operator's <fabric>-key Secret, mounted).
printf '%s' 'rocefabric-e2e-fabric-key-32-byt' >/tmp/dsm/key/key && echo default >/tmp/dsm/key/namespace
export NCCL_IB_HCA==rxe0:1 NCCL_IB_TC=106 ROCEFABRIC_DIRECTORY=/tmp/dsm/regions.json ROCEFABRIC_LOG=warn
export ROCEFABRIC_KEY_DIR=/tmp/dsm/key
"#;

/// `cat > PATH` of `text` as a here-document.
fn file(path: &str, text: &str) -> String {
    format!(
        "cat >{path} <<'ROCEFABRIC_EOF'\n{}\nROCEFABRIC_EOF\n",
        text.trim_end()
    )
}

// Offsets inside a window: the counter, the lock and its record, flags for the steps.
const COUNTER: &str = "0x100000";
const LOCK: &str = "0x100008";
const RECORD: &str = "0x100040";

fn scripts() -> BTreeMap<&'static str, String> {
    let lock_phase = |verb: &str, id: u32| {
        format!("locked-{verb} b1+{LOCK} b1+{RECORD} 8 200 {id}\nadd b1+0x1f0018 1\n")
    };
    let adds = format!("add b1+{COUNTER} 1 10000\nadd b1+0x1f0010 1\n");
    let mut s = BTreeMap::new();
    s.insert(
        "a1",
        format!(
            "reach b1\nstats\nread b1+0x1ffff8 16\nread 0x7fff000000 8\nwrite b1+0x1fffff 2 1\ncas b1+0x4 0 1\nstats\n\
             write b1 1048576 7\nread b1 1048576 7\nwrite-word b1+0x1f0000 1\n{adds}{}\
             wait-local 0x1f0020 1 300000\nwrite b1+0x1000 8 8\necho swap\nsleep 3000\n\
             reach b1 120000\nwrite b1+0x1000 8 9\nwrite-word b1+0x1f0008 1\nstats\n",
            lock_phase("write", 11)
        ),
    );
    s.insert("a2", format!("reach b1\n{adds}{}", lock_phase("read", 12)));
    s.insert(
        "b1",
        format!(
            "wait-local 0x1f0000 1 300000\nstats\ncheck-local 0 1048576 7\n{adds}\
             wait-local 0x1f0010 4 300000\nwait-local {COUNTER} 40000 1000\nread-word b1+{COUNTER}\n{}\
             wait-local 0x1f0018 4 300000\n",
            lock_phase("read", 13)
        ),
    );
    s.insert(
        "b2",
        format!(
            "reach b1\n{adds}{}wait-local 0x1f0030 1 600000\n",
            lock_phase("write", 14)
        ),
    );
    s.insert(
        "b1-new",
        "wait-local 0x1f0008 1 300000\ncheck-local 0x1000 8 9\nstats\n".to_string(),
    );
    s
}

pub(super) fn scenario(a_side: bool, p: &Planned) -> String {
    let scripts = scripts();
    let mut out = format!("{SHELL_PRELUDE}{PRELUDE}");
    out += &file("/tmp/dsm/dir1.json", &p.directory);
    out += &file("/tmp/dsm/dir2.json", &p.directory_after);
    out += "set_directory /tmp/dsm/dir1.json\n";
    let (me, peer_n, peer_net, mine): (u8, u8, &str, &[&str]) = if a_side {
        (1, 2, "10.88.2.0/24", &["a1", "a2"])
    } else {
        (2, 1, "10.88.1.0/24", &["b1", "b2"])
    };
    out += &format!(
        "section rxe rxe_up 10.77.0.{me}/24 || exit 10\nGID=$(roce_v2_ipv4_gid) || exit 11\nexport NCCL_IB_GID_INDEX=$GID\n\
         section gid echo $GID\necho 1 >/proc/sys/net/ipv4/ip_forward\n$IP route add {peer_net} via 10.77.0.{peer_n}\n"
    );
    for (name, _, ip, _) in PODS.iter().filter(|p| mine.contains(&p.0)) {
        out += &format!("pod {name} {ip} || exit 12\n");
        out += &file(&format!("/tmp/dsm/{name}.region"), &p.annotations[*name]);
        out += &file(&format!("/tmp/dsm/{name}.in"), &scripts[name]);
    }
    let uid = |n: &str| {
        PODS.iter()
            .find(|p| p.0 == n)
            .map(|p| p.3)
            .unwrap_or_default()
    };
    if a_side {
        out += &format!(
            "session a1 {} & A1=$!\nsession a2 {} & A2=$!\n\
             i=0; until grep -q '\"text\":\"swap\"' /tmp/dsm/a1.out 2>/dev/null; do i=$((i+1)); [ $i -gt 3000 ] && break; sleep 0.1; done\n\
             set_directory /tmp/dsm/dir2.json\nwait $A1; wait $A2\n\
             section a1 cat /tmp/dsm/a1.out /tmp/dsm/a1.err\nsection a2 cat /tmp/dsm/a2.out /tmp/dsm/a2.err\n\
             for round in $(seq {PERF_ROUNDS}); do\n\
             section probe-$round env POD_NAME=a1 POD_UID={a1} ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region $IP netns exec a1 $D probe --peers b2 --write --iterations 300 --requests 256 --output json\n\
             i=0; until ib_read_lat -d rxe0 -x $GID -n 300 10.77.0.2 >/tmp/lat 2>&1; do i=$((i+1)); [ $i -gt 60 ] && break; sleep 1; done\n\
             section read-lat-$round cat /tmp/lat\n\
             i=0; until ib_write_bw -d rxe0 -x $GID -n 256 -s 65536 -F 10.77.0.2 >/tmp/bw 2>&1; do i=$((i+1)); [ $i -gt 60 ] && break; sleep 1; done\n\
             section write-bw-$round cat /tmp/bw\n\
             done\n\
             section cli-data cli_data {a1}\n\
             section intruder intruder {a1}\n\
             section crossing crossing {a1} {b2}\n\
             section dead-holder dead_holder {a1} {a2}\n\
             section release env POD_NAME=a1 POD_UID={a1} ROCEFABRIC_REGION_FILE=/tmp/dsm/a1.region $IP netns exec a1 $D write --addr b2+0x1f0030 --word 1\n\
             {pinning}\
             exit 0\n",
            uid("a1"),
            uid("a2"),
            a1 = uid("a1"),
            a2 = uid("a2"),
            b2 = uid("b2"),
            pinning = super::pinning::SCENARIO,
        );
    } else {
        out += &format!("pod b1n {} || exit 12\n", B1_NEW.2);
        out += &file("/tmp/dsm/b1-new.region", &p.b1_new);
        out += &file("/tmp/dsm/b1-new.in", &scripts["b1-new"]);
        out += &format!(
            "session b1 {} & B1=$!\n(unset ROCEFABRIC_LOG; ROCEFABRIC_DSM_MAX_PEERS=64 session b2 {}) & B2=$!\n\
             sample b2 >/tmp/dsm/b2.samples 2>&1 &\nwait $B1\n\
             set_directory /tmp/dsm/dir2.json\n\
             env -u ROCEFABRIC_LOG POD_NAME=b1 POD_UID={} ROCEFABRIC_REGION_FILE=/tmp/dsm/b1-new.region $IP netns exec b1n $D session \
               </tmp/dsm/b1-new.in >/tmp/dsm/b1-new.out 2>/tmp/dsm/b1-new.err & BN=$!\n\
             section old-b1-gone env POD_NAME=b2 POD_UID={} ROCEFABRIC_REGION_FILE=/tmp/dsm/b2.region $IP netns exec b2 $D write --addr a1+0x1f0020 --word 1\n\
             wait $BN\n\
             for round in $(seq {PERF_ROUNDS}); do\n\
             section lat-server-$round timeout 120 ib_read_lat -d rxe0 -x $GID -n 300\n\
             section bw-server-$round timeout 120 ib_write_bw -d rxe0 -x $GID -n 256 -s 65536 -F\n\
             done\n\
             wait $B2\n\
             section b1 cat /tmp/dsm/b1.out /tmp/dsm/b1.err\nsection b2 cat /tmp/dsm/b2.out /tmp/dsm/b2.err\n\
             section b1-new cat /tmp/dsm/b1-new.out /tmp/dsm/b1-new.err\n\
             section b2-peaks awk '{{if ($1>t) t=$1; if ($2>q) q=$2}} END {{print \"threads\", t+0, \"queue-pairs\", q+0, \"samples\", NR}}' /tmp/dsm/b2.samples\nexit 0\n",
            uid("b1"),
            uid("b2"),
            B1_NEW.3,
            uid("b2"),
        );
    }
    out
}
