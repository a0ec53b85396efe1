"""The database goes away under load, then comes back (issue 4):

    python3 tests/fault/test_db_outage.py postgres|mariadb stop|sigstop

The test starts its OWN throwaway server (dbserver.PgServer / MyServer in a
temp dir), so stopping it disturbs no other suite, and one idemd on it.
Client threads keep payments, their SUCCESS notifications and refunds in
flight; a client that gets 503 retries the same request (same key, same
body) until it is acknowledged, as a real client would. Mid-load:

  stop     PostgreSQL: pg_ctl stop -m immediate; MariaDB: SIGKILL of mariadbd.
           Restarted after a few seconds on the same data dir and port.
  sigstop  every server process SIGSTOPped (connections hang instead of
           failing); SIGCONT after long enough for idemd's I/O bounds to fire.

Proved:
- every answer, at any time, is a first 2xx or 503 store_unavailable
  (problem+json, Retry-After); never 422, 500, 409 or anything else, and a
  replay only for a retry of a request that had been answered 503 (its
  COMMIT may have happened with the acknowledgement lost); every request is
  answered within CLIENT_TIMEOUT;
- every answer to a request sent once the database was gone and received
  before it came back is 503 store_unavailable (GET /healthz: 503); at least
  one such answer is seen;
- bounded waits (issue 13), as the CLIENT measures them, from the request
  sent to the answer read: idemd runs with --request-timeout-ms 10000; no
  answer (POST or GET) takes longer than that deadline + 2 s; while the
  server is frozen GET /healthz answers 503 within 1.5 s (its ping has a
  connection and a 500 ms bound of its own), and GET /metrics (no store)
  answers within 1.5 s at any time, although SLOW_READERS clients (more
  than idemd's HTTP threads) keep GETs in flight that each wait out their
  deadline on the frozen store: those run on worker threads of their own,
  never on the libmicrohttpd event thread that serves /healthz; and, while
  frozen, a retry with the very bytes of a payment answered just before the
  freeze is replayed within 1.5 s on an event thread (its key is still in
  the auth cache, its answer in the front cache: no store at all), as long
  as the key's cache entry lasts (AUTH_FRESH); the times are printed;
- the same idemd process (never restarted) serves again: /healthz turns 200
  and every request sent after that is acknowledged at the first attempt;
- nothing acknowledged is missing: every 2xx payment is there (GET and SQL),
  every acknowledged credit and refund is in the balance, which equals the
  client-side total exactly (GET /v1/balance and SQL, balance == ledger sum),
  one payment row per key; and a retry of every acknowledged request replays
  the first answer byte for byte with Idempotent-Replayed: true.
"""

import json
import os
import re
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbserver  # noqa: E402
from dbserver import harness  # noqa: E402
from harness import uid  # noqa: E402

BACKEND = dbserver.backend_arg()
MODE = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1] in ("stop", "sigstop") \
    else os.environ.get("IDEM_FAULT_MODE", "stop")

WORKERS = 6
HTTP_THREADS = 8           # idemd --threads
SLOW_READERS = 12          # clients keeping store reads in flight (> HTTP_THREADS)
WARMUP_ACKS = 40           # acknowledged requests before the outage
# sigstop: long enough for idemd's bounds to fire (every store wait ends by
# the request's deadline, REQUEST_TIMEOUT) and for their 503s to arrive while
# the server is stopped.
REQUEST_TIMEOUT = 10.0     # idemd --request-timeout-ms, the store deadline
DEADLINE_SLACK = 2.0       # an answer may take the deadline + this, never more
HEALTHZ_BOUND = 1.5        # /healthz while the database is frozen
DOWN_SECONDS = float(os.environ.get("IDEM_FAULT_DOWN_SECONDS") or
                     {"stop": 6.0, "sigstop": REQUEST_TIMEOUT + 5.0}[MODE])
AFTER_HEALTHY = 3.0        # load kept on after idemd is healthy again
# A verified API key is remembered for 10 s (src/pay/authcache.c): replays
# sent up to this long after the key's first use need no store at all.
AUTH_FRESH = 8.0
REPLAYS_MIN = 5            # fast replays that must be seen while frozen
CLIENT_TIMEOUT = 60.0      # one request; idemd bounds its own waits well below
RETRY_PAUSE = 0.2
GRACE = 2.0                # an answer to a request committed just before the outage
REFUND = 100


T_START = time.monotonic()


class Attempt:
    __slots__ = ("req", "t_send", "t_recv", "resp", "error", "n")

    def __init__(self, req, n, t_send, t_recv, resp, error):
        self.req, self.n, self.t_send, self.t_recv = req, n, t_send, t_recv
        self.resp, self.error = resp, error

    def __repr__(self):
        return "<%s %s try %d sent %.2f recv %.2f %r%s>" % (
            self.req.kind, self.req.key, self.n, self.t_send, self.t_recv,
            self.resp, (" error " + self.error) if self.error else "")


class Req:
    """One logical request, retried until acknowledged."""

    def __init__(self, kind, merchant, path, body, key, amount, auth="bearer", channel=None):
        self.kind, self.merchant, self.path = kind, merchant, path
        self.body = harness.dumps(body)
        self.key, self.amount, self.auth, self.channel = key, amount, auth, channel
        self.acked = None      # the 2xx Attempt
        self.tries = 0

    def send(self, server):
        if self.auth == "bearer":
            h = self.merchant.headers(self.key)
        else:
            h = {"Content-Type": "application/json",
                 "X-Signature": harness.sign(self.channel.secret, self.body)}
        return server.request("POST", self.path, self.body, h, timeout=CLIENT_TIMEOUT)


class DbOutage(unittest.TestCase):
    def setUp(self):
        dbserver.require_idemd()
        self.dbs = dbserver.private_server(BACKEND)
        self.addCleanup(self.dbs.cleanup)
        self.db = dbserver.Database(self.dbs.admin_url(), "o")
        self.idemd = harness.Server(["--threads", str(HTTP_THREADS), "--request-timeout-ms",
                                     str(int(REQUEST_TIMEOUT * 1000))], db_url=self.db.url)
        self.addCleanup(self.idemd.cleanup)
        self.idemd.start()
        self.t0 = time.monotonic()
        sys.stderr.write("\n%s %s: database server and idemd up in %.1fs\n"
                         % (BACKEND, MODE, self.t0 - T_START))
        self.lock = threading.Lock()
        self.attempts = []      # every POST attempt
        self.probes = []        # (what, t_send, t_recv, resp or None, error)
        self.replays = []       # the same, for the replay prober
        self.reqs = []
        self.stop_load = threading.Event()
        self.stop_probe = threading.Event()
        self.failures = []

    def now(self):
        return time.monotonic() - self.t0

    # -- load ------------------------------------------------------------------

    def attempt(self, req):
        req.tries += 1
        t_send = self.now()
        resp = err = None
        try:
            resp = req.send(self.idemd)
        except OSError as e:
            err = "%s: %s" % (type(e).__name__, e)
        a = Attempt(req, req.tries, t_send, self.now(), resp, err)
        with self.lock:
            self.attempts.append(a)
        if resp is not None and 200 <= resp.status < 300:
            req.acked = a
        return a

    def until_acked(self, req, deadline):
        while req.acked is None:
            if time.monotonic() > deadline:
                return False
            a = self.attempt(req)
            if req.acked is None:
                if a.resp is not None and a.resp.status != 503:
                    return False  # a wrong answer; retrying would hide it
                time.sleep(RETRY_PAUSE)
        return True

    def worker(self, w, merchants, ch):
        m = merchants[w % len(merchants)]
        n = 0
        try:
            while not self.stop_load.is_set():
                n += 1
                amount = 1000 + 10 * w + n
                pay = Req("payment", m, "/v1/payments",
                          m.payment_body(amount, "CNY", ch.name, order=uid("ORD")),
                          uid("K"), amount)
                chain = [pay]
                with self.lock:
                    self.reqs.append(pay)
                # The chain is finished even after stop_load: every logical
                # request ends acknowledged, so the balance is exact.
                deadline = time.monotonic() + 90
                if not self.until_acked(pay, deadline):
                    return
                pid = pay.acked.resp.json()["id"]
                note = Req("notification", m, "/v1/notifications/" + ch.name,
                           ch.body(pid, amount, "SUCCESS", uid("N"), uid("TXN")),
                           None, amount, auth="signature", channel=ch)
                chain.append(note)
                if n % 3 == 0:
                    chain.append(Req("refund", m, "/v1/refunds",
                                     {"refund_request_no": uid("R"), "payment_id": pid,
                                      "amount": REFUND}, uid("RK"), REFUND))
                for r in chain[1:]:
                    with self.lock:
                        self.reqs.append(r)
                    if not self.until_acked(r, deadline):
                        return
        except Exception as e:  # noqa: BLE001
            self.failures.append("worker %d: %r" % (w, e))

    def prober(self, what, fn):
        """GET /healthz or GET /v1/balance, one after the other, all along
        (each in its own thread: a slow read never delays a health probe)."""
        while not self.stop_probe.is_set():
            t = self.now()
            try:
                r, e = fn(), None
            except OSError as ex:
                r, e = None, repr(ex)
            with self.lock:
                self.probes.append((what, t, self.now(), r, e))
            time.sleep(0.25)

    def slow_reader(self, m):
        """GET /v1/payments/{id} of an id that is not there, one after the
        other: each is a store read (404 while the store answers, a wait
        for the deadline and a 503 while it is frozen)."""
        path = "/v1/payments/pay_" + "0" * 24
        while not self.stop_probe.is_set():
            t = self.now()
            try:
                r, e = m.get(path), None
            except OSError as ex:
                r, e = None, repr(ex)
            with self.lock:
                self.probes.append(("read", t, self.now(), r, e))
            if r is None or r.status not in (404, 503):
                time.sleep(0.05)

    def replayer(self, m, key, body):
        """The very bytes of an answered payment, again and again: each a
        replay from the front cache, on an event thread."""
        while not self.stop_probe.is_set():
            t = self.now()
            try:
                r, e = m.post("/v1/payments", body, key=key), None
            except OSError as ex:
                r, e = None, repr(ex)
            with self.lock:
                self.replays.append(("replay", t, self.now(), r, e))
            time.sleep(0.1)

    def start_replayer(self, m, ch):
        """Right before the freeze: m's first request (its key verified now,
        so cached until at least AUTH_FRESH from here), then the prober."""
        key, body = uid("RK"), harness.dumps(m.payment_body(100, "CNY", ch.name))
        t_auth = self.now()
        first = m.post("/v1/payments", body, key=key)
        self.assertEqual(first.status, 201, first)
        t = threading.Thread(target=self.replayer, args=(m, key, body), daemon=True)
        t.start()
        return t, t_auth, first

    def check_replays(self, t_down, t_up_begin, t_auth, first):
        """While frozen and the key cached: every replay within 1.5 s."""
        bad, fast = [], []
        for what, ts, tr, r, e in self.replays:
            if r is None:
                bad.append("replay got no answer: %s" % e)
            elif r.status == 201:
                if r.header("Idempotent-Replayed") != "true" or r.body != first.body:
                    bad.append("not the first answer replayed: %r" % r)
            elif r.status != 503 or r.json().get("code") != "store_unavailable":
                bad.append("replay answered %r" % r)
            if ts >= t_down and tr <= t_up_begin and ts <= t_auth + AUTH_FRESH:
                fast.append(tr - ts)
                if r is not None and r.status != 201:
                    bad.append("a cached replay needed the store while frozen: %r" % r)
                if tr - ts > HEALTHZ_BOUND:
                    bad.append("replay %.2fs at the client while frozen (sent %.2f)"
                               % (tr - ts, ts))
        self.assertEqual(bad, [], "\n".join(bad[:20]))
        self.assertGreaterEqual(len(fast), REPLAYS_MIN, "too few replays while frozen")
        return fast

    def acked_count(self):
        with self.lock:
            return sum(1 for a in self.attempts if a.resp is not None and
                       200 <= a.resp.status < 300)

    # -- the test ------------------------------------------------------------------

    def test_database_gone_mid_load(self):
        srv = self.idemd
        pid_before = srv.proc.pid
        ch = srv.new_channel()
        merchants = [srv.new_merchant() for _ in range(3)]
        threads = [threading.Thread(target=self.worker, args=(w, merchants, ch), daemon=True)
                   for w in range(WORKERS)]
        m0 = merchants[0]
        probes = [threading.Thread(target=self.prober, args=(
                      "healthz", lambda: srv.request("GET", "/healthz", timeout=CLIENT_TIMEOUT)),
                      daemon=True),
                  threading.Thread(target=self.prober, args=(
                      "balance", lambda: m0.get("/v1/balance")), daemon=True),
                  threading.Thread(target=self.prober, args=(
                      "metrics", lambda: srv.request("GET", "/metrics", timeout=CLIENT_TIMEOUT)),
                      daemon=True)]
        probes += [threading.Thread(target=self.slow_reader, args=(merchants[i % 3],),
                                    daemon=True) for i in range(SLOW_READERS)]
        for t in threads + probes:
            t.start()

        deadline = time.monotonic() + 20
        while self.acked_count() < WARMUP_ACKS and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertGreaterEqual(self.acked_count(), WARMUP_ACKS, "too little load before")

        if MODE == "sigstop":
            replayer, t_auth, first = self.start_replayer(srv.new_merchant(), ch)
            probes.append(replayer)
        t_down_begin = self.now()
        if MODE == "stop":
            self.dbs.crash()
        else:
            self.dbs.freeze()
        t_down = self.now()
        time.sleep(DOWN_SECONDS)
        t_up_begin = self.now()
        if MODE == "stop":
            self.dbs.start()
        else:
            self.dbs.thaw()
        t_up = self.now()

        # The same idemd serves again, without a restart.
        t_healthy = None
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            try:
                if srv.request("GET", "/healthz", timeout=CLIENT_TIMEOUT).status == 200:
                    t_healthy = self.now()
                    break
            except OSError:
                pass
            time.sleep(0.1)
        self.assertIsNotNone(t_healthy, "idemd's /healthz never turned 200 after the database "
                             "came back\n" + srv.log_tail())
        self.assertIsNone(srv.proc.poll(), "idemd exited")
        self.assertEqual(srv.proc.pid, pid_before)
        acks_at_healthy = self.acked_count()
        time.sleep(AFTER_HEALTHY)
        self.stop_load.set()
        for t in threads:
            t.join(100)
        self.stop_probe.set()
        for t in probes:
            t.join(CLIENT_TIMEOUT + 5)
        self.assertFalse(any(t.is_alive() for t in threads), "a client is still waiting")
        t_last = self.now()
        self.assertEqual(self.failures, [])

        if os.environ.get("IDEM_TEST_VERBOSE"):
            for a in self.attempts:
                if a.t_recv - a.t_send > 1 or (a.resp is not None and a.resp.status != 201
                                               and a.resp.status != 200):
                    sys.stderr.write("slow or failed: %r\n" % a)
            for p in self.probes:
                if p[2] - p[1] > 1 or p[3] is None or p[3].status != 200:
                    sys.stderr.write("probe: %r\n" % (p,))
        timeline = ("timeline (s): down %.2f..%.2f, back %.2f..%.2f, healthy %.2f"
                    % (t_down_begin, t_down, t_up_begin, t_up, t_healthy))
        sys.stderr.write("\n%s %s: %s\n" % (BACKEND, MODE, timeline))

        # ---- every answer -----------------------------------------------------------
        bad, in_window, replays_after_503, late = [], [], 0, []
        for a in self.attempts:
            r = a.resp
            if r is None:
                bad.append("no answer: %r" % a)
                continue
            if 200 <= r.status < 300:
                if r.header("Idempotent-Replayed") is not None:
                    earlier = [b for b in self.attempts if b.req is a.req and b.n < a.n]
                    # only after a 503 or a client timeout (the no-answer
                    # itself is reported below): its COMMIT may have happened
                    if not earlier or any(b.resp is not None and b.resp.status != 503
                                          for b in earlier):
                        bad.append("replay of a request never executed: %r" % a)
                    else:
                        replays_after_503 += 1
            elif r.status == 503:
                p = r.json()
                if p.get("code") != "store_unavailable" or not r.header("Retry-After") or \
                        (r.header("Content-Type") or "").split(";")[0] != \
                        "application/problem+json" or r.header("Idempotent-Replayed"):
                    bad.append("503 is not a store_unavailable problem: %r" % a)
            else:
                bad.append("neither 2xx nor 503: %r" % a)
            # Answered while the database was gone. A request sent before
            # may have committed just before and be answered a moment late;
            # past GRACE nothing from before the outage may be a 2xx either.
            if a.t_recv <= t_up_begin and (a.t_send >= t_down or a.t_recv >= t_down + GRACE):
                in_window.append(a)
                if r.status != 503 and a.t_send < t_down:
                    # Sent before the outage and acknowledged late: its
                    # COMMIT returned before the stop (durability is checked
                    # below: it must be in SQL), but the answer was held up
                    # (a writer's COMMIT that returned as the server froze).
                    # Reported, not a failure; bounded by the deadline check.
                    late.append(a)
                elif r.status != 503:
                    bad.append("answered while the database was gone: %r" % a)
            if a.t_send >= t_healthy and not (200 <= r.status < 300):
                bad.append("not served after /healthz was 200 again: %r" % a)
        self.assertEqual(bad, [], "\n".join(bad[:20]) + "\n" + timeline + "\n" +
                         srv.log_tail(30))
        self.assertGreater(len(in_window), 0, "no answer arrived while the database was "
                           "gone: nothing was proved\n" + timeline)
        probes_down = [p for p in self.probes if p[2] <= t_up_begin and
                       (p[1] >= t_down or p[2] >= t_down + GRACE)]
        for what, ts, tr, r, e in self.probes:
            self.assertIsNotNone(r, "%s probe got no answer: %s" % (what, e))
            ok = {"read": (404, 503), "metrics": (200,)}.get(what, (200, 503))
            self.assertIn(r.status, ok, "%s probe %r" % (what, r))
            if r.status == 503:
                self.assertNotEqual(what, "metrics", "/metrics needs no store: %r" % r)
                self.assertIsNotNone(r.header("Retry-After"), "%s probe %r" % (what, r))
                if what != "healthz":
                    self.assertEqual(r.json().get("code"), "store_unavailable", r)
        for what, ts, tr, r, e in probes_down:
            if what != "metrics":
                self.assertEqual(r.status, 503, "%s answered while the database was gone: %r"
                                 % (what, r))
        self.assertGreater(self.acked_count(), acks_at_healthy, "nothing served after return")

        # ---- bounded waits (issue 13) ------------------------------------------------
        # The client's clock alone, from the request sent to the answer read:
        # it includes any wait before idemd read the request (a request
        # queued behind a libmicrohttpd thread that a store wait held, as
        # before GETs ran on the request pool), which idemd's own log cannot
        # see. idemd's times are printed beside it.
        own = {}
        for ln in srv.log_text().splitlines():
            m = re.search(r"req=(\S+) .* (\d+\.\d+)ms$", ln)
            if m:
                own[m.group(1)] = float(m.group(2)) / 1000.0

        def idemd_time(r):
            return own.get(r.header("X-Request-Id") or "") if r is not None else None

        bound = REQUEST_TIMEOUT + DEADLINE_SLACK
        slow = ["%s %.2fs at the client (idemd %s): %r"
                % (a.req.kind, a.t_recv - a.t_send, idemd_time(a.resp), a)
                for a in self.attempts if a.t_recv - a.t_send > bound]
        slow += ["%s probe %.2fs at the client (idemd %s, sent %.2f)"
                 % (p[0], p[2] - p[1], idemd_time(p[3]), p[1])
                 for p in self.probes if p[2] - p[1] > bound]
        slow += ["/metrics %.2fs at the client (idemd %s, sent %.2f)"
                 % (p[2] - p[1], idemd_time(p[3]), p[1])
                 for p in self.probes if p[0] == "metrics" and p[2] - p[1] > HEALTHZ_BOUND]
        health_down = [p for p in probes_down if p[0] == "healthz" and p[1] >= t_down]
        if MODE == "sigstop":
            self.assertGreater(len(health_down), 0, "no /healthz probe while frozen")
            slow += ["/healthz %.2fs at the client (idemd %s) to say %d while frozen"
                     % (tr - ts, idemd_time(r), r.status)
                     for what, ts, tr, r, e in health_down if tr - ts > HEALTHZ_BOUND]
            reads_down = [p for p in probes_down if p[0] == "read" and p[3].status == 503]
            self.assertGreater(len(reads_down), 0, "no slow read answered while frozen")
            fast = self.check_replays(t_down, t_up_begin, t_auth, first)
            sys.stderr.write("%s %s: replays while frozen, key cached: %d, max %.3fs, mean "
                             "%.3fs\n" % (BACKEND, MODE, len(fast), max(fast),
                                          sum(fast) / len(fast)))
        self.assertEqual(slow, [], "answers slower than the bounds (deadline %.0fs + %.0fs, "
                         "/healthz and /metrics %.1fs):\n%s\n%s"
                         % (REQUEST_TIMEOUT, DEADLINE_SLACK, HEALTHZ_BOUND,
                            "\n".join(slow[:20]), timeline))

        def stat(ts):
            ts = ts or [0.0]
            return "max %.3fs, mean %.3fs" % (max(ts), sum(ts) / len(ts))

        probes_in = probes_down
        sys.stderr.write(
            "%s %s (client clock; deadline %.0fs): /healthz while down: %d probes, %s (idemd "
            "max %.3fs); /metrics while down: %d, %s; slow reads while down: %d, %s; "
            "slowest POST %.2fs; slowest GET /v1/balance %.2fs\n"
            % (BACKEND, MODE, REQUEST_TIMEOUT, len(health_down),
               stat([p[2] - p[1] for p in health_down]),
               max([idemd_time(p[3]) or 0.0 for p in health_down] or [0.0]),
               sum(1 for p in probes_in if p[0] == "metrics"),
               stat([p[2] - p[1] for p in probes_in if p[0] == "metrics"]),
               sum(1 for p in probes_in if p[0] == "read"),
               stat([p[2] - p[1] for p in probes_in if p[0] == "read"]),
               max([a.t_recv - a.t_send for a in self.attempts] or [0.0]),
               max([p[2] - p[1] for p in self.probes if p[0] == "balance"] or [0.0])))

        # ---- nothing acknowledged is missing -----------------------------------------
        with self.lock:
            reqs = list(self.reqs)
        for req in reqs:
            self.assertIsNotNone(req.acked, "never acknowledged: %s %s" % (req.kind, req.key))
        expected = {m.id: 0 for m in merchants}
        pay_ids = set()
        for req in reqs:
            if req.kind == "notification":
                expected[req.merchant.id] += req.amount
            elif req.kind == "refund":
                expected[req.merchant.id] -= req.amount
            else:
                pay_ids.add(req.acked.resp.json()["id"])
        self.assertEqual(len(pay_ids), sum(1 for r in reqs if r.kind == "payment"),
                         "two payment keys answered with one payment id")

        # a retry of each acknowledged request replays byte for byte
        for req in reqs:
            first = req.acked.resp
            if first.header("Idempotent-Replayed") is not None:
                continue  # acknowledged by a replay: compared below through its id
            again = req.send(srv)
            self.assertEqual((again.status, again.header("Idempotent-Replayed"), again.body),
                             (first.status, "true", first.body),
                             "retry of acknowledged %s %s" % (req.kind, req.key))
        for req in reqs:
            if req.kind == "payment":
                p = req.merchant.payment(req.acked.resp.json()["id"])
                self.assertEqual(p["amount"], req.amount)
                self.assertIn(p["status"], ("succeeded", "partially_refunded"), p)
        for m in merchants:
            self.assertEqual(m.balance("CNY"), expected[m.id], "balance of %s" % m.id)

        ids = ",".join("'%s'" % m.id for m in merchants)
        rows = {r[0] for r in self.db.sql("SELECT id FROM payments WHERE merchant_id IN (%s)"
                                          % ids)}
        self.assertEqual(rows, pay_ids, "payments in SQL != acknowledged payments")
        self.assertEqual(int(self.db.scalar("SELECT count(*) FROM refunds")),
                         sum(1 for r in reqs if r.kind == "refund"), "refunds in SQL")
        bal = {r[0]: int(r[1]) for r in self.db.sql(
            "SELECT merchant_id, amount FROM balances WHERE currency = 'CNY'")}
        led = {r[0]: int(r[1]) for r in self.db.sql(
            "SELECT merchant_id, SUM(amount) FROM ledger_entries WHERE currency = 'CNY'"
            " GROUP BY merchant_id")}
        self.assertEqual(bal, led, "balances differ from their ledger sums")
        self.assertEqual(bal, {k: v for k, v in expected.items() if v or k in bal})

        t_checked = self.now()
        slowest = max(self.attempts, key=lambda a: a.t_recv - a.t_send)
        n503 = sum(1 for a in self.attempts if a.resp is not None and a.resp.status == 503)
        log = srv.log_text()
        errline = next((ln for ln in log.splitlines() if "store failure" in ln), "")
        sys.stderr.write("%s %s: %d logical requests, %d attempts, %d answered 503 (%d while "
                         "gone), %d retries acknowledged by a replay; %d GET probes while "
                         "gone; slowest answer %.1fs (%d, sent at %.1f); load %.1fs, checks %.1fs\n"
                         "  e.g. %s\n"
                         % (BACKEND, MODE, len(reqs), len(self.attempts), n503, len(in_window),
                            replays_after_503, len(probes_down),
                            slowest.t_recv - slowest.t_send, slowest.resp.status,
                            slowest.t_send, t_last, t_checked - t_last,
                            errline[:200]))
        if late:
            sys.stderr.write("%s %s: %d sent before the outage acknowledged late (committed "
                             "before it), "
                             "slowest %.1fs\n"
                             % (BACKEND, MODE, len(late),
                                max(a.t_recv - a.t_send for a in late)))
        srv.stop_checked()


if __name__ == "__main__":
    dbserver.preflight(BACKEND, private=True)
    unittest.main(verbosity=2)
