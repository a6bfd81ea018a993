# tools/vm/host-lib.sh: helpers of the host-side VM test scripts (bash), sourced by
# run-multi-test.sh, run-nfs41-locks-test.sh, run-update-test.sh and nfs-compare.sh.

# vfu_device SOCK [BUS ID]: QEMU's JSON -device argument of a vfio-user-pci device whose server
# listens on the unix socket SOCK (QEMU needs the JSON syntax for the socket), optionally behind
# the root port BUS and named ID.
vfu_device() {
  local extra=""
  [ $# -lt 3 ] || extra="\"bus\":\"$2\",\"id\":\"$3\","
  echo "{\"driver\":\"vfio-user-pci\",$extra\"socket\":{\"type\":\"unix\",\"path\":\"$1\"}}"
}

# wait_sockets TENTHS PATH...: waits up to TENTHS tenths of a second until every PATH is a
# socket; status 1 if one is not by then.
wait_sockets() {
  local n=$1 p ok
  shift
  while [ "$n" -gt 0 ]; do
    ok=1
    for p in "$@"; do [ -S "$p" ] || ok=0; done
    [ $ok = 0 ] || return 0
    sleep 0.1
    n=$((n - 1))
  done
  return 1
}

# ctl_rpc CTL JSON: one JSON-RPC request to the daemon's control socket CTL; prints the answer line.
ctl_rpc() { printf '%s\n' "$2" | python3 -c '
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(sys.stdin.buffer.read())
buf = b""
while not buf.endswith(b"\n"):
    c = s.recv(65536)
    if not c: break
    buf += c
print(buf.decode().strip())' "$1"; }

# knfs_netdev PORT...: QEMU's -netdev argument for a guest NFS client: user networking with
# restrict=on (no way out) and a guestfwd of 10.0.2.100:PORT to the host's 127.0.0.1:PORT for each
# PORT. nodelay=on (",," escapes the comma inside the option): each guestfwd is a chardev socket
# to the server, and with Nagle on it a call the guest sends in several segments waited for the
# server's delayed ACK, ~40 ms per 4 KiB WRITE.
knfs_netdev() {
  local net="user,id=n0,restrict=on" p
  for p in "$@"; do net="$net,guestfwd=tcp:10.0.2.100:$p-tcp:127.0.0.1:$p,,nodelay=on"; done
  echo "$net"
}
