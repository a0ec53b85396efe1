"""Injected I/O faults on SQLite (issue 13): fsync / fdatasync / write /
pwrite failing with EIO or ENOSPC under load, through the LD_PRELOAD shim
tests/fault/iofault.c (only the database's files fail; logs never do):

    python3 tests/fault/test_iofault.py [ROUNDS]

ROUNDS defaults to $IDEM_IOFAULT_ROUNDS or 16 (make test; make test-long:
200); $IDEM_IOFAULT_SEED repeats a run. Each round picks a fault (errno,
calls, rate 100% or 30%) and runs clients that pay and settle while it is
on. Proved each round:

- while a fault is on, every answer is 2xx or 503 (never another 5xx, never
  a crash); with a 100% fault on the calls a commit needs, no write is
  acknowledged at all (an acknowledged write always has its fsync);
- once the fault is off, idemd recovers without a restart: a new write
  succeeds within 10 s (or idemd exits non-zero with a message, which the
  test counts as a fatal exit and restarts: never a hang);
- every request answered 503 resolves on retry to exactly one execution
  (a replay when it had committed after all), every acknowledged one
  replays byte for byte, also after kill -9 and a restart;
- rows in SQL equal the requests that succeeded, balances equal their
  ledger sums and the client's totals, PRAGMA integrity_check says ok.
"""

import contextlib
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbserver  # noqa: E402
from dbserver import harness  # noqa: E402
from harness import uid  # noqa: E402

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else \
    int(os.environ.get("IDEM_IOFAULT_ROUNDS", "16"))
del sys.argv[1:]
SEED = int(os.environ.get("IDEM_IOFAULT_SEED", str(random.SystemRandom().randrange(1 << 30))))
SHIM = os.environ.get("IDEM_IOFAULT_SHIM")
CLIENTS = 4
CREDIT = 1000
# (errno, calls, percent); the first rounds walk through every combination.
FAULTS = [(e, ops, pct) for pct in (100, 30) for e in ("EIO", "ENOSPC")
          for ops in ("fsync,fdatasync", "write,pwrite")]


class Req:
    def __init__(self, op, merchant, path, body, key, effect):
        self.op, self.merchant, self.path, self.key, self.effect = op, merchant, path, key, effect
        self.body = harness.dumps(body)
        self.answer = None      # the first 2xx answer
        self.failed = 0         # 503 answers seen


class IoFault(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not SHIM or not os.path.exists(SHIM):
            raise unittest.SkipTest("IDEM_IOFAULT_SHIM (build/tests/fault/iofault.so) not set")
        cls.tmp = tempfile.mkdtemp(prefix="idem-iofault-")
        cls.dbdir = os.path.join(cls.tmp, "db") + os.sep
        os.mkdir(cls.dbdir)
        cls.db_url = "sqlite:" + os.path.join(cls.dbdir, "idem.db")
        cls.ctl = os.path.join(cls.tmp, "ctl")
        cls.counter = os.path.join(cls.tmp, "count")
        cls.servers = []
        cls.set_fault(None)

    @classmethod
    def tearDownClass(cls):
        for s in getattr(cls, "servers", []):
            s.cleanup()  # no idemd outlives a failed round
        if not os.environ.get("IDEM_TEST_KEEP"):
            import shutil
            shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def set_fault(cls, fault):
        with open(cls.ctl + ".new", "w") as f:
            f.write("off\n" if fault is None else "%s %s %d\n" % fault)
        os.replace(cls.ctl + ".new", cls.ctl)
        time.sleep(0.05)  # the shim re-reads the file every 20 ms

    def faults_injected(self):
        try:
            with open(self.counter) as f:
                n = int(f.read().split()[0] or 0)
        except (OSError, ValueError, IndexError):
            n = 0
        with contextlib.suppress(OSError):
            os.unlink(self.counter)
        return n

    def start(self):
        env = {"LD_PRELOAD": SHIM, "IDEM_IOFAULT_CTL": self.ctl,
               "IDEM_IOFAULT_MATCH": self.dbdir, "IDEM_IOFAULT_COUNT": self.counter,
               # Under `make test-asan` the shim is preloaded ahead of the
               # ASan runtime, which ASan refuses by default; its calls go on
               # to ASan's interceptors through RTLD_NEXT, so the order is
               # safe. Ignored by a binary without ASan.
               "ASAN_OPTIONS": ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"),
                                                      "verify_asan_link_order=0"]))}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            s = harness.Server(["--threads", "8", "--batch-max",
                                str(self.rng.choice((1, 64)))],
                               db_url=self.db_url, tmpdir=self.srvdir)
            self.servers.append(s)
            s.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return s

    def send(self, server, req, timeout=15):
        if req.op == "notify":
            h = {"Content-Type": "application/json",
                 "X-Signature": harness.sign(self.channel.secret, req.body)}
            return server.request("POST", req.path, req.body, h, timeout=timeout)
        return req.merchant.on(server).post(req.path, req.body, key=req.key, timeout=timeout)

    def sql_rows(self, query):
        path = harness.sqlite_path(self.db_url)
        with contextlib.closing(sqlite3.connect(
                "file:%s?mode=ro" % urllib.parse.quote(path), uri=True, timeout=10)) as db:
            return [list(row) for row in db.execute(query)]

    # -- load -----------------------------------------------------------------

    def new_pay(self, m):
        return Req("pay", m, "/v1/payments",
                   {"merchant_order_no": uid("O"), "amount": CREDIT, "currency": "CNY",
                    "channel": self.channel.name}, uid("KP"), {})

    def new_notify(self, m, pid):
        return Req("notify", None, "/v1/notifications/" + self.channel.name,
                   {"notify_id": uid("N"), "payment_id": pid, "channel_txn_id": uid("TX"),
                    "status": "SUCCESS", "amount": CREDIT}, None, {m.id: CREDIT})

    def client(self, server, stop, lock, out, seen, errors):
        rng = random.Random(self.rng.random())
        try:
            while not stop.is_set():
                m = self.merchants[rng.randrange(len(self.merchants))]
                req = self.new_pay(m)
                while req is not None and not stop.is_set():
                    with lock:
                        out.append(req)
                    r = self.send(server, req)
                    with lock:
                        seen.append(r.status)
                    if r.status == 503:
                        req.failed += 1
                        time.sleep(0.02)  # a client backs off; this one retries later
                        break
                    if not 200 <= r.status < 300:
                        raise AssertionError("%s answered %r" % (req.op, r))
                    req.answer = r
                    req = self.new_notify(m, r.json()["id"]) if req.op == "pay" else None
        except OSError as e:
            errors.append("connection failed under a fault (idemd died?): %r" % e)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    # -- one round ------------------------------------------------------------

    def round(self, n, fault):
        s = self.start()
        stop, lock = threading.Event(), threading.Lock()
        reqs, seen, errors = [], [], []
        self.set_fault(fault)
        threads = [threading.Thread(target=self.client, args=(s, stop, lock, reqs, seen, errors),
                                    daemon=True) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        time.sleep(self.rng.uniform(0.5, 1.5))
        stop.set()
        for t in threads:
            t.join(60)
        self.set_fault(None)
        fatal = s.proc.poll() is not None
        if not fatal:
            self.assertEqual(errors, [], "round %d %s: %s" % (n, fault, errors))
        bad = [st for st in seen if not (200 <= st < 300 or st == 503)]
        self.assertEqual(bad, [], "round %d %s: answers other than 2xx/503" % (n, fault))
        acked_during = [r for r in reqs if r.answer is not None]
        if fault[2] == 100 and fault[1] == "fsync,fdatasync":
            # every commit needs an fdatasync: nothing may be acknowledged
            self.assertEqual([r.op for r in acked_during], [],
                             "round %d %s: writes acknowledged without their fsync"
                             % (n, fault))

        # recovery without a restart, or a clear fatal exit
        deadline = time.monotonic() + 10
        probe = self.new_pay(self.merchants[0])
        recovered = False
        while not fatal and time.monotonic() < deadline:
            if s.proc.poll() is not None:
                fatal = True
                break
            try:
                r = self.send(s, probe, timeout=5)
            except OSError:
                continue
            if 200 <= r.status < 300:
                probe.answer = r
                recovered = True
                break
            self.assertEqual(r.status, 503, "round %d: recovery probe %r" % (n, r))
            time.sleep(0.2)
        reqs.append(probe)
        if fatal:
            rc = s.proc.wait(10)
            self.assertNotEqual(rc, 0, "idemd exited 0 under an I/O fault")
            self.assertIn("error", s.log_text().lower(), "idemd died without saying why")
            self.stats["fatal"] += 1
        else:
            self.assertTrue(recovered, "round %d %s: no write succeeded 10 s after the fault "
                            "ended (idemd neither recovered nor exited)" % (n, fault))
        self.stats["faults"] += self.faults_injected()

        # retry everything unanswered; acknowledged answers replay
        if fatal:
            s.stop()
            s = self.start()
        for r in reqs:
            again = self.send(s, r)
            if r.answer is None:
                self.assertTrue(200 <= again.status < 300,
                                "round %d: retry of a %s answered 503: %r" % (n, r.op, again))
                self.stats["failed_then_replayed" if again.header("Idempotent-Replayed")
                           else "failed_then_run"] += 1
                r.answer = again
            else:
                self.assertEqual((again.status, again.body), (r.answer.status, r.answer.body),
                                 "round %d: acknowledged %s did not replay" % (n, r.op))
        # the pay requests that were 503 have their callback still to come
        for r in list(reqs):
            if r.op == "pay" and not any(x.op == "notify" and r.answer.json()["id"] in
                                         x.body.decode() for x in reqs):
                note = self.new_notify(r.merchant, r.answer.json()["id"])
                note.answer = self.send(s, note)
                self.assertEqual(note.answer.status, 200, "callback after recovery")
                reqs.append(note)
        self.all.extend(reqs)

        # durable: kill -9, restart, all still there
        s.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        s.stop()
        s = self.start()
        try:
            for r in reqs:
                again = self.send(s, r)
                self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                                 (r.answer.status, r.answer.body, "true"),
                                 "round %d: %s lost after kill -9" % (n, r.op))
            self.check_totals(s, n)
        finally:
            s.stop_checked()
        self.faults_injected()
        self.stats["requests"] += len(reqs)
        self.stats["acked_during"] += len(acked_during)
        self.stats["503"] += sum(1 for st in seen if st == 503)
        return len(acked_during), sum(1 for st in seen if st == 503)

    def check_totals(self, server, n):
        pays = sum(1 for r in self.all if r.op == "pay")
        notes = sum(1 for r in self.all if r.op == "notify")
        got = [self.sql_rows("SELECT count(*) FROM %s" % t)[0][0]
               for t in ("payments", "notifications", "ledger_entries")]
        self.assertEqual(got, [pays, notes, notes],
                         "round %d: payments, notifications, ledger rows != requests" % n)
        self.assertEqual(self.sql_rows("PRAGMA integrity_check"), [["ok"]])
        bal = {m: a for m, a in self.sql_rows(
            "SELECT merchant_id, amount FROM balances WHERE currency = 'CNY'")}
        led = {m: a for m, a in self.sql_rows(
            "SELECT merchant_id, SUM(amount) FROM ledger_entries WHERE currency = 'CNY' "
            "GROUP BY merchant_id")}
        self.assertEqual(bal, led, "round %d: balances differ from ledger sums" % n)
        for m in self.merchants:
            want = sum(r.effect.get(m.id, 0) for r in self.all)
            self.assertEqual(m.on(server).balance("CNY"), want,
                             "round %d: balance of %s" % (n, m.id))

    def test_io_faults(self):
        self.rng = random.Random(SEED)
        self.srvdir = os.path.join(self.tmp, "srv")
        os.mkdir(self.srvdir)
        self.all = []
        self.stats = dict.fromkeys(("faults", "fatal", "requests", "acked_during", "503",
                                    "failed_then_replayed", "failed_then_run"), 0)
        setup = self.start()
        try:
            self.channel = setup.new_channel()
            self.merchants = [setup.new_merchant() for _ in range(3)]
        finally:
            setup.stop_checked()
        print("I/O faults on sqlite: %d rounds, seed %d (IDEM_IOFAULT_SEED)" % (ROUNDS, SEED),
              flush=True)
        t0 = time.monotonic()
        for n in range(1, ROUNDS + 1):
            fault = FAULTS[n - 1] if n <= len(FAULTS) else self.rng.choice(FAULTS)
            acked, failed = self.round(n, fault)
            if n <= len(FAULTS) or n % 20 == 0 or n == ROUNDS:
                print("round %3d: %-6s %-15s %3d%%: %3d acknowledged, %3d answered 503"
                      % ((n,) + fault + (acked, failed)), flush=True)
        st = self.stats
        self.assertGreater(st["faults"], 0, "no fault was ever injected: is the shim loaded?")
        self.assertGreater(st["503"], 0, "no request ever saw a fault")
        path = os.environ.get("IDEM_RESULTS_FILE")
        if path:
            with open(path, "a") as f:
                f.write("I/O faults (EIO, ENOSPC on fsync/write)\tsqlite\t%d\t%d\t%d\t"
                        "lost 0, double 0, %d answered 503 then resolved, %d fatal exits\n"
                        % (ROUNDS, st["faults"], st["requests"],
                           st["failed_then_replayed"] + st["failed_then_run"], st["fatal"]))
        print("RESULT iofault sqlite: rounds=%d faults=%d requests=%d acknowledged_under_fault=%d "
              "answered_503=%d retried_503: replayed=%d executed=%d fatal_exits=%d lost=0 "
              "double=0 time=%.0fs" % (ROUNDS, st["faults"], st["requests"], st["acked_during"],
                                       st["503"], st["failed_then_replayed"],
                                       st["failed_then_run"], st["fatal"],
                                       time.monotonic() - t0), flush=True)


if __name__ == "__main__":
    dbserver.require_idemd()
    unittest.main(verbosity=2)
