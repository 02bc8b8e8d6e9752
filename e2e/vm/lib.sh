# Shared by e2e/vm/build and e2e/vm/boot. Sourced, not run.
set -euo pipefail

VM_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$VM_DIR/../.." && pwd)
OUT=$ROOT/target/vm

say() { printf '== vm: %s\n' "$*" >&2; }
die() {
  printf '== vm: FAILED: %s\n' "$*" >&2
  exit 1
}

# newc DIR: DIR's tree as a newc cpio archive on stdout, every entry owned by root (the kernel
# unpacks concatenated archives in order, so a per-run archive can be appended to base.cpio).
# GNU cpio when installed, else busybox's (Debian's busybox-static can write newc).
newc() {
  local tool=(busybox cpio -o -H newc -R 0:0)
  command -v cpio >/dev/null && tool=(cpio --quiet -o -H newc -R 0:0)
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort | "${tool[@]}")
}
