#!/usr/bin/env bash
# tools/seccomp-trace.sh [--vm] [OUT_DIR]: which system calls the passthrough daemon makes once it
# serves, to check the seccomp allowlist (backend/src/passthrough/seccomp.rs) against.
#
# Runs the release daemon (sandbox on, --seccomp=off) under `strace -f`, drives it with
# virtiofs-bench (READ/WRITE/...) and, with --vm, with the guest suites (pjdfstest, fsx,
# escape.sh) through tools/vm/run-device-test.sh, then lists the calls made after the daemon
# dropped its capabilities (its one capset(2), right before the filter would be installed), with
# counts, and those of them the allowlist lacks. Needs root and strace (apt-get install strace).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VM=0
if [ "${1:-}" = --vm ]; then VM=1; shift; fi
OUT=${1:-$(mktemp -d /tmp/vfdpu-seccomp.XXXXXX)}
mkdir -p "$OUT"
command -v strace >/dev/null || { echo "strace not installed (apt-get install strace)"; exit 2; }
(cd "$REPO" && cargo build --release -q --bin virtiofs-dpu -p virtiofs-dpu && cargo build --release -q -p virtiofs-bench)
TARGET=$(cd "$REPO" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
DAEMON=$TARGET/release/virtiofs-dpu
SHARE=$OUT/share
mkdir -p "$SHARE"
mountpoint -q "$SHARE" || mount -t tmpfs -o size=1g,mode=0777 tmpfs "$SHARE"
trap 'umount -l "$SHARE" 2>/dev/null || true' EXIT

# A wrapper the harness can start as "the daemon": strace writes one file per process tree.
WRAP=$OUT/traced-daemon.sh
# strace does not pass SIGTERM on to its tracee: the wrapper forwards it to the daemon.
cat > "$WRAP" <<W
#!/bin/bash
strace -f -qq -o "$OUT/trace.\$\$" "$DAEMON" "\$@" --seccomp off &
spid=\$!
fwd() { for p in \$(pgrep -P "\$spid"); do kill -TERM "\$p"; done; }
trap fwd TERM INT
wait "\$spid"; rc=\$?
if [ \$rc -gt 128 ]; then wait "\$spid"; rc=\$?; fi
exit \$rc
W
chmod +x "$WRAP"

SOCKDIR=$(mktemp -d /tmp/vfdpu-sock.XXXXXX)
echo "== virtiofs-bench against the traced daemon"
"$WRAP" --socket-path "$SOCKDIR/d.sock" --shared-dir "$SHARE" > "$OUT/bench-daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do grep -q "listening on" "$OUT/bench-daemon.log" 2>/dev/null && break; sleep 0.1; done
"$TARGET/release/virtiofs-bench" --socket-path "$SOCKDIR/d.sock" --duration 0.3 --file-mib 8 > "$OUT/bench.txt" 2>&1 || echo "bench failed (see $OUT/bench.txt)"
kill -TERM "$DPID" 2>/dev/null || true
wait "$DPID" 2>/dev/null || true
rm -rf "$SOCKDIR"

if [ $VM = 1 ]; then
  echo "== guest suites against the traced daemon"
  VFDPU_DAEMON=$WRAP DAEMON_STOP_TIMEOUT=60 bash "$REPO/tools/vm/run-device-test.sh" --out "$OUT/vm" \
    --daemon-arg --shared-dir --daemon-arg "$SHARE" -e FSX_OPS="${FSX_OPS:-20000}" \
    -e VM_SUITES="pjdfstest fsx escape" "$REPO/tools/vm/guest/all.sh" || echo "guest suites failed (see $OUT/vm)"
fi

# Calls after the capset, per trace file (each starts with the daemon's own startup).
python3 - "$OUT" "$REPO/backend/src/passthrough/seccomp.rs" <<'PY'
import collections, glob, re, sys
out, src = sys.argv[1], sys.argv[2]
seen = collections.Counter()
for path in sorted(glob.glob(out + "/trace.*")):
    on = False
    for line in open(path, errors="replace"):
        if not on:
            on = re.match(r"^\d+\s+capset\(", line) is not None
            continue
        m = re.match(r"^\d+\s+([a-z0-9_]+)\(", line)
        if m:
            seen[m.group(1)] += 1
allowed = set(re.findall(r"allow!\(\s*l,\s*SYS_([a-z0-9_]+)", open(src).read()))
print("system calls after the filter point (calls, name):")
for name, n in sorted(seen.items(), key=lambda kv: -kv[1]):
    print(f"{n:>10}  {name}{'' if name in allowed else '   <-- NOT IN THE ALLOWLIST'}")
missing = sorted(set(seen) - allowed)
unused = sorted(allowed - set(seen))
print("missing from the allowlist:", " ".join(missing) or "none")
print("allowed but not seen:", " ".join(unused) or "none")
PY
