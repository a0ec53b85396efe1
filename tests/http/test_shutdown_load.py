"""SIGTERM under load, many times (issue 13): every stop is a clean exit 0,
and nothing acknowledged is lost.

    python3 tests/http/test_shutdown_load.py        (IDEM_SHUTDOWN_ROUNDS, default 32)

Each round starts idemd on the same SQLite database with a low connection
limit (libmicrohttpd's epoll event threads then keep taking their listen
socket out of and back into their epoll sets) and two event threads (so
requests meet suspended ones on the same thread), puts clients on it, half of them on keep-alive connections (a new request may arrive on one
while the stop begins), half on a new connection per request, mixing
keyed payments, their notifications and GETs, and sends SIGTERM after a
random 0.15-0.6 s. Proved per round: idemd exits 0 within the harness's
stop timeout, its log has no libmicrohttpd "Fatal error" (two were seen:
"Failed to remove listen FD from epoll set" from MHD_quiesce_daemon racing
a worker, and "MHD_stop_daemon() called while we have suspended
connections" from a keep-alive request suspended as the stop began), and
every answer is a 2xx, a 503 (store_unavailable or shutting_down, with
Retry-After) or no answer. After the last round, on a fresh idemd: every
acknowledged payment and notification replays byte for byte, every
acknowledged payment is there, and the balance equals the acknowledged
notifications exactly.
"""

import http.client
import os
import random
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402

ROUNDS = int(os.environ.get("IDEM_SHUTDOWN_ROUNDS") or 32)
CLIENTS = 10
ARGS = ["--threads", "2", "--max-connections", "6"]


class Client:
    """One connection kept open (keepalive) or a new one per request."""

    def __init__(self, port, keepalive):
        self.port, self.keepalive, self.conn = port, keepalive, None

    def request(self, method, path, body=None, headers=None):
        try:
            return self._request(method, path, body, headers)
        except (OSError, http.client.HTTPException, AttributeError) as e:
            # a connection closed under http.client surfaces as any of these
            self.close()
            raise OSError("connection lost: %r" % e) from e

    def _request(self, method, path, body, headers):
        if not self.keepalive:
            return harness.http_request(self.port, method, path, body, headers, timeout=10)
        if self.conn is None:
            self.conn = http.client.HTTPConnection(harness.HOST, self.port, timeout=10)
        self.conn.request(method, path, body=body, headers=headers or {})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self.close()
        return harness.Response(resp.status, resp.headers, data)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class ShutdownUnderLoad(unittest.TestCase):
    def setUp(self):
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.cleanup()

    def server(self, db_url=None, tmpdir=None, args=ARGS):
        s = harness.Server(args, db_url=db_url, tmpdir=tmpdir)
        self.servers.append(s)
        return s.start()

    def test_sigterm_rounds(self):
        first = self.server()
        db, tmp = first.db_url, first.tmpdir
        ch = first.new_channel()
        m = first.new_merchant()
        lock = threading.Lock()
        acked_pay = []      # (key, body, response)
        acked_note = []     # (body, response, amount)
        unsure = []         # (body, amount): notifications without an answer or with a 503
        bad = []
        srv = first
        exits = []
        rng = random.Random(int(os.environ.get("IDEM_SHUTDOWN_SEED") or time.time()))

        def check_answer(r, what):
            if 200 <= r.status < 300:
                return True
            if r.status == 503 and r.header("Retry-After") and \
                    r.json().get("code") in ("store_unavailable", "shutting_down"):
                return False
            with lock:
                bad.append("%s: %r" % (what, r))
            return False

        def client(i, port, stop):
            c = Client(port, keepalive=i % 2 == 0)
            n = 0
            try:
                while not stop.is_set():
                    n += 1
                    amount = 100 + i * 1000 + n
                    key = uid("K")
                    body = harness.dumps(m.payment_body(amount, "CNY", ch.name))
                    try:
                        r = c.request("POST", "/v1/payments", body, m.headers(key))
                    except OSError:
                        time.sleep(0.01)
                        continue
                    if not check_answer(r, "payment"):
                        continue
                    pid = r.json()["id"]
                    with lock:
                        acked_pay.append((key, body, r))
                    nbody = harness.dumps(ch.body(pid, amount))
                    hdr = {"Content-Type": "application/json",
                           "X-Signature": harness.sign(ch.secret, nbody)}
                    try:
                        r = c.request("POST", "/v1/notifications/" + ch.name, nbody, hdr)
                    except OSError:
                        with lock:
                            unsure.append((nbody, amount))
                        continue
                    if check_answer(r, "notification"):
                        with lock:
                            acked_note.append((nbody, r, amount))
                    else:
                        with lock:
                            unsure.append((nbody, amount))
                    try:
                        r = c.request("GET", "/v1/payments/" + pid, None, m.headers())
                        check_answer(r, "get")
                    except OSError:
                        pass
            finally:
                c.close()

        for rnd in range(ROUNDS):
            if rnd:
                srv = self.server(db_url=db, tmpdir=tmp)
            stop = threading.Event()
            threads = [threading.Thread(target=client, args=(i, srv.port, stop), daemon=True)
                       for i in range(CLIENTS)]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.15, 0.6))
            t0 = time.monotonic()
            rc = srv.stop(signal.SIGTERM)
            exits.append((rc, time.monotonic() - t0))
            stop.set()
            for t in threads:
                t.join(30)
            log = srv.log_text()
            fatal = [ln for ln in log.splitlines() if "Fatal error" in ln]
            self.assertEqual(fatal, [], "round %d: exit %r\n%s" % (rnd, rc, srv.log_tail(8)))
            self.assertEqual(rc, 0, "round %d: idemd exit code %r on SIGTERM under load\n%s"
                             % (rnd, rc, srv.log_tail(20)))
            self.assertEqual(bad, [], "round %d: %s" % (rnd, "\n".join(bad[:10])))

        # After the last round: nothing acknowledged is lost.
        final = self.server(db_url=db, tmpdir=tmp, args=())
        m2, ch2 = m.on(final), ch
        for key, body, r in acked_pay:
            again = final.request("POST", "/v1/payments", body, m2.headers(key))
            self.assertEqual((again.status, again.header("Idempotent-Replayed"), again.body),
                             (r.status, "true", r.body), "payment %s" % key)
            self.assertEqual(m2.payment(r.json()["id"])["id"], r.json()["id"])
        credited = 0
        for nbody, r, amount in acked_note:
            again = final.request("POST", "/v1/notifications/" + ch2.name, nbody,
                                  {"Content-Type": "application/json",
                                   "X-Signature": harness.sign(ch2.secret, nbody)})
            self.assertEqual((again.status, again.header("Idempotent-Replayed"), again.body),
                             (r.status, "true", r.body), "notification")
            credited += amount
        # an unanswered one ran once or not at all: its retry settles which
        for nbody, amount in unsure:
            again = final.request("POST", "/v1/notifications/" + ch2.name, nbody,
                                  {"Content-Type": "application/json",
                                   "X-Signature": harness.sign(ch2.secret, nbody)})
            self.assertEqual(again.status, 200, "retry of an unanswered notification")
            credited += amount
        self.assertEqual(m2.balance("CNY"), credited, "balance != every notification once")
        harness.ledger_check(db)
        final.stop_checked()
        waits = sorted(w for _, w in exits)
        sys.stderr.write("\n%d SIGTERM rounds under load: %d exit 0; stop took %.2f-%.2fs "
                         "(median %.2fs); %d payments and %d notifications acknowledged, "
                         "%d notifications unanswered or 503; all replayed\n"
                         % (ROUNDS, sum(1 for rc, _ in exits if rc == 0), waits[0], waits[-1],
                            waits[len(waits) // 2], len(acked_pay), len(acked_note),
                            len(unsure)))
        self.assertGreater(len(acked_pay), ROUNDS, "too little load to prove anything")


if __name__ == "__main__":
    unittest.main(verbosity=2)
