#!/usr/bin/env bash
# Live update across versions (issue 22): a binary must take over from the previous release
# and hand back to it. Builds revision REV (a tag or commit) in a temporary worktree, starts
# its daemon with --live-update (one RAM filesystem function), runs the driver model's I/O
# against it, and updates back and forth between REV's binary and this tree's ROUNDS times
# each way. Passes when every update answers, the driver saw no failed request, and no
# process logged an error. Not part of CI (it builds a second tree); run it before a release
# against the previous release's tag:
#
#   tools/check-update-compat.sh v0.1.0 [ROUNDS]
set -euo pipefail

REV=${1:?usage: tools/check-update-compat.sh REV [ROUNDS]}
ROUNDS=${2:-3}
root=$(git rev-parse --show-toplevel)
work=$(mktemp -d)
daemon=
cleanup() {
    [[ -n $daemon ]] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
    git -C "$root" worktree remove --force "$work/tree" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "== building $REV (its own target directory) and this tree"
git -C "$root" worktree add --detach "$work/tree" "$REV" >/dev/null
CARGO_TARGET_DIR="$work/target" cargo build --quiet --release \
    --manifest-path "$work/tree/Cargo.toml" -p virtiofs-dpu
(cd "$root" && cargo build --quiet --release -p virtiofs-dpu -p virtiofs-bench)
mkdir "$work/bin"
cp "$work/target/release/virtiofs-dpu" "$work/bin/previous"
cp "$root/target/release/virtiofs-dpu" "$work/bin/current"
cmp -s "$work/bin/previous" "$work/bin/current" && echo "note: the two binaries are the same"

sock=$work/fn.sock
ctl=$work/ctl
"$work/bin/previous" --socket-path "$sock" --control-socket "$ctl" --live-update \
    --update-binary-dir "$work/bin" --log-level info >"$work/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 50); do [[ -S $sock && -S $ctl ]] && break; sleep 0.1; done
[[ -S $sock ]] || { cat "$work/daemon.log"; echo "FAIL: $REV's daemon did not start"; exit 1; }

# The phase list at a short duration: QD=1 and deep queues, reads and writes, for the whole run.
"$root/target/release/virtiofs-bench" --socket-path "$sock" --duration 1 --rounds 2 \
    >"$work/bench.txt" 2>&1 &
bench=$!
sleep 1
for i in $(seq "$ROUNDS"); do
    for to in current previous; do
        answer=$("$root/target/release/virtiofs-dpu" update --control-socket "$ctl" \
            --binary "$work/bin/$to") || { cat "$work/daemon.log"; echo "FAIL: update $i to $to"; exit 1; }
        echo "update $i to $to: ${answer:0:160}"
        sleep 1
    done
done
if ! wait "$bench"; then
    tail -20 "$work/bench.txt"
    echo "FAIL: the driver failed across the updates"
    exit 1
fi
grep -E "reads formats" "$work/daemon.log" | sed 's/^.*live update: /  /'
if grep -E " ERROR " "$work/daemon.log"; then
    echo "FAIL: errors in the daemon's log"
    exit 1
fi
echo "PASS: $((2 * ROUNDS)) updates between $REV and this tree under I/O"
