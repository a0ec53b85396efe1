"""Crash loop (issue 13): load, kill -9 of idemd at a random moment, restart,
check; round after round on one database:

    python3 tests/fault/test_crash_loop.py sqlite|postgres|mariadb [idemd|db] [ROUNDS]

ROUNDS defaults to $IDEM_CRASH_ROUNDS or 20 (make test); make test-long runs
200. $IDEM_CRASH_SEED makes the random choices repeatable (the seed is
printed). Each round starts idemd (group commit on or off, picked at
random), runs client threads that pay, settle by channel callback, refund and
transfer, each request under its own Idempotency-Key (or natural key), and
SIGKILLs idemd after a random delay. Requests whose answer was lost in the
kill are "in doubt". Then a new idemd on the same database must show:

- every acknowledged request of the round present: each retry replays the
  byte-identical answer with Idempotent-Replayed: true, each acknowledged
  payment readable by id with its amount;
- every in-doubt request resolved by its retry: 2xx, either the replay of
  what committed before the kill or its first and only execution;
- no double execution: payments, refunds, transfers, notifications and
  ledger entries counted in SQL equal the logical requests that succeeded;
- balances equal to their ledger sums (SQL) and to the client's own totals
  (GET /v1/balance).

Target db (PostgreSQL, MariaDB; $IDEM_DBCRASH_ROUNDS or 10 rounds): the
database server is the one hit, mid-load and so mostly mid-COMMIT, on a
private throwaway server: odd rounds crash it (pg_ctl stop -m immediate /
SIGKILL of mariadbd) and restart it, even rounds SIGSTOP every server
process for 0.2-3 s and SIGCONT them. One idemd runs through all rounds
and must serve again without a restart; a request answered 503 is in
doubt, and the same checks follow.

At the end a sample of acknowledged requests from every round is retried
once more, and one summary line is printed (rounds, requests, kills, in
doubt) for docs/reliability.md. PostgreSQL / MariaDB: the shared server of
the test run (kill -9 hits idemd, never the database server), or a private
one; without the binaries SKIPPED (exit 77), a failure when CI is set.
"""

import contextlib
import http.client
import os
import random
import signal
import sqlite3
import sys
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbserver  # noqa: E402
from dbserver import harness  # noqa: E402
from harness import uid  # noqa: E402

ARGS = sys.argv[1:]
del sys.argv[1:]
BACKEND = ARGS.pop(0) if ARGS else "sqlite"
TARGET = ARGS.pop(0) if ARGS and ARGS[0] in ("idemd", "db") else "idemd"
if BACKEND not in ("sqlite",) + dbserver.BACKENDS or (TARGET == "db" and BACKEND == "sqlite"):
    sys.stderr.write("usage: test_crash_loop.py sqlite|postgres|mariadb [idemd|db] [ROUNDS]\n")
    sys.exit(2)
if ARGS:
    ROUNDS = int(ARGS[0])
elif TARGET == "db":
    ROUNDS = int(os.environ.get("IDEM_DBCRASH_ROUNDS", "10"))
else:
    ROUNDS = int(os.environ.get("IDEM_CRASH_ROUNDS", "20"))
SEED = int(os.environ.get("IDEM_CRASH_SEED", str(random.SystemRandom().randrange(1 << 30))))
CLIENTS = 6
MERCHANTS = 3
CREDIT = 1000          # each payment, settled in full by its callback
REFUND = 10            # at most one refund per payment
TRANSFER = 5


class Req:
    """One logical request: sent until it has an answer; retried after each
    kill under the same key and body."""

    def __init__(self, op, merchant, path, body, key, effect):
        self.op = op                # pay | notify | refund | transfer
        self.merchant = merchant    # harness.Merchant (None for notify)
        self.path = path
        self.body = harness.dumps(body)
        self.key = key
        self.effect = effect        # {(merchant_id, "CNY"): delta} once it succeeds
        self.answer = None          # the first 2xx answer received
        self.round = None


class CrashLoop(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dbserver.require_idemd()
        cls.rng = random.Random(SEED)
        cls.srv = None
        cls.private = None
        cls.db = None
        cls.servers = []
        import tempfile
        cls.tmpdir = tempfile.mkdtemp(prefix="idem-crash-srv-")
        cls.tmp = None
        if BACKEND == "sqlite":
            import tempfile
            cls.tmp = tempfile.mkdtemp(prefix="idem-crash-")
            cls.db_url = "sqlite:" + os.path.join(cls.tmp, "idem.db")
        elif TARGET == "db":
            cls.private = dbserver.private_server(BACKEND)
            cls.db = dbserver.Database(cls.private.admin_url(), "k")
            cls.db_url = cls.db.url
        else:
            cls.srv = dbserver.server_for(BACKEND)
            admin = cls.srv.__enter__()
            cls.db = dbserver.Database(admin, "k")
            cls.db_url = cls.db.url

    @classmethod
    def tearDownClass(cls):
        import shutil
        for s in cls.servers:
            s.cleanup()
        if not os.environ.get("IDEM_TEST_KEEP"):
            shutil.rmtree(cls.tmpdir, ignore_errors=True)
        if cls.db is not None and cls.private is None:
            cls.db.drop()
        if cls.private is not None:
            cls.private.cleanup()
        if cls.srv is not None:
            cls.srv.__exit__(None, None, None)
        if cls.tmp and not os.environ.get("IDEM_TEST_KEEP"):
            import shutil
            shutil.rmtree(cls.tmp, ignore_errors=True)

    # -- plumbing -------------------------------------------------------------

    def start(self):
        args = ["--threads", "8", "--batch-max", str(self.rng.choice((1, 16, 64)))]
        s = harness.Server(args, db_url=self.db_url, tmpdir=self.tmpdir)
        self.servers.append(s)  # killed in tearDownClass whatever happens
        s.start()
        return s

    def send(self, server, req, timeout=10):
        if req.op == "notify":
            h = {"Content-Type": "application/json",
                 "X-Signature": harness.sign(self.channel.secret, req.body)}
            return server.request("POST", req.path, req.body, h, timeout=timeout)
        return req.merchant.on(server).post(req.path, req.body, key=req.key, timeout=timeout)

    def sql_rows(self, query):
        if BACKEND == "sqlite":
            path = harness.sqlite_path(self.db_url)
            with contextlib.closing(sqlite3.connect(
                    "file:%s?mode=ro" % urllib.parse.quote(path), uri=True, timeout=10)) as db:
                return [[str(v) for v in row] for row in db.execute(query)]
        return dbserver.sql(self.db_url, query)

    def count(self, table):
        return int(self.sql_rows("SELECT count(*) FROM %s" % table)[0][0])

    # -- one round ------------------------------------------------------------

    def client(self, server, i, stop, lock, out):
        """Pay, settle, refund, transfer, in a loop, until the kill."""
        rng = random.Random(self.rng.random() + i)
        merchants = self.merchants
        while not stop.is_set():
            m = merchants[rng.randrange(len(merchants))]
            chain = []
            order = uid("O")
            pay = Req("pay", m, "/v1/payments",
                      {"merchant_order_no": order, "amount": CREDIT, "currency": "CNY",
                       "channel": self.channel.name},
                      uid("KP") if rng.random() < 0.7 else None, {})
            chain.append(pay)
            for req in chain:
                with lock:
                    out.append(req)
                try:
                    r = self.send(server, req, timeout=60)
                except (OSError, http.client.HTTPException, AttributeError):
                    # AttributeError: http.client when the socket dies mid-read
                    if TARGET == "db":
                        raise       # idemd must keep answering
                    return          # killed: req stays in doubt
                if TARGET == "db" and r.status == 503:
                    time.sleep(0.05)
                    break           # in doubt; retried after the round
                if not 200 <= r.status < 300:
                    raise AssertionError("%s answered %r" % (req.op, r))
                req.answer = r
                if req.op == "pay":
                    pid = r.json()["id"]
                    chain.append(Req("notify", None, "/v1/notifications/" + self.channel.name,
                                     {"notify_id": uid("N"), "payment_id": pid,
                                      "channel_txn_id": uid("TX"), "status": "SUCCESS",
                                      "amount": CREDIT},
                                     None, {(m.id, "CNY"): CREDIT}))
                elif req.op == "notify":
                    if rng.random() < 0.5:
                        chain.append(Req("refund", m, "/v1/refunds",
                                         {"refund_request_no": uid("R"), "payment_id":
                                          req_pid(req), "amount": REFUND},
                                         uid("KR"), {(m.id, "CNY"): -REFUND}))
                    else:
                        to = merchants[(merchants.index(m) + 1) % len(merchants)]
                        chain.append(Req("transfer", m, "/v1/transfers",
                                         {"transfer_no": uid("T"), "to_merchant": to.id,
                                          "amount": TRANSFER, "currency": "CNY"},
                                         uid("KT"), {(m.id, "CNY"): -TRANSFER,
                                                     (to.id, "CNY"): TRANSFER}))

    def hit_database(self, n):
        """Odd rounds: crash the server and restart it; even: freeze it."""
        if n % 2:
            self.private.crash()
            self.private.start()
        else:
            self.private.freeze()
            time.sleep(self.rng.uniform(0.2, 3.0))
            self.private.thaw()

    def wait_healthy(self, server, n):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.assertIsNone(server.proc.poll(), "round %d: idemd exited\n%s"
                              % (n, server.log_tail()))
            try:
                if server.request("GET", "/healthz", timeout=30).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("round %d: idemd not healthy 60 s after the database came back"
                             % n)

    def round(self, n):
        s1 = self.idemd if TARGET == "db" else self.start()
        stop = threading.Event()
        lock = threading.Lock()
        reqs = []
        errors = []

        def run(t_target):
            try:
                t_target()
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=run, args=(lambda i=i: self.client(
            s1, i, stop, lock, reqs),), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        delay = self.rng.uniform(0.05, 1.5)
        time.sleep(delay)
        if TARGET == "db":
            self.hit_database(n)
            time.sleep(0.5)
        else:
            s1.send_signal(signal.SIGKILL)
            s1.proc.wait(10)
        stop.set()
        for t in threads:
            t.join(90)
        if TARGET == "idemd":
            s1.stop()
        self.assertEqual(errors, [], "a request failed (before the kill)")
        for r in reqs:
            r.round = n
        acked = [r for r in reqs if r.answer is not None]
        doubt = [r for r in reqs if r.answer is None]

        s2 = self.start() if TARGET == "idemd" else s1
        if TARGET == "db":
            self.wait_healthy(s2, n)
        try:
            # every acknowledged request is there and replays
            for r in acked:
                again = self.send(s2, r)
                self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                                 (r.answer.status, r.answer.body, "true"),
                                 "round %d: acknowledged %s did not replay" % (n, r.op))
                if r.op == "pay":
                    p = r.merchant.on(s2).payment(r.answer.json()["id"])
                    self.assertEqual(p["amount"], CREDIT)
            # every request in doubt is resolved by its retry, once
            replayed = 0
            for r in doubt:
                again = self.send(s2, r)
                self.assertTrue(200 <= again.status < 300,
                                "round %d: retry of in-doubt %s: %r" % (n, r.op, again))
                replayed += again.header("Idempotent-Replayed") == "true"
                r.answer = again
                confirm = self.send(s2, r)
                self.assertEqual((confirm.status, confirm.body), (again.status, again.body))
            self.all.extend(reqs)
            self.check_totals(s2, n)
        finally:
            if TARGET == "idemd":
                s2.stop_checked()
        self.stats["acked"] += len(acked)
        self.stats["doubt"] += len(doubt)
        self.stats["doubt_committed"] += replayed
        self.stats["kills"] += 1
        return len(acked), len(doubt), replayed, delay

    def check_totals(self, server, n):
        """No double execution; balances = ledger = the client's totals."""
        done = {"pay": 0, "notify": 0, "refund": 0, "transfer": 0}
        expected = {}
        for r in self.all:
            done[r.op] += 1
            for k, v in r.effect.items():
                expected[k] = expected.get(k, 0) + v
        got = {t: self.count(t) for t in ("payments", "notifications", "refunds", "transfers",
                                          "ledger_entries")}
        want = {"payments": done["pay"], "notifications": done["notify"],
                "refunds": done["refund"], "transfers": done["transfer"],
                "ledger_entries": done["notify"] + done["refund"] + 2 * done["transfer"]}
        self.assertEqual(got, want, "round %d: rows in SQL != requests that succeeded" % n)
        bal = {(m, c): int(a) for m, c, a in self.sql_rows(
            "SELECT merchant_id, currency, amount FROM balances")}
        led = {(m, c): int(a) for m, c, a in self.sql_rows(
            "SELECT merchant_id, currency, SUM(amount) FROM ledger_entries "
            "GROUP BY merchant_id, currency")}
        self.assertEqual({k: v for k, v in bal.items() if v}, {k: v for k, v in led.items() if v},
                         "round %d: balances differ from ledger sums" % n)
        for m in self.merchants:
            self.assertEqual(m.on(server).balance("CNY"), expected.get((m.id, "CNY"), 0),
                             "round %d: balance of %s differs from the client's total" % (n, m.id))

    # -- the test -------------------------------------------------------------

    def test_crash_loop(self):
        self.all = []
        self.stats = {"acked": 0, "doubt": 0, "doubt_committed": 0, "kills": 0}
        setup = self.start()
        try:
            self.channel = setup.new_channel()
            self.merchants = [setup.new_merchant() for _ in range(MERCHANTS)]
        finally:
            setup.stop_checked()
        t0 = time.monotonic()
        print("crash loop on %s, target %s: %d rounds, seed %d (IDEM_CRASH_SEED)"
              % (BACKEND, TARGET, ROUNDS, SEED), flush=True)
        self.idemd = self.start() if TARGET == "db" else None
        for n in range(1, ROUNDS + 1):
            a, d, c, delay = self.round(n)
            if n == 1 or n % 10 == 0 or n == ROUNDS:
                print("round %3d: kill at %.2fs, %d acknowledged, %d in doubt (%d had "
                      "committed); totals %d requests" % (n, delay, a, d, c, len(self.all)),
                      flush=True)
        if self.idemd is not None:
            self.idemd.stop_checked()
        # once more: a sample from every round still replays
        final = self.start()
        try:
            sample = self.rng.sample(self.all, min(300, len(self.all)))
            for r in sample:
                again = self.send(final, r)
                self.assertEqual((again.status, again.body), (r.answer.status, r.answer.body),
                                 "round %d %s no longer replays" % (r.round, r.op))
            self.check_totals(final, ROUNDS)
        finally:
            final.stop_checked()
        st = self.stats
        case = ("crash loop (kill -9 idemd)" if TARGET == "idemd"
                else "database crash / SIGSTOP mid-load")
        harness_result(case, BACKEND, ROUNDS, st["kills"], len(self.all),
                       "lost 0, double 0, in doubt %d resolved" % st["doubt"])
        print("RESULT crash_loop %s %s: rounds=%d kills=%d requests=%d acknowledged=%d "
              "in_doubt=%d (committed before the kill: %d) replay_sample=%d lost=0 double=0 "
              "time=%.0fs" % (BACKEND, TARGET, ROUNDS, st["kills"], len(self.all), st["acked"],
                              st["doubt"], st["doubt_committed"], len(sample),
                              time.monotonic() - t0), flush=True)


def harness_result(case, backend, rounds, faults, requests, outcome):
    """One row of the summary table make test-long prints (docs/reliability.md)."""
    path = os.environ.get("IDEM_RESULTS_FILE")
    if path:
        with open(path, "a") as f:
            f.write("%s\t%s\t%d\t%d\t%d\t%s\n" % (case, backend, rounds, faults, requests,
                                                    outcome))


def req_pid(notify_req):
    return __import__("json").loads(notify_req.body)["payment_id"]


if __name__ == "__main__":
    if BACKEND != "sqlite":
        dbserver.preflight(BACKEND, private=TARGET == "db")
    else:
        dbserver.require_idemd()
    unittest.main(verbosity=2)
