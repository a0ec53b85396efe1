"""idemd's event threads and its workers (issues 12 and 13):

    python3 tests/http/test_pool.py

idemd runs libmicrohttpd's epoll thread pool (--threads); whatever may wait
for the store runs on a worker thread with the connection suspended
(src/server/http.c). IDEMD_TEST_WORKER_DELAY_MS holds every worker that long
before it starts, as a slow store would, so these tests see which thread
answered a request. Proved:

- while every worker-bound request hangs (reads, /healthz, refunds, which
  read their payment first), a retry with the very bytes of an answered
  payment is replayed at once, a new payment (key and channel known) is
  started on the event thread and answered after its COMMIT, as are its
  own retries, and /metrics and the 4xx answers come at once too; a
  request that does need a worker takes the delay (so a fast answer is not
  the hook doing nothing);
- a bearer key the auth cache does not hold is looked up with the connection
  suspended in the head phase: a wrong key on a 900 KB body is answered 401
  after the lookup and before any of the body was sent, with no
  100 Continue; a valid key gets its 100 Continue after the lookup, and its
  201 once the body is in;
- SIGTERM while requests are suspended in every phase (a key lookup, a read,
  /healthz, a write before its COMMIT, a two-phase write waiting for its
  channel) answers each of them as if there had been no signal, answers a
  request begun after it 503 shutting_down, and exits 0 with no
  libmicrohttpd error (MHD_stop_daemon with a suspended connection panics).
"""

import http.client
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import dumps, uid  # noqa: E402

FAST = 0.5  # an answer from an event thread, with every worker held up


def timed(fn):
    t = time.monotonic()
    r = fn()
    return r, time.monotonic() - t


def unknown_key():
    """A well-formed API key that no merchant has: only a lookup says so."""
    return "sk_%s_%s" % (secrets.token_hex(8), secrets.token_hex(24))


class DelayedWorkers(harness.TestCase):
    """A TestCase whose idemd holds every worker DELAY seconds."""
    DELAY = 2.0

    @classmethod
    def setUpClass(cls):
        os.environ["IDEMD_TEST_WORKER_DELAY_MS"] = str(int(cls.DELAY * 1000))
        try:
            super().setUpClass()
        finally:
            del os.environ["IDEMD_TEST_WORKER_DELAY_MS"]


class FastPath(DelayedWorkers):
    DELAY = 2.0
    SLOW = 16  # requests held on workers at once

    def test_replay_metrics_and_4xx_while_every_worker_waits(self):
        m, ch = self.merchant(), self.channel()
        key = uid("K")
        body = dumps(m.payment_body(100, "CNY", ch.name))
        first, took = timed(lambda: m.post("/v1/payments", body, key=key))
        self.assertFirst(first)
        # the key lookup and the write each waited for a worker
        self.assertGreaterEqual(took, 2 * self.DELAY * 0.9, "the worker delay did not hold")
        pid = first.json()["id"]

        slow, lock = [], threading.Lock()

        def hold(what, fn):
            t = time.monotonic()
            try:
                r = fn()
            except OSError as e:
                r = e
            with lock:
                slow.append((what, t, time.monotonic(), r))

        calls = []
        for i in range(self.SLOW):
            if i % 4 == 0:
                calls.append(("healthz", lambda: self.server.request("GET", "/healthz")))
            elif i % 4 == 1:
                calls.append(("write", lambda: m.post("/v1/refunds", {
                    "refund_request_no": uid("R"), "payment_id": pid, "amount": 1})))
            else:
                calls.append(("read", lambda: m.get("/v1/payments/" + pid)))
        threads = [threading.Thread(target=hold, args=c, daemon=True) for c in calls]
        for t in threads:
            t.start()
        time.sleep(0.3)  # all of them on their workers now

        t_fast = time.monotonic()
        conn = http.client.HTTPConnection(harness.HOST, self.server.port, timeout=10)
        try:
            for _ in range(10):  # one keep-alive connection, then new ones
                t = time.monotonic()
                conn.request("POST", "/v1/payments", body, m.headers(key))
                resp = conn.getresponse()
                r = harness.Response(resp.status, resp.headers, resp.read())
                self.assertReplayOf(r, first)
                self.assertLess(time.monotonic() - t, FAST, "a replay waited")
        finally:
            conn.close()
        for _ in range(5):
            r, took = timed(lambda: m.post("/v1/payments", body, key=key))
            self.assertReplayOf(r, first)
            self.assertLess(took, FAST, "a replay on a new connection waited")
        # a new payment needs no worker: queued for the writer from here
        for _ in range(5):
            key2, body2 = uid("K"), dumps(m.payment_body(100, "CNY", ch.name))
            r, took = timed(lambda: m.post("/v1/payments", body2, key=key2))
            self.assertFirst(r)
            self.assertLess(took, FAST, "a new payment waited for a worker")
            again, took = timed(lambda: m.post("/v1/payments", body2, key=key2))
            self.assertReplayOf(again, r)
            self.assertLess(took, FAST, "its retry waited")
        r, took = timed(lambda: self.server.request("GET", "/metrics"))
        self.assertStatus(r, 200)
        self.assertLess(took, FAST, "/metrics waited")
        r, took = timed(lambda: self.server.request("GET", "/v1/nothing-here"))
        self.assertProblem(r, 404, "not_found")
        self.assertLess(took, FAST)
        r, took = timed(lambda: self.server.request(
            "GET", "/v1/balance", headers={"Authorization": "Bearer not-a-key"}))
        self.assertProblem(r, 401, "unauthorized")
        self.assertLess(took, FAST, "a malformed key needs no lookup")
        r, took = timed(lambda: m.post("/v1/payments", b"{not json", key=uid("K"),
                                       headers={"Content-Type": "text/plain"}))
        self.assertProblem(r, 415, "unsupported_media_type")
        self.assertLess(took, FAST)
        t_fast_end = time.monotonic()

        # What needs a worker waits for one: the fast answers above were not
        # the hook doing nothing.
        r, took = timed(lambda: m.get("/v1/balance"))
        self.assertStatus(r, 200)
        self.assertGreaterEqual(took, self.DELAY * 0.9)

        for t in threads:
            t.join(60)
        self.assertEqual(len(slow), self.SLOW)
        for what, ts, tr, r in slow:
            self.assertNotIsInstance(r, OSError, "%s: %r" % (what, r))
            # the refund's payment is still processing: refused, after the read
            self.assertEqual(r.status, {"healthz": 200, "write": 409, "read": 200}[what],
                             "%s: %r" % (what, r))
            self.assertGreaterEqual(tr - ts, self.DELAY * 0.9, "%s did not wait" % what)
        self.assertLess(t_fast_end, min(tr for _w, _s, tr, _r in slow),
                        "the fast answers were not all given while every worker waited")


def read_head(s, timeout=10.0):
    """Bytes up to the end of one response head."""
    s.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


class HeadPhaseLookup(DelayedWorkers):
    """The lookup of an uncached key, with the connection suspended before
    any of its body is read."""
    DELAY = 1.0
    LENGTH = 900000  # under 1 MiB: only the key refuses it

    def head(self, api_key, expect=False, length=LENGTH):
        h = (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
             + api_key.encode() + b"\r\nContent-Type: application/json\r\n"
             b"Idempotency-Key: " + uid("K").encode() + b"\r\n"
             b"Content-Length: %d\r\n" % length)
        if expect:
            h += b"Expect: 100-continue\r\n"
        return h + b"\r\n"

    def answer_before_body(self, expect):
        s = socket.create_connection((harness.HOST, self.server.port), timeout=10)
        try:
            t = time.monotonic()
            s.sendall(self.head(unknown_key(), expect))
            # nothing of the body is sent: the answer must come without it
            resp = http.client.HTTPResponse(s, method="POST")
            resp.begin()
            took = time.monotonic() - t
            r = harness.Response(resp.status, resp.headers, resp.read())
        finally:
            s.close()
        self.assertProblem(r, 401, "unauthorized")
        self.assertEqual(r.header("WWW-Authenticate"), 'Bearer realm="idem"')
        self.assertGreaterEqual(took, self.DELAY * 0.9, "the key was not looked up on a worker")
        self.assertEqual(r.header("Connection"), "close", "the unread body must close it: %r" % r)

    def test_wrong_key_on_a_large_body_is_401_before_the_body(self):
        self.answer_before_body(expect=False)

    def test_wrong_key_with_expect_gets_401_and_no_100(self):
        # http.client.HTTPResponse.begin skips a 100 Continue: read raw first
        s = socket.create_connection((harness.HOST, self.server.port), timeout=10)
        try:
            s.sendall(self.head(unknown_key(), expect=True))
            head = read_head(s)
        finally:
            s.close()
        self.assertTrue(head.startswith(b"HTTP/1.1 401 "), head[:200])
        self.answer_before_body(expect=True)

    def test_valid_key_gets_100_continue_after_the_lookup(self):
        m, ch = self.merchant(), self.channel()  # m's key is in no cache yet
        s = socket.create_connection((harness.HOST, self.server.port), timeout=15)
        try:
            for n in range(2):  # uncached, then cached, on one connection
                body = dumps(m.payment_body(100, "CNY", ch.name))
                t = time.monotonic()
                s.sendall(self.head(m.api_key, expect=True, length=len(body)))
                head = read_head(s)
                took = time.monotonic() - t
                self.assertTrue(head.startswith(b"HTTP/1.1 100 Continue\r\n"), head[:200])
                if n == 0:
                    self.assertGreaterEqual(took, self.DELAY * 0.9, "no lookup before the 100")
                else:
                    self.assertLess(took, FAST, "a cached key waited for its 100")
                s.sendall(body)
                rest = head[head.index(b"\r\n\r\n") + 4:]
                if not rest:
                    rest = read_head(s)
                self.assertTrue(rest.startswith(b"HTTP/1.1 201 "), rest[:300])
                m_len = re.search(rb"(?i)\r\ncontent-length: *(\d+)", rest)
                self.assertIsNotNone(m_len, rest[:300])
                have = len(rest) - (rest.index(b"\r\n\r\n") + 4)
                want = int(m_len.group(1))
                while have < want:
                    chunk = s.recv(want - have)
                    self.assertTrue(chunk, "connection closed mid-answer")
                    have += len(chunk)
        finally:
            s.close()


class ShutdownWhileSuspended(harness.TestCase):
    """SIGTERM with requests suspended in every phase."""
    DELAY = 1.5
    ROUNDS = 2

    def setUp(self):
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.cleanup()

    def start(self):
        os.environ["IDEMD_TEST_WORKER_DELAY_MS"] = str(int(self.DELAY * 1000))
        try:
            s = harness.Server(("--mock-channel-delay-ms", "1500"))
            self.servers.append(s)
            return s.start()
        finally:
            del os.environ["IDEMD_TEST_WORKER_DELAY_MS"]

    @classmethod
    def setUpClass(cls):
        pass  # a server per round

    @classmethod
    def tearDownClass(cls):
        pass

    def round(self):
        srv = self.start()
        srv.ensure_channel("mock")
        ch = srv.new_channel()
        cached, fresh = srv.new_merchant(), srv.new_merchant()
        self.assertStatus(cached.get("/v1/balance"), 200)  # its key is cached now
        calls = [
            ("lookup", 201, lambda: fresh.post("/v1/payments",
                                               fresh.payment_body(100, "CNY", ch.name),
                                               key=uid("K"))),
            ("wrong key", 401, lambda: srv.request(
                "GET", "/v1/balance", headers={"Authorization": "Bearer " + unknown_key()})),
            ("read", 200, lambda: cached.get("/v1/balance")),
            ("healthz", 200, lambda: srv.request("GET", "/healthz")),
            ("write", 201, lambda: cached.post("/v1/payments",
                                               cached.payment_body(100, "CNY", ch.name),
                                               key=uid("K"))),
            ("two-phase", 201, lambda: cached.post("/v1/payments",
                                                   cached.payment_body(100, "CNY", "mock"),
                                                   key=uid("K"))),
        ]
        out = {}

        def run(name, fn):
            try:
                out[name] = fn()
            except OSError as e:
                out[name] = e

        threads = [threading.Thread(target=run, args=(n, f), daemon=True) for n, _s, f in calls]
        for t in threads:
            t.start()
        time.sleep(0.4)  # every one of them suspended, its worker held
        srv.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late = srv.request("GET", "/metrics", timeout=10)
        for t in threads:
            t.join(30)
        srv.proc.wait(harness.STOP_TIMEOUT)
        rc = srv.stop()  # exited already: collects the code
        log = srv.log_text()
        self.assertEqual(rc, 0, log[-3000:])
        self.assertNotRegex(log, r"(?i)fatal|suspended connections|panic", log[-3000:])
        self.assertProblem(late, 503, "shutting_down")
        for name, status, _f in calls:
            r = out.get(name)
            self.assertNotIsInstance(r, (OSError, type(None)), "%s: %r\n%s" % (name, r, log[-3000:]))
            self.assertEqual(r.status, status, "%s: %r" % (name, r))

    def test_sigterm_with_requests_suspended_in_every_phase(self):
        for _ in range(self.ROUNDS):
            self.round()


class ColdCache(harness.TestCase):
    """A restarted idemd's front cache is empty, and a new payment goes from
    the event thread to its writer without the read before the write
    (idem_execute_async_nowait): the claim's INSERT decides, so the retries
    of payments answered before the restart replay byte for byte, another
    body under a used key is 422, and no order is made twice. Half the
    retries in a row are duplicates the cache cannot know: the read before
    the write comes back on for them (a worker's), which changes nothing
    of the answers."""

    def test_retries_after_a_restart_are_decided_by_the_claim(self):
        s1 = harness.Server(self.SERVER_ARGS)
        self.addCleanup(s1.cleanup)
        s1.start()
        m, ch = s1.new_merchant(), s1.new_channel()
        made = []
        for i in range(40):
            key, body = uid("K"), m.payment_body(100 + i, "CNY", ch.name)
            r = m.post("/v1/payments", body, key=key)
            self.assertFirst(r)
            made.append((key, body, r))
        s1.stop_checked()

        s2 = harness.Server(self.SERVER_ARGS, db_url=s1.db_url, tmpdir=s1.tmpdir)
        self.addCleanup(s2.cleanup)
        s2.start()
        m2 = m.on(s2)
        for i, (key, body, r) in enumerate(made):
            again = m2.post("/v1/payments", body, key=key)
            self.assertReplayOf(again, r)
            # new payments between the retries, as real traffic has them
            if i % 2:
                self.assertFirst(m2.post("/v1/payments", m2.payment_body(7, "CNY", ch.name),
                                         key=uid("K")))
        other = dict(made[0][1], amount=1)
        self.assertProblem(m2.post("/v1/payments", other, key=made[0][0]), 422,
                           "idempotency_key_reused")
        for key, body, r in made:
            self.assertReplayOf(m2.post("/v1/payments", body, key=key), r)
            n = s2.count_payments(m.id, body["merchant_order_no"])
            self.assertIn(n, (1, None), "order %s made %s times" % (body["merchant_order_no"], n))
        s2.stop_checked()

    @classmethod
    def setUpClass(cls):
        pass  # each test runs its own servers

    @classmethod
    def tearDownClass(cls):
        pass


if __name__ == "__main__":
    harness.main()
