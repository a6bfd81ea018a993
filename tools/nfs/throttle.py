#!/usr/bin/env python3
"""tools/nfs/throttle.py LISTEN_PORT TARGET_PORT MIB_PER_S

A TCP forwarder on 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT that carries at most
MIB_PER_S MiB/s from the server to its clients, all connections together (a token bucket): a
link of that speed in front of the server. Two of them in front of one NFS server are two
addresses of one server, each the limit, which is how the NFSv4.1 session trunking figure in
BENCHMARKS.md is made on one machine (`virtiofs-bench --remote
"nfs://127.0.0.1:A,127.0.0.1:B/EXPORT?version=4.1" --pollers 2 --request-queues 2`). Runs until
killed; prints the bytes it carried each 10 s on stderr.
"""
import socket
import sys
import threading
import time


class Bucket:
    """Bytes allowed per second, shared by every connection of the forwarder."""

    def __init__(self, rate):
        self.rate = float(rate)
        self.tokens = 0.0
        self.at = time.monotonic()
        self.lock = threading.Lock()
        self.carried = 0

    def take(self, n):
        while True:
            with self.lock:
                now = time.monotonic()
                # At most 50 ms of burst.
                self.tokens = min(self.rate * 0.05, self.tokens + (now - self.at) * self.rate)
                self.at = now
                if self.tokens >= n or self.tokens >= self.rate * 0.05:
                    self.tokens -= n
                    self.carried += n
                    return
                wait = (n - self.tokens) / self.rate
            time.sleep(min(wait, 0.01))


def pump(src, dst, bucket):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            if bucket is not None:
                bucket.take(len(data))
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    listen, target, mib = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    bucket = Bucket(mib * 1024 * 1024)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen))
    srv.listen(64)

    def report():
        while True:
            time.sleep(10)
            print(f"throttle {listen}: {bucket.carried} bytes carried", file=sys.stderr, flush=True)

    threading.Thread(target=report, daemon=True).start()
    while True:
        client, _ = srv.accept()
        server = socket.create_connection(("127.0.0.1", target))
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, server, None), daemon=True).start()
        threading.Thread(target=pump, args=(server, client, bucket), daemon=True).start()


if __name__ == "__main__":
    main()
