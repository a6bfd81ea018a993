#!/bin/bash
# tools/nfs/ganesha.sh COMMAND [ARGS]: the NFS test server (nfs-ganesha 4.3, NFSv3 and NFSv4.x over
# TCP with FSAL_VFS), on the loopback only.
#
#   install          installs the Debian packages nfs-ganesha, nfs-ganesha-vfs and rpcbind with
#                    the host's apt (its own mirror configuration), idempotently; no service is
#                    started by the install (a policy-rc.d refuses it for the duration)
#   start DIR [--nfs-port N] [--mount-port M]
#                    exports DIR/export (created) with ganesha listening on 127.0.0.1:N (NFS) and
#                    127.0.0.1:M (MOUNT); free ports are picked when not given, and a DIR started
#                    before keeps its ports (a restart after `kill` listens where it did). Starts
#                    rpcbind first if none listens (NFSv3 registration needs one; one per machine,
#                    shared by every instance). Waits until ganesha has initialised and listens,
#                    then prints the export's URL (nfs://127.0.0.1/PATH?nfsport=N&mountport=M);
#                    NFSv4 clients use port N too: PUTROOTFH is the pseudo root, and the export is
#                    at the pseudo path PATH (LOOKUP of each of its components)
#   stop DIR         SIGTERM, waits for the exit (SIGKILL after GANESHA_STOP_TIMEOUT, 10 s); stops
#                    the rpcbind these scripts started once no ganesha runs any more
#   kill DIR         SIGKILL (for fault tests: `start DIR` again restarts it on the same ports)
#   status DIR       "running PID URL" (exit 0) or "stopped" (exit 1)
#   url DIR          the export's URL
# DIR holds ganesha.conf, ganesha.log, ganesha.pid, ports, export/ and recovery/. Needs root
# (FSAL_VFS opens files by handle). Env: GANESHA_WAIT (start timeout, 30 s), GANESHA_LOG_LEVEL
# (EVENT), RPCBIND_PIDFILE (where the rpcbind these scripts start is recorded,
# /run/virtiofs-dpu-rpcbind.pid).
set -euo pipefail

PKGS="nfs-ganesha nfs-ganesha-vfs rpcbind"
RPCBIND_PIDFILE=${RPCBIND_PIDFILE:-/run/virtiofs-dpu-rpcbind.pid}
LOCK=${RPCBIND_PIDFILE%.pid}.lock

log() { echo "[ganesha $(date +%T)] $*" >&2; }
die() { echo "[ganesha] ERROR: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

cmd_install() {
  local missing="" p
  for p in $PKGS; do installed "$p" || missing="$missing $p"; done
  if [ -z "$missing" ]; then
    log "installed: $PKGS ($(dpkg-query -W -f='${Version}' nfs-ganesha))"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "missing packages:$missing (run as root to install them)"
  log "apt-get install:$missing"
  # The packages' maintainer scripts would start a ganesha with the default configuration (on
  # every address) and rpcbind: refused while we install (the Debian policy-rc.d convention),
  # unless the machine has a policy of its own.
  local policy=/usr/sbin/policy-rc.d ours=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# written by tools/nfs/ganesha.sh install, removed when it ends\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    ours=1
  fi
  local rc=0
  {
    timeout 600 apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends $missing
  } < /dev/null > /tmp/virtiofs-dpu-nfs-install.log 2>&1 || rc=$?
  [ $ours = 0 ] || rm -f "$policy"
  if [ $rc != 0 ]; then
    tail -n 30 /tmp/virtiofs-dpu-nfs-install.log >&2
    die "apt-get failed (rc=$rc), log: /tmp/virtiofs-dpu-nfs-install.log"
  fi
  for p in $PKGS; do installed "$p" || die "$p still not installed"; done
  log "installed: $PKGS ($(dpkg-query -W -f='${Version}' nfs-ganesha))"
}

# listening PORT: true when something accepts on 127.0.0.1:PORT.
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_port: a TCP port nothing listens on (the kernel's choice for an ephemeral bind).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# alive PID: the process exists and is not a zombie (a server we started and left is reaped by
# init, not by us).
alive() {
  [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null || return 1
  local state
  state=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null)
  [ "$state" != Z ]
}

# ganesha_pid DIR: the pid of DIR's ganesha if it runs (checked against /proc: a recycled pid of
# another program does not count).
ganesha_pid() {
  local pid
  pid=$(cat "$1/ganesha.pid" 2>/dev/null) || return 1
  alive "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = ganesha.nfsd ] || return 1
  echo "$pid"
}

url_of() { # DIR
  local nfs mnt
  read -r nfs mnt < "$1/ports"
  echo "nfs://127.0.0.1$1/export?nfsport=$nfs&mountport=$mnt"
}

# rpcbind: NFSv3 servers register there. Started unless one answers on port 111; recorded so
# that `stop` ends only the rpcbind these scripts started. Under the lock.
ensure_rpcbind() {
  if listening 111; then return 0; fi
  command -v rpcbind > /dev/null || die "rpcbind not installed (tools/nfs/ganesha.sh install)"
  mkdir -p /run/rpcbind
  # -f: foreground (we keep its pid); it listens on every address (Debian's 1.2.6 aborts with
  # -h 127.0.0.1), only the ganesha ports are bound to the loopback.
  setsid rpcbind -f < /dev/null > /dev/null 2>&1 9>&- &
  local pid=$! n=100
  echo "$pid" > "$RPCBIND_PIDFILE"
  while [ $n -gt 0 ] && ! listening 111; do
    alive "$pid" || die "rpcbind exited at start"
    sleep 0.05; n=$((n - 1))
  done
  listening 111 || die "rpcbind does not listen on port 111"
  log "rpcbind started (pid $pid)"
}

stop_rpcbind_if_ours() {
  local pid
  pid=$(cat "$RPCBIND_PIDFILE" 2>/dev/null) || return 0
  # Another instance (ours or not) still registered there: keep it. (Zombies do not count: the
  # server just stopped may not be reaped by init yet.)
  local g
  for g in $(pgrep -x ganesha.nfsd || true); do
    if alive "$g"; then return 0; fi
  done
  if alive "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = rpcbind ]; then
    kill -TERM "$pid" 2>/dev/null || true
    local n=50
    while [ $n -gt 0 ] && alive "$pid"; do sleep 0.1; n=$((n - 1)); done
    log "rpcbind stopped (pid $pid)"
  fi
  rm -f "$RPCBIND_PIDFILE"
}

write_conf() { # DIR NFS_PORT MOUNT_PORT
  local d=$1
  cat > "$d/ganesha.conf" <<CONF
# written by tools/nfs/ganesha.sh: NFSv3 and NFSv4 over TCP on the loopback, one export
NFS_CORE_PARAM {
  Bind_addr = 127.0.0.1;
  NFS_Port = $2;
  MNT_Port = $3;
  Enable_NLM = false;
  Enable_RQUOTA = false;
  Enable_UDP = false;
  Protocols = 3, 4;
}
NFSv4 {
  # no grace period after a start (new opens and locks are granted at once); the recovery
  # directory is private to DIR; owners as numeric strings ("1000"), never names
  Graceless = true;
  RecoveryBackend = fs;
  RecoveryRoot = $d/recovery;
  Only_Numeric_Owners = true;
}
EXPORT_DEFAULTS { Transports = TCP; SecType = sys; Squash = No_Root_Squash; }
EXPORT {
  Export_Id = 1;
  Path = $d/export;
  Pseudo = $d/export;
  Access_Type = RW;
  # the pseudo path (NFSv4's name of the export) is its path
  Protocols = 3, 4;
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = ${GANESHA_LOG_LEVEL:-EVENT}; }
CONF
}

cmd_start() {
  local dir="" nfs="" mnt=""
  while [ $# -gt 0 ]; do
    case $1 in
      --nfs-port) nfs=$2; shift 2 ;;
      --mount-port) mnt=$2; shift 2 ;;
      -*) usage ;;
      *) [ -z "$dir" ] || usage; dir=$1; shift ;;
    esac
  done
  [ -n "$dir" ] || usage
  [ "$(id -u)" = 0 ] || die "ganesha's FSAL_VFS needs root"
  command -v ganesha.nfsd > /dev/null || die "ganesha.nfsd not installed (tools/nfs/ganesha.sh install)"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)
  case $dir in *[!A-Za-z0-9._/-]*) die "the directory's path must be plain (letters, digits, ._-/): $dir" ;; esac
  if pid=$(ganesha_pid "$dir"); then die "already running in $dir (pid $pid)"; fi
  if [ -s "$dir/ports" ] && [ -z "$nfs$mnt" ]; then
    read -r nfs mnt < "$dir/ports"
  fi
  [ -n "$nfs" ] || nfs=$(free_port)
  [ -n "$mnt" ] || { mnt=$(free_port); [ "$mnt" != "$nfs" ] || mnt=$(free_port); }
  case "$nfs$mnt" in *[!0-9]*) die "bad port: $nfs $mnt" ;; esac
  mkdir -p "$dir/export" "$dir/recovery"
  echo "$nfs $mnt" > "$dir/ports"
  write_conf "$dir" "$nfs" "$mnt"
  (
    flock 9
    ensure_rpcbind
  ) 9> "$LOCK"
  : > "$dir/ganesha.log"
  # -F: in the foreground of its own session (its pid is ours to signal, and no terminal
  # signal reaches it).
  setsid ganesha.nfsd -F -f "$dir/ganesha.conf" -L "$dir/ganesha.log" -p "$dir/ganesha.pid.ganesha" \
    < /dev/null > "$dir/ganesha.out" 2>&1 &
  local pid=$!
  echo "$pid" > "$dir/ganesha.pid"
  local n=$(( ${GANESHA_WAIT:-30} * 20 ))
  while [ $n -gt 0 ]; do
    if ! alive "$pid"; then
      tail -n 20 "$dir/ganesha.log" "$dir/ganesha.out" >&2 || true
      die "ganesha exited at start (log: $dir/ganesha.log)"
    fi
    if grep -q 'NFS SERVER INITIALIZED' "$dir/ganesha.log" && listening "$nfs" && listening "$mnt"; then
      break
    fi
    sleep 0.05; n=$((n - 1))
  done
  if [ $n = 0 ]; then
    kill -KILL "$pid" 2>/dev/null || true
    tail -n 20 "$dir/ganesha.log" >&2 || true
    die "ganesha did not listen on 127.0.0.1:$nfs and :$mnt within ${GANESHA_WAIT:-30} s"
  fi
  log "ganesha up (pid $pid) exporting $dir/export on 127.0.0.1:$nfs (NFS) :$mnt (MOUNT)"
  url_of "$dir"
}

cmd_stop() {
  local dir=${1:?usage: stop DIR} pid
  [ -d "$dir" ] || die "no such directory: $dir"
  dir=$(cd "$dir" && pwd -P)
  if pid=$(ganesha_pid "$dir"); then
    kill -TERM "$pid" 2>/dev/null || true
    local n=$(( ${GANESHA_STOP_TIMEOUT:-10} * 20 ))
    while [ $n -gt 0 ] && alive "$pid"; do sleep 0.05; n=$((n - 1)); done
    if alive "$pid"; then
      log "ganesha (pid $pid) still running after SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      while alive "$pid"; do sleep 0.05; done
    else
      log "ganesha stopped (pid $pid)"
    fi
  fi
  rm -f "$dir/ganesha.pid"
  (
    flock 9
    stop_rpcbind_if_ours
  ) 9> "$LOCK"
}

cmd_kill() {
  local dir=${1:?usage: kill DIR} pid
  dir=$(cd "$dir" && pwd -P)
  pid=$(ganesha_pid "$dir") || die "not running in $dir"
  kill -KILL "$pid"
  while alive "$pid"; do sleep 0.02; done
  log "ganesha killed (pid $pid)"
}

cmd_status() {
  local dir=${1:?usage: status DIR} pid
  dir=$(cd "$dir" 2>/dev/null && pwd -P) || { echo stopped; exit 1; }
  if pid=$(ganesha_pid "$dir"); then
    echo "running $pid $(url_of "$dir")"
  else
    echo stopped
    exit 1
  fi
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  install) cmd_install ;;
  start) cmd_start "$@" ;;
  stop) cmd_stop "$@" ;;
  kill) cmd_kill "$@" ;;
  status) cmd_status "$@" ;;
  url) d=$(cd "${1:?usage: url DIR}" && pwd -P); url_of "$d" ;;
  *) usage ;;
esac
