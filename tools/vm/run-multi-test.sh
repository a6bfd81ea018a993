#!/bin/bash
# tools/vm/run-multi-test.sh [--out DIR] [--daemon PATH] [--b-ramfs] [--unplug guest|request]
#
# One daemon, two functions, one QEMU with two vfio-user-pci devices (issue 14): function A a
# RAM filesystem, function B a shared directory beneath the profile's sandbox_root (the
# daemon confined as a --shared-dir daemon is, when run as root). The guest (guest/multi.sh)
# mounts both tags, checks that neither sees the other's files and runs fsx on both at once; the
# host then removes function B through the control socket (delete_function) while the guest
# writes on A, and checks from the control socket that A served requests after B was gone and
# that each function's statistics counted its own fsx; B's file must be on the host directory and
# A's not. Exit status 0 on success.
# --unplug request: B stays mounted; delete_function alone removes it from the guest: B's device
# sends its device-request interrupt, QEMU asks the guest to unplug B's PCI function (each device
# sits behind a pcie-root-port, a hot-pluggable slot; q35's ACPI hot-plug), the guest's driver
# drains and resets it, QEMU drops the device and hangs up, and delete_function answers "client
# released it"; the guest checks that B's PCI function went, that B's mount fails rather than
# hangs, and that A keeps serving; the host checks over QMP that QEMU no longer has the device.
# It needs a QEMU whose vfio-user-pci sets the device-request eventfd and survives an unplug:
# 11.1 does neither (no GET_IRQ_INFO of index 4 on the wire, vfio-pci's x-req feature bit is not
# set for vfio-user-pci; its unplug, by device_del too, aborts in memory_region_del_subregion).
# --unplug guest (the default, for such a QEMU): the guest unmounts B and removes B's PCI function
# itself first; delete_function then disconnects QEMU at once (no device-request eventfd).
# --b-ramfs: function B is a RAM filesystem too (no shared directory, no sandbox), for a daemon
# that cannot serve one: the DPU build under qemu-user, which lacks openat2 (ci.sh's dpu stage,
# --daemon a wrapper that runs the aarch64 daemon under qemu-aarch64); the host-side checks of
# B's directory are then left out, the guest's isolation checks stay.
# Logs in OUT: daemon.log, console.log, run.txt, stats-*.json.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
. "$HERE/host-lib.sh"
DAEMON=${VFDPU_DAEMON:-$REPO/target/release/virtiofs-dpu}
OUT=${VM_OUT:-}
B_RAMFS=0
UNPLUG=${MULTI_UNPLUG:-guest}
while [ $# -gt 0 ]; do
  case $1 in
    --unplug) UNPLUG=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --b-ramfs) B_RAMFS=1; shift ;;
    *) echo "run-multi-test: unknown argument $1" >&2; exit 2 ;;
  esac
done
case $UNPLUG in guest|request) ;; *) echo "run-multi-test: --unplug guest or request" >&2; exit 2 ;; esac
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/vm-multi.XXXXXX)
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
log() { echo "[multi-test $(date +%T)] $*" | tee -a "$OUT/run.txt" >&2; }
: > "$OUT/run.txt"
W=$(mktemp -d /tmp/vfdpu-multi.XXXXXX)
mkdir -p "$W/root/share"
DPID=""; GPID=""
cleanup() {
  local rc=$?
  [ -z "$GPID" ] || { kill -TERM "$GPID" 2>/dev/null || true; wait "$GPID" 2>/dev/null || true; }
  [ -z "$DPID" ] || { kill -KILL "$DPID" 2>/dev/null || true; wait "$DPID" 2>/dev/null || true; }
  rm -rf "$W"
  return $rc
}
trap cleanup EXIT
SA=$W/a.sock SB=$W/b.sock CTL=$W/ctl.sock
if [ "$B_RAMFS" = 1 ]; then
  B_BACKEND='ramfs_size = "256M"'
  ROOT_LINE=""
else
  B_BACKEND="shared_dir = \"$W/root/share\""
  ROOT_LINE="sandbox_root = \"$W/root\""
fi
cat > "$W/multi.toml" <<TOML
description = "two functions, one poller"
request_queues = 1
$ROOT_LINE

[[function]]
socket_path = "$SA"
tag = "vfa"
ramfs_size = "256M"

[[function]]
socket_path = "$SB"
tag = "vfb"
$B_BACKEND
TOML
"$DAEMON" --config "$W/multi.toml" --control-socket "$CTL" < /dev/null > "$OUT/daemon.log" 2>&1 &
DPID=$!
wait_sockets 300 "$SA" "$SB" "$CTL" || { log "daemon never created its sockets"; cat "$OUT/daemon.log" >&2; exit 3; }
log "daemon up (pid $DPID): $(grep -o 'starting .*' "$OUT/daemon.log" | head -1)"
rpc() { ctl_rpc "$CTL" "$1"; }
stat() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }

# Each device behind a root port of its own: devices on pcie.0 cannot be hot-unplugged.
QMP=$W/qmp.sock
WAIT_S=5
[ "$UNPLUG" = request ] && WAIT_S=20
bash "$HERE/run-guest.sh" --log "$OUT/console.log" --timeout "${VM_TIMEOUT:-600}" \
  -e VM_TAG_A=vfa -e VM_TAG_B=vfb -e "FSX_OPS=${MULTI_FSX_OPS:-5000}" -e "MULTI_WAIT_S=$WAIT_S" \
  -e "MULTI_UNPLUG=$UNPLUG" \
  "$HERE/guest/multi.sh" -- -qmp "unix:$QMP,server=on,wait=off" \
  -device pcie-root-port,id=rpa,chassis=1,slot=1 -device pcie-root-port,id=rpb,chassis=2,slot=2 \
  -device "$(vfu_device "$SA" rpa fa)" -device "$(vfu_device "$SB" rpb fb)" &
GPID=$!
# qmp COMMAND [ARGUMENTS [EVENT]]: QEMU's answer to one QMP command (after the capabilities
# handshake); with EVENT, waits (at most 30 s) for that event too and prints it after.
qmp() { python3 - "$QMP" "$1" "${2:-{\}}" "${3:-}" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(30); s.connect(sys.argv[1]); f = s.makefile("rw")
seen = []
def answer():
    while True:
        m = json.loads(f.readline())
        if "return" in m or "error" in m: return m
        seen.append(m)
f.readline(); f.write(json.dumps({"execute": "qmp_capabilities"}) + "\n"); f.flush(); answer()
f.write(json.dumps({"execute": sys.argv[2], "arguments": json.loads(sys.argv[3])}) + "\n"); f.flush()
print(json.dumps(answer()))
if sys.argv[4]:
    while not any(e.get("event") == sys.argv[4] for e in seen):
        seen.append(json.loads(f.readline()))
    print(json.dumps([e for e in seen if e.get("event") == sys.argv[4]][0]))
PY
}
# devices_on BUS_ID: the ids (qdev_id) of the devices QEMU has behind that root port.
devices_on() { qmp query-pci | python3 -c '
import json, sys
def walk(devs):
    for d in devs:
        yield d
        yield from walk(d.get("pci_bridge", {}).get("devices", []))
out = []
for bus in json.load(sys.stdin)["return"]:
    for d in walk(bus["devices"]):
        if d.get("qdev_id") == sys.argv[1]:
            out += [x.get("qdev_id", "?") for x in d.get("pci_bridge", {}).get("devices", [])]
print(" ".join(out))' "$1"; }
wait_console() {
  for _ in $(seq 6000); do
    grep -aq "^MULTI: $1" "$OUT/console.log" 2>/dev/null && return 0
    kill -0 "$GPID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
fail=0
if wait_console b-ready; then
  [ "$UNPLUG" = guest ] || log "QEMU's devices behind B's root port before: $(devices_on rpb)"
  rpc '{"jsonrpc":"2.0","method":"get_stats","params":{"tag":"vfa"},"id":1}' > "$OUT/stats-a-before.json"
  rpc '{"jsonrpc":"2.0","method":"get_stats","params":{"tag":"vfb"},"id":2}' > "$OUT/stats-b.json"
  since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b-a}'; }
  # Whether QEMU set B's device-request eventfd (what --unplug request needs).
  asked=$(rpc '{"jsonrpc":"2.0","method":"list_functions","id":6}' | python3 -c '
import json, sys
print(next(f["client"].get("removal_interrupt", False) for f in json.load(sys.stdin)["result"] if f["tag"] == "vfb"))')
  log "B's client set the device-request eventfd: $asked"
  t0=$(date +%s.%N)
  r=$(rpc '{"jsonrpc":"2.0","method":"delete_function","params":{"tag":"vfb"},"id":3}')
  log "delete_function vfb ($(since "$t0") s): $r"
  case $UNPLUG:$r in
    request:*'"removed":"client released it"'*) ;;
    guest:*'"result"'*) ;;
    *) log "FAIL: delete_function (--unplug $UNPLUG)"; fail=1 ;;
  esac
  # The socket is closed (a sandboxed daemon cannot remove its file, see DESIGN.md): a connect
  # must be refused.
  if python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])' "$SB" 2>/dev/null; then
    log "FAIL: B's socket still accepts connections"; fail=1
  fi
  if [ "$UNPLUG" = request ]; then
    left=$(devices_on rpb)
    log "QEMU's devices behind B's root port after: ${left:-none}"
    [ -z "$left" ] || { log "FAIL: QEMU still has B's device"; fail=1; }
  fi
  if wait_console b-gone; then
    kill -0 "$GPID" 2>/dev/null || { log "FAIL: QEMU ended when function B went away"; fail=1; }
    rpc '{"jsonrpc":"2.0","method":"get_stats","params":{"tag":"vfa"},"id":4}' > "$OUT/stats-a-after.json"
    rpc '{"jsonrpc":"2.0","method":"list_functions","id":5}' > "$OUT/list.json"
  else
    log "FAIL: the guest never saw B go"; fail=1
  fi
else
  log "FAIL: the guest never got B ready for removal"; fail=1
fi
set +e
wait "$GPID"; grc=$?
set -e
GPID=""
log "guest rc=$grc"
[ "$grc" = 0 ] || fail=1
if [ -s "$OUT/stats-a-after.json" ]; then
  writes() { stat "$1" 'sum(c["requests"] for c in s["result"]["device"]["classes"] if c["class"] == "write")'; }
  wa=$(writes "$OUT/stats-a-before.json"); wa2=$(writes "$OUT/stats-a-after.json"); wb=$(writes "$OUT/stats-b.json")
  n=$(stat "$OUT/list.json" 'len(s["result"])')
  log "writes: A ${wa} before B's removal, ${wa2} after; B ${wb}; functions left: $n"
  [ "$wa2" -gt "$wa" ] || { log "FAIL: A served no write after B was removed"; fail=1; }
  [ "$wb" -gt 0 ] || { log "FAIL: B counted no write"; fail=1; }
  [ "$n" = 1 ] || { log "FAIL: list_functions shows $n functions"; fail=1; }
fi
if [ "$B_RAMFS" = 0 ]; then
  [ "$(cat "$W/root/share/only-b" 2>/dev/null)" = "from b" ] || { log "FAIL: B's file is not in its shared directory"; fail=1; }
  [ ! -e "$W/root/share/only-a" ] || { log "FAIL: A's file is in B's directory"; fail=1; }
fi
kill -TERM "$DPID"
set +e
wait "$DPID"; drc=$?
set -e
DPID=""
log "daemon exit status $drc"
[ "$drc" = 0 ] || fail=1
[ "$fail" = 0 ] && log "multi-function stage: ok" || log "multi-function stage: FAILED"
exit "$fail"
