"""Concurrency: racing duplicates of one payment, racing duplicate
notifications, a seeded random mix of every write with retries checked
against a client-side model, and two-phase 409 request_in_progress."""

import concurrent.futures
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402

SEED = int(os.environ.get("IDEM_TEST_SEED", "20261001"))


def race(n, fn):
    """Run fn(i) in n threads released together by a barrier; returns the
    results in index order (exceptions are returned, not raised)."""
    barrier = threading.Barrier(n)

    def run(i):
        barrier.wait(10)
        return fn(i)

    out = [None] * n
    with concurrent.futures.ThreadPoolExecutor(n) as ex:
        futs = {ex.submit(run, i): i for i in range(n)}
        for f in concurrent.futures.as_completed(futs, timeout=60):
            try:
                out[futs[f]] = f.result()
            except Exception as e:  # noqa: BLE001
                out[futs[f]] = e
    return out


class Concurrency(harness.TestCase):
    SERVER_ARGS = ("--threads", "8")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()

    def assertNoErrors(self, results):
        errs = [r for r in results if isinstance(r, Exception)]
        self.assertEqual(errs, [], "requests failed at the transport level")

    def test_32_clients_same_payment(self):
        m = self.merchant()
        key = uid("K")
        body = m.payment_body(3200, "CNY", self.ch.name)
        rs = race(32, lambda i: m.post("/v1/payments", body, key=key))
        self.assertNoErrors(rs)
        firsts = [r for r in rs if r.header("Idempotent-Replayed") is None]
        self.assertEqual(len(firsts), 1, "exactly one executed: %r" % [r.status for r in rs])
        first = firsts[0]
        self.assertStatus(first, 201)
        for r in rs:
            if r is not first:
                self.assertReplayOf(r, first)
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)
        self.assertEqual(m.get("/v1/payments?merchant_order_no=" + body["merchant_order_no"])
                         .json()["id"], first.json()["id"])

    def test_32_clients_same_order_new_keys(self):
        # the business backstop under a race: one payment, 31 replays with 200
        m = self.merchant()
        body = m.payment_body(3300, "CNY", self.ch.name)
        keys = [uid("K%d" % i) for i in range(32)]
        rs = race(32, lambda i: m.post("/v1/payments", body, key=keys[i]))
        self.assertNoErrors(rs)
        self.assertEqual(sorted(r.status for r in rs), [200] * 31 + [201],
                         [(r.status, r.body[:120]) for r in rs])
        ids = {r.json()["id"] for r in rs}
        self.assertEqual(len(ids), 1)
        for r in rs:
            if r.status == 200:
                self.assertEqual(r.header("Idempotent-Replayed"), "true")
            else:
                self.assertIsNone(r.header("Idempotent-Replayed"))
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)

    def test_200_duplicate_notifications(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 2000)
        main = self.ch.body(p["id"], 2000)
        others = [self.ch.body(p["id"], 2000) for _ in range(10)]  # late deliveries
        bodies = [harness.dumps(main)] * 100 + [harness.dumps(others[i % 10]) for i in range(100)]
        random.Random(SEED).shuffle(bodies)
        with concurrent.futures.ThreadPoolExecutor(32) as ex:
            rs = list(ex.map(lambda b: self.ch.post(b), bodies, timeout=60))
        for r in rs:
            self.assertStatus(r, 200)
            self.assertEqual(r.json(), {"result": "success"})
        executed = [r for r in rs if r.header("Idempotent-Replayed") is None]
        self.assertEqual(len(executed), 11, "one execution per distinct notify_id")
        self.assertEqual(m.balance("CNY"), 2000)
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        self.assertLedger()
        rows = self.server.ledger_rows(m.id)
        if rows is not None:
            self.assertEqual(rows, [("CNY", 2000)])

    def test_random_mix_with_retries(self):
        rng0 = random.Random(SEED)
        merchants = [self.merchant() for _ in range(4)]
        by_id = {mm.id: mm for mm in merchants}
        workers, ops_per_worker = 6, 45
        deadline = time.monotonic() + 30
        lock = threading.Lock()
        # client-side model (transfers and refunds recorded from 201 answers)
        credits, debits = {}, {}   # (merchant_id, currency) -> amount
        payments = {}              # payment id -> model dict
        problems = []
        stats = {"ops": 0, "retries": 0}

        def add(d, k, v):
            with lock:
                d[k] = d.get(k, 0) + v

        def check(cond, what):
            if not cond:
                with lock:
                    problems.append(what)

        def send(fn, retry):
            r = fn()
            if retry:
                again = fn()
                with lock:
                    stats["retries"] += 1
                check(again.status == r.status and again.body == r.body and
                      again.header("Idempotent-Replayed") == "true",
                      "retry not a replay: first %r, retry %r" % (r, again))
            return r

        seeds = [rng0.getrandbits(64) for _ in range(workers)]

        def worker(i):
            rng = random.Random(seeds[i])
            mine = []
            for _ in range(ops_per_worker):
                if time.monotonic() > deadline:
                    break
                with lock:
                    stats["ops"] += 1
                retry = rng.random() < 0.30
                op = rng.random()
                if op < 0.35 or not mine:
                    mm = rng.choice(merchants)
                    cur = "CNY" if rng.random() < 0.8 else "USD"
                    body = mm.payment_body(rng.randint(100, 5000), cur, self.ch.name)
                    key = uid("K") if rng.random() < 0.5 else None
                    r = send(lambda: mm.post("/v1/payments", body, key=key), retry)
                    check(r.status == 201, "payment: %r" % r)
                    if r.status == 201:
                        pm = {"id": r.json()["id"], "m": mm.id, "cur": cur,
                              "amount": body["amount"], "status": "processing", "refunded": 0}
                        mine.append(pm)
                        with lock:
                            payments[pm["id"]] = pm
                elif op < 0.60:
                    pm = rng.choice(mine)
                    st = "SUCCESS" if rng.random() < 0.85 else "FAILED"
                    body = harness.dumps(self.ch.body(pm["id"], pm["amount"], st))
                    r = send(lambda: self.ch.post(body), retry)
                    check(r.status == 200, "notification: %r" % r)
                    if r.status == 200 and pm["status"] == "processing":
                        pm["status"] = "succeeded" if st == "SUCCESS" else "failed"
                        if st == "SUCCESS":
                            add(credits, (pm["m"], pm["cur"]), pm["amount"])
                elif op < 0.80:
                    pm = rng.choice(mine)
                    amt = rng.randint(1, pm["amount"])
                    body = {"refund_request_no": uid("R"), "payment_id": pm["id"], "amount": amt}
                    mm = by_id[pm["m"]]
                    r = send(lambda: mm.post("/v1/refunds", body), retry)
                    if pm["status"] not in ("succeeded", "partially_refunded"):
                        check(r.status == 409 and r.json().get("code") == "payment_not_refundable",
                              "refund of %s payment: %r" % (pm["status"], r))
                    elif pm["refunded"] + amt > pm["amount"]:
                        check(r.status == 409 and r.json().get("code") == "refund_exceeds_payment",
                              "refund beyond the payment: %r" % r)
                    elif r.status == 201:
                        pm["refunded"] += amt
                        pm["status"] = ("refunded" if pm["refunded"] == pm["amount"]
                                        else "partially_refunded")
                        add(debits, (pm["m"], pm["cur"]), amt)
                    else:
                        check(r.status == 409 and r.json().get("code") == "insufficient_balance",
                              "refund: %r" % r)
                else:
                    src, dst = rng.sample(merchants, 2)
                    cur = "CNY" if rng.random() < 0.8 else "USD"
                    body = {"transfer_no": uid("T"), "to_merchant": dst.id,
                            "amount": rng.randint(1, 3000), "currency": cur}
                    key = uid("K") if rng.random() < 0.5 else None
                    r = send(lambda: src.post("/v1/transfers", body, key=key), retry)
                    if r.status == 201:
                        add(debits, (src.id, cur), body["amount"])
                        add(credits, (dst.id, cur), body["amount"])
                    else:
                        check(r.status == 409 and r.json().get("code") == "insufficient_balance",
                              "transfer: %r" % r)

        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            for f in [ex.submit(worker, i) for i in range(workers)]:
                f.result(timeout=90)
        self.assertEqual(problems, [])
        self.assertGreater(stats["retries"], 0)

        # every balance equals the model, and in total: credits - refunds
        for mm in merchants:
            got = mm.balances()
            for cur in ("CNY", "USD"):
                want = credits.get((mm.id, cur), 0) - debits.get((mm.id, cur), 0)
                self.assertEqual(got.get(cur, 0), want, "%s %s" % (mm.id, cur))
                self.assertGreaterEqual(got.get(cur, 0), 0)
        for cur in ("CNY", "USD"):
            total = sum(mm.balances().get(cur, 0) for mm in merchants)
            paid = sum(p["amount"] for p in payments.values()
                       if p["cur"] == cur and p["status"] != "processing" and p["status"] != "failed")
            refunded = sum(p["refunded"] for p in payments.values() if p["cur"] == cur)
            self.assertEqual(total, paid - refunded, cur)
        # every payment is in the state the model expects
        for p in payments.values():
            got = by_id[p["m"]].payment(p["id"])
            self.assertEqual((got["status"], got["refunded_amount"]), (p["status"], p["refunded"]),
                             p["id"])
        ledger = self.server.ledger_check()
        if ledger is not None:
            for mm in merchants:
                for cur in ("CNY", "USD"):
                    self.assertEqual(ledger.get((mm.id, cur), 0),
                                     credits.get((mm.id, cur), 0) - debits.get((mm.id, cur), 0))


class TwoPhase(harness.TestCase):
    DELAY_MS = 1000
    SERVER_ARGS = ("--mock-channel-delay-ms", str(DELAY_MS), "--threads", "8")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.server.ensure_channel("mock")

    def start(self, fn):
        box = {}

        def run():
            try:
                box["r"] = fn()
            except Exception as e:  # noqa: BLE001
                box["r"] = e

        t = threading.Thread(target=run)
        t.start()
        return t, box

    def test_request_in_progress(self):
        m = self.merchant()
        key = uid("K")
        body = m.payment_body(1000, "CNY", "mock")
        t0 = time.monotonic()
        t, box = self.start(lambda: m.post("/v1/payments", body, key=key))
        time.sleep(0.3)
        dup = m.post("/v1/payments", body, key=key)
        self.assertLess(time.monotonic() - t0, self.DELAY_MS / 1000.0,
                        "the duplicate should be answered at once, not wait for the first")
        self.assertProblem(dup, 409, "request_in_progress")
        self.assertEqual(dup.header("Retry-After"), "1")
        self.assertIsNone(dup.header("Idempotent-Replayed"))
        # the natural key is claimed as well by then (backstop under another key)
        t.join(30)
        first = box["r"]
        self.assertNotIsInstance(first, Exception)
        self.assertFirst(first, 201)
        self.assertGreaterEqual(time.monotonic() - t0, self.DELAY_MS / 1000.0 * 0.9,
                                "the mock channel delay did not apply")
        # completed: duplicates replay the first answer
        self.assertReplayOf(m.post("/v1/payments", body, key=key), first)
        rec = m.record("payment", key)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["http_status"], 201)

    def test_other_merchant_same_key_not_blocked(self):
        a, b = self.merchant(), self.merchant()
        key = uid("K")
        order = uid("ORD")
        t, box = self.start(lambda: a.post("/v1/payments",
                                           a.payment_body(10, "CNY", "mock", order=order), key=key))
        time.sleep(0.3)
        rb = b.post("/v1/payments", b.payment_body(10, "CNY", "mock", order=order), key=key)
        self.assertFirst(rb, 201)
        t.join(30)
        self.assertFirst(box["r"], 201)
        self.assertNotEqual(rb.json()["id"], box["r"].json()["id"])

    def test_32_clients_two_phase(self):
        m = self.merchant()
        key = uid("K")
        body = m.payment_body(3200, "CNY", "mock")
        rs = race(32, lambda i: m.post("/v1/payments", body, key=key))
        errs = [r for r in rs if isinstance(r, Exception)]
        self.assertEqual(errs, [])
        firsts = [r for r in rs if r.status == 201 and r.header("Idempotent-Replayed") is None]
        self.assertEqual(len(firsts), 1, [(r.status, r.body[:100]) for r in rs])
        busy = 0
        for r in rs:
            if r is firsts[0]:
                continue
            if r.status == 409:
                self.assertProblem(r, 409, "request_in_progress")
                self.assertEqual(r.header("Retry-After"), "1")
                busy += 1
            else:
                self.assertReplayOf(r, firsts[0])
        self.assertGreaterEqual(busy, 1, "32 racers inside a 1 s window, none saw 409")
        self.assertReplayOf(m.post("/v1/payments", body, key=key), firsts[0])
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)


if __name__ == "__main__":
    harness.main()
