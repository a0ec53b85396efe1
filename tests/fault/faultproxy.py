"""A TCP fault proxy (Python 3 stdlib only) for tests/fault/test_netfault.py.

It sits on loopback between idemd and a database server and forwards bytes
both ways; a test switches its mode at run time (set_mode, thread-safe):

  pass              forward as they come
  delay MS          every chunk leaves MS milliseconds after it arrived, in
                    each direction (order kept; a one-way latency, not a
                    throughput cap)
  blackhole         accept and read, forward nothing and close nothing: a
                    partition. What was held is delivered when the mode turns
                    back to pass / delay / throttle, as TCP would retransmit
                    it once a partition heals (unless a side gave up first)
  reset             every open connection is closed on both sides with a TCP
                    RST (SO_LINGER 0); a connection accepted meanwhile is
                    reset at once
  throttle BPS      at most BPS bytes per second in each direction

Packet loss cannot be made in userspace above TCP (it only shows as delay):
test_netfault.py makes it with nftables when the kernel has it.

Used in-process:

    p = FaultProxy(("10.1.2.2", 5432)).start()   # p.port: where to connect
    p.set_mode("delay", 50)
    p.close()

or by hand: python3 faultproxy.py UPSTREAM_HOST UPSTREAM_PORT [LISTEN_PORT],
then type a mode per line on stdin ("delay 50", "reset", "pass").
"""

import collections
import socket
import struct
import sys
import threading
import time

MODES = ("pass", "delay", "blackhole", "reset", "throttle")
CHUNK = 65536


def _rst(sock):
    """Close sock with an RST instead of a FIN. SHUT_RD sends nothing but
    wakes a thread blocked in recv on it, whose reference would otherwise
    keep the socket open (the RST goes out when the last one is dropped)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pipe:
    """One direction of one connection: a reader thread queues chunks with
    their arrival time, a writer thread sends them as the mode allows."""

    def __init__(self, proxy, conn, src, dst):
        self.proxy, self.conn, self.src, self.dst = proxy, conn, src, dst
        self.q = collections.deque()
        self.eof = False

    def read(self):
        try:
            while True:
                data = self.src.recv(CHUNK)
                with self.proxy.cv:
                    if not data:
                        self.eof = True
                    else:
                        self.q.append((time.monotonic(), data))
                    self.proxy.cv.notify_all()
                if not data:
                    return
        except ConnectionResetError:
            self.conn.kill(rst=True)  # pass the reset on to the other side
            return
        except OSError:
            pass
        self.conn.kill()

    def write(self):
        p = self.proxy
        try:
            while True:
                with p.cv:
                    while not self.conn.dead:
                        if p.mode != "blackhole" and (self.q or self.eof):
                            break
                        p.cv.wait(0.5)
                    if self.conn.dead:
                        return
                    if not self.q:  # eof and everything sent: half-close
                        try:
                            self.dst.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                        return
                    t_in, data = self.q[0]
                    mode, arg = p.mode, p.arg
                if mode == "delay":
                    wait = t_in + arg / 1000.0 - time.monotonic()
                    if wait > 0:
                        time.sleep(min(wait, 0.05))
                        continue  # re-check: the mode may change meanwhile
                if mode == "throttle":
                    data = data[:max(1, int(arg) // 20)]
                    t0 = time.monotonic()
                    self.dst.sendall(data)
                    spent = time.monotonic() - t0
                    time.sleep(max(0.0, len(data) / float(arg) - spent))
                else:
                    self.dst.sendall(data)
                with p.cv:
                    t_in, rest = self.q[0]
                    if len(data) < len(rest):
                        self.q[0] = (t_in, rest[len(data):])
                    else:
                        self.q.popleft()
                    p.bytes += len(data)
        except OSError:
            pass
        self.conn.kill()


class _Conn:
    def __init__(self, proxy, client, upstream):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.dead = False
        self.pipes = (_Pipe(proxy, self, client, upstream), _Pipe(proxy, self, upstream, client))

    def start(self):
        for pipe in self.pipes:
            for fn in (pipe.read, pipe.write):
                threading.Thread(target=fn, daemon=True).start()

    def kill(self, rst=False):
        with self.proxy.cv:
            if self.dead:
                return
            self.dead = True
            self.proxy.conns.discard(self)
            self.proxy.cv.notify_all()
        for s in (self.client, self.upstream):
            if rst:
                _rst(s)
            else:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    s.close()
                except OSError:
                    pass


class FaultProxy:
    def __init__(self, upstream, listen=("127.0.0.1", 0)):
        self.upstream = upstream
        self.listen = listen
        self.cv = threading.Condition()
        self.mode, self.arg = "pass", 0
        self.conns = set()
        self.accepted = 0
        self.resets = 0
        self.bytes = 0
        self.sock = None
        self.port = None
        self.closed = False

    def start(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(self.listen)
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def set_mode(self, mode, arg=0):
        if mode not in MODES:
            raise ValueError("faultproxy: unknown mode %r (one of %s)" % (mode, ", ".join(MODES)))
        if mode in ("delay", "throttle") and not arg > 0:
            raise ValueError("faultproxy: %s needs a positive argument" % mode)
        with self.cv:
            self.mode, self.arg = mode, arg
            victims = list(self.conns) if mode == "reset" else []
            self.cv.notify_all()
        for c in victims:
            self.resets += 1
            c.kill(rst=True)

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.cv:
                mode = self.mode
            if mode == "reset":
                self.resets += 1
                _rst(client)
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client):
        # In a black hole the upstream connect would hang in the real network
        # too; wait for the mode to change (or the client to give up) first.
        with self.cv:
            while self.mode == "blackhole" and not self.closed:
                self.cv.wait(0.5)
        try:
            up = socket.create_connection(self.upstream, timeout=10)
            up.settimeout(None)
            up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            _rst(client)
            return
        c = _Conn(self, client, up)
        with self.cv:
            self.conns.add(c)
        c.start()

    def close(self):
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.cv:
            conns = list(self.conns)
            self.cv.notify_all()
        for c in conns:
            c.kill()


def main():
    if len(sys.argv) not in (3, 4):
        sys.stderr.write("usage: faultproxy.py UPSTREAM_HOST UPSTREAM_PORT [LISTEN_PORT]\n")
        return 2
    p = FaultProxy((sys.argv[1], int(sys.argv[2])),
                   ("127.0.0.1", int(sys.argv[3]) if len(sys.argv) == 4 else 0)).start()
    print("faultproxy: 127.0.0.1:%d -> %s:%s; modes: %s" % (p.port, sys.argv[1], sys.argv[2],
                                                         " ".join(MODES)), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            p.set_mode(words[0], float(words[1]) if len(words) > 1 else 0)
            print("mode %s" % " ".join(words), flush=True)
        except ValueError as e:
            print(e, flush=True)
    p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
