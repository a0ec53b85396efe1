"""Shutdown and store faults: SIGTERM under load loses no acknowledged
write, in-flight requests finish, SIGINT exits 0, a locked store answers 503
store_unavailable (never a replay) and the retry runs afresh."""

import concurrent.futures
import contextlib
import os
import signal
import sqlite3
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402


class Shutdown(harness.TestCase):
    """Each test runs its own servers (restarts on one database)."""

    @classmethod
    def setUpClass(cls):
        pass

    @classmethod
    def tearDownClass(cls):
        pass

    def setUp(self):
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.cleanup()

    def server(self, *args, db_url=None, tmpdir=None):
        s = harness.Server(args, db_url=db_url, tmpdir=tmpdir)
        self.servers.append(s)
        return s.start()

    def test_sigterm_under_load_loses_nothing(self):
        s1 = self.server("--threads", "8")
        ch = s1.new_channel()
        m = s1.new_merchant()
        acked_pay, acked_notify, unsure_notify = [], [], []
        lock = threading.Lock()
        stop = threading.Event()
        bad = []

        def client(i):
            while not stop.is_set():
                body = m.payment_body(100 + i, "CNY", ch.name)
                key = uid("K")
                try:
                    r = m.post("/v1/payments", body, key=key)
                except OSError:
                    time.sleep(0.01)
                    continue
                if 200 <= r.status < 300:
                    with lock:
                        acked_pay.append((key, body, r))
                    nbody = harness.dumps(ch.body(r.json()["id"], body["amount"]))
                    try:
                        n = ch.post(nbody)
                    except OSError:
                        with lock:
                            unsure_notify.append(body["amount"])
                        continue
                    with lock:
                        if n.status == 200:
                            acked_notify.append((r.json()["id"], body["amount"]))
                        else:
                            unsure_notify.append(body["amount"])
                elif r.status not in (503,):
                    with lock:
                        bad.append(r)

        with concurrent.futures.ThreadPoolExecutor(6) as ex:
            futs = [ex.submit(client, i) for i in range(6)]
            time.sleep(1.0)
            t0 = time.monotonic()
            s1.send_signal(signal.SIGTERM)
            try:
                rc = s1.proc.wait(20)
            except Exception:
                rc = None
            stop.set()
            for f in futs:
                f.result(30)
        stopped_in = time.monotonic() - t0
        self.assertEqual(rc, 0, "idemd exit code on SIGTERM under load\n" + s1.log_tail())
        self.assertLess(stopped_in, 15)
        s1.stop()
        self.assertEqual(bad, [], "answers other than 2xx/503 during shutdown")
        self.assertGreater(len(acked_pay), 10, "too little load reached the server")

        s2 = self.server(db_url=s1.db_url, tmpdir=s1.tmpdir)
        m = m.on(s2)
        for key, body, r in acked_pay:
            pid = r.json()["id"]
            got = m.get("/v1/payments/" + pid)
            self.assertEqual(got.status, 200, "acknowledged payment %s missing after restart"
                             % pid)
            self.assertEqual(got.json()["merchant_order_no"], body["merchant_order_no"])
            # the stored answer survived as well
            again = m.post("/v1/payments", body, key=key)
            self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                             (r.status, r.body, "true"), pid)
        for pid, _amount in acked_notify:
            self.assertEqual(m.payment(pid)["status"], "succeeded", pid)
        low = sum(a for _p, a in acked_notify)
        bal = m.balance("CNY")
        self.assertGreaterEqual(bal, low)
        self.assertLessEqual(bal, low + sum(unsure_notify))
        s2.ledger_check()
        s2.stop_checked()

    def test_in_flight_request_finishes(self):
        s1 = self.server("--mock-channel-delay-ms", "1500")
        s1.ensure_channel("mock")
        m = s1.new_merchant()
        body = m.payment_body(4242, "CNY", "mock")
        key = uid("K")
        box = {}

        def run():
            try:
                box["r"] = m.post("/v1/payments", body, key=key)
            except Exception as e:  # noqa: BLE001
                box["r"] = e

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.4)
        s1.send_signal(signal.SIGTERM)
        t.join(30)
        rc = s1.stop()
        first = box.get("r")
        self.assertIsInstance(first, harness.Response, "in-flight request not answered: %r"
                              % (first,))
        self.assertEqual(first.status, 201, first)
        self.assertEqual(rc, 0, s1.log_tail())
        s2 = self.server(db_url=s1.db_url, tmpdir=s1.tmpdir)
        m = m.on(s2)
        self.assertEqual(m.payment(first.json()["id"])["amount"], 4242)
        again = m.post("/v1/payments", body, key=key)
        self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                         (201, first.body, "true"))
        s2.stop_checked()

    def test_sigint_exits_0(self):
        s = self.server()
        self.assertEqual(s.request("GET", "/healthz").status, 200)
        s.stop_checked(signal.SIGINT)

    def test_store_locked_503_then_fresh_retry(self):
        s = self.server()
        path = harness.sqlite_path(s.db_url)
        if path is None:
            self.skipTest("needs a SQLite database to lock")
        ch = s.new_channel()
        m = s.new_merchant()
        body = m.payment_body(555, "CNY", ch.name)
        key = uid("K")
        db = sqlite3.connect(path, timeout=10, isolation_level=None)
        box = {}
        try:
            db.execute("BEGIN EXCLUSIVE")   # hold the write lock: the store is stuck

            def run():
                try:
                    box["r"] = m.post("/v1/payments", body, key=key)
                except Exception as e:  # noqa: BLE001
                    box["r"] = e
                box["t"] = time.monotonic()

            t = threading.Thread(target=run)
            t.start()
            t.join(15)
            answered_while_locked = not t.is_alive()
        finally:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            db.close()
        t.join(30)
        r = box.get("r")
        self.assertTrue(answered_while_locked,
                        "no answer within 15 s while the store was locked (expected 503); "
                        "answer after unlocking: %r" % (r,))
        self.assertIsInstance(r, harness.Response, r)
        self.assertProblem(r, 503, "store_unavailable")
        self.assertIsNotNone(r.header("Retry-After"), r)
        self.assertIsNone(r.header("Idempotent-Replayed"))
        # nothing half-applied; the retry is executed afresh
        again = m.post("/v1/payments", body, key=key)
        self.assertEqual(again.status, 201, again)
        self.assertIsNone(again.header("Idempotent-Replayed"), again)
        self.assertEqual(s.count_payments(m.id, body["merchant_order_no"]), 1)
        # counted as a store error
        text = s.request("GET", "/metrics").body.decode()
        errs = sum(float(ln.split()[-1]) for ln in text.splitlines()
                   if ln.startswith("idem_store_errors_total"))
        self.assertGreater(errs, 0, "idem_store_errors_total after a 503")
        s.stop_checked()


if __name__ == "__main__":
    harness.main()
