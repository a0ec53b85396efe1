"""Two idemd processes on one PostgreSQL or MariaDB database under a
concurrent duplicate storm split across both (issue 4):

    python3 tests/fault/test_two_idemd.py postgres|mariadb

Every logical request (payment, notification, refund, transfer) is sent
several times at once, the copies split between instance A and instance B and
released together by a barrier: under one Idempotency-Key, under the natural
key alone, and under different Idempotency-Keys for one natural key (the
business backstop). Proved: exactly one copy executes (one answer without
Idempotent-Replayed), every other copy replays the first answer byte for
byte (or is the backstop's 200 replay of the same resource), nothing is 5xx,
409 request_in_progress or 422; afterwards both instances show one payment
per order number (GET by merchant_order_no), the state each payment must be
in, and balances equal to the totals computed client-side; in SQL the rows
are counted behind the API and every balance equals its ledger sum.
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbserver  # noqa: E402
from dbserver import harness  # noqa: E402
from harness import uid  # noqa: E402

BACKEND = dbserver.backend_arg()
ORDERS_PER_MERCHANT = 12


SENT = [0, 0]      # requests sent to instance A, B
EXECUTED = [0, 0]  # of which executed (no Idempotent-Replayed)
_count = threading.Lock()


def _sent(side):
    with _count:
        SENT[side] += 1


def storm(calls, timeout=60):
    return harness.storm(calls, timeout, sent=_sent)


class TwoIdemd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dbserver.require_idemd()
        cls.srv = dbserver.server_for(BACKEND)
        admin = cls.srv.__enter__()
        cls.db = None
        cls.servers = []
        try:
            cls.db = dbserver.Database(admin, "s")
            for _ in range(2):
                s = harness.Server(["--threads", "8"], db_url=cls.db.url)
                cls.servers.append(s)
                s.start()
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        bad = []
        try:
            for s in cls.servers:
                rc = s.stop()
                if rc != 0:
                    bad.append("idemd did not exit 0 on SIGTERM (rc=%r)\n%s" % (rc, s.log_tail()))
                s.cleanup()
            if cls.db is not None:
                cls.db.drop()
        finally:
            cls.srv.__exit__(None, None, None)
        if bad:
            raise AssertionError("\n".join(bad))

    # -- checks ---------------------------------------------------------------

    def assertOneExecution(self, rs, first_status, what, backstop=False):
        """rs: responses to copies of one logical request. Exactly one was
        executed; the rest replay it. Returns the executed response."""
        errs = [r for r in rs if isinstance(r, Exception)]
        self.assertEqual(errs, [], "%s: transport errors" % what)
        for r in rs:
            self.assertLess(r.status, 500, "%s: %r" % (what, r))
            self.assertNotIn(r.status, (422,), "%s: %r" % (what, r))
            if r.status == 409:
                self.assertNotEqual(r.json().get("code"), "request_in_progress",
                                    "%s: in progress in atomic mode: %r" % (what, r))
        firsts = [r for r in rs if r.header("Idempotent-Replayed") is None]
        self.assertEqual(len(firsts), 1, "%s: %d copies executed: %r"
                         % (what, len(firsts), [(r.status, r.body[:80]) for r in rs]))
        first = firsts[0]
        EXECUTED[first.side] += 1
        self.assertEqual(first.status, first_status, "%s: first answer %r" % (what, first))
        for r in rs:
            if r is first:
                continue
            self.assertEqual(r.header("Idempotent-Replayed"), "true", "%s: %r" % (what, r))
            if r.status == 200 and backstop and first_status == 201:
                # the backstop replay of the same resource
                self.assertEqual(r.json()["id"], first.json()["id"], what)
            else:
                self.assertEqual((r.status, r.body), (first.status, first.body),
                                 "%s: replay differs from the first answer" % what)
        return first

    # -- the storm ---------------------------------------------------------------

    def test_duplicate_storm_across_two_instances(self):
        t0 = time.monotonic()
        a, b = self.servers
        ch = a.new_channel()
        ms = [a.new_merchant() for _ in range(3)]
        on = {0: {m.id: m for m in ms}, 1: {m.id: m.on(b) for m in ms}}
        chan = {0: ch, 1: harness.Channel(b, ch.name, ch.secret)}
        expected = {m.id: 0 for m in ms}

        def pay_call(side, m, body, key):
            return side, lambda: on[side][m.id].post("/v1/payments", body, key=key)

        # 0. hot keys: 16 copies of one payment, 8 on each instance
        for _ in range(3):
            m = ms[0]
            body = m.payment_body(777, "CNY", ch.name)
            key = uid("HOT")
            rs = storm([pay_call(i % 2, m, body, key) for i in range(16)])
            self.assertOneExecution(rs, 201, "hot payment")

        # 1. payments: 4 copies each (A, B, A, B), 4 orders per storm
        orders = []  # (merchant, order_no, amount, payment_id, i)
        work = []
        for mi, m in enumerate(ms):
            for i in range(ORDERS_PER_MERCHANT):
                body = m.payment_body(1000 + 13 * i + mi, "CNY", ch.name)
                mode = i % 3
                if mode == 0:    # one Idempotency-Key
                    keys = [uid("K")] * 4
                elif mode == 1:  # natural key only
                    keys = [None] * 4
                else:            # a header key and the natural key: the backstop
                    k = uid("K")
                    keys = [k, None, k, None]
                work.append((m, body, keys, i))
        for g in range(0, len(work), 4):
            group = work[g:g + 4]
            calls = []
            for m, body, keys, _i in group:
                calls += [pay_call(c % 2, m, body, keys[c]) for c in range(4)]
            rs = storm(calls)
            for j, (m, body, keys, i) in enumerate(group):
                first = self.assertOneExecution(rs[4 * j:4 * j + 4], 201,
                                                "payment %s" % body["merchant_order_no"],
                                                backstop=True)
                orders.append((m, body["merchant_order_no"], body["amount"],
                               first.json()["id"], i))

        # 2. notifications: one notify_id 4 times (A, B, A, B), and a second
        #    notify_id for the same payment twice (A, B); every 4th payment FAILED
        state = {}
        for g in range(0, len(orders), 3):
            group = orders[g:g + 3]
            calls, spans = [], []
            for m, order, amount, pid, i in group:
                status = "FAILED" if i % 4 == 3 else "SUCCESS"
                txn = uid("TXN")
                n1 = harness.dumps(ch.body(pid, amount, status, uid("N"), txn))
                n2 = harness.dumps(ch.body(pid, amount, status, uid("N"), txn))
                start = len(calls)
                for c, nb in enumerate([n1, n1, n1, n1, n2, n2]):
                    side = c % 2
                    calls.append((side, lambda side=side, nb=nb: chan[side].post(nb)))
                spans.append((start, pid, m, amount, status))
            rs = storm(calls)
            for start, pid, m, amount, status in spans:
                one, two = rs[start:start + 4], rs[start + 4:start + 6]
                self.assertOneExecution(one, 200, "notification of %s" % pid)
                self.assertOneExecution(two, 200, "second notification of %s" % pid)
                for r in one + two:
                    self.assertEqual(r.json(), {"result": "success"})
                if status == "SUCCESS":
                    expected[m.id] += amount
                    state[pid] = ["succeeded", 0]
                else:
                    state[pid] = ["failed", 0]

        # 3. refunds, 4 copies each: 300 off every even succeeded payment, and
        #    on every 6th a second refund larger than what is left (stored 409)
        refunds = 0
        calls, checks = [], []
        for m, order, amount, pid, i in orders:
            if state[pid][0] != "succeeded" or i % 2:
                continue
            rb = {"refund_request_no": uid("R"), "payment_id": pid, "amount": 300}
            key = uid("RK")
            checks.append((len(calls), 201, "refund of %s" % pid))
            for c in range(4):
                calls.append((c % 2, lambda c=c, m=m, rb=rb, key=key:
                              on[c % 2][m.id].post("/v1/refunds", rb, key=key)))
            expected[m.id] -= 300
            state[pid] = ["partially_refunded", 300]
            refunds += 1
        for s in range(0, len(checks), 4):
            part = checks[s:s + 4]
            lo, hi = part[0][0], part[-1][0] + 4
            rs = storm(calls[lo:hi])
            for off, st, what in part:
                self.assertOneExecution(rs[off - lo:off - lo + 4], st, what)
        big = []
        for m, order, amount, pid, i in orders:
            if i % 6 == 0 and state[pid][0] == "partially_refunded":
                rb = {"refund_request_no": uid("R"), "payment_id": pid, "amount": amount}
                big.append([(c % 2, lambda c=c, m=m, rb=rb:
                              on[c % 2][m.id].post("/v1/refunds", rb)) for c in range(4)])
        for calls4 in big:
            first = self.assertOneExecution(storm(calls4), 409, "oversized refund")
            self.assertEqual(first.json()["code"], "refund_exceeds_payment")

        # 4. transfers around the three merchants, 4 copies each, and one too
        #    large for the sender's balance (stored 409 insufficient_balance)
        transfers = 0
        for rnd in range(2):
            calls, plan = [], []
            for k in range(3):
                src, dst = ms[k], ms[(k + 1) % 3]
                amt = 100 * (k + 1) + rnd
                tb = {"transfer_no": uid("T"), "to_merchant": dst.id, "amount": amt,
                      "currency": "CNY"}
                key = uid("TK")
                plan.append((len(calls), src, dst, amt))
                for c in range(4):
                    calls.append((c % 2, lambda c=c, src=src, tb=tb, key=key:
                                  on[c % 2][src.id].post("/v1/transfers", tb, key=key)))
            rs = storm(calls)
            for off, src, dst, amt in plan:
                self.assertOneExecution(rs[off:off + 4], 201, "transfer %d" % amt)
                expected[src.id] -= amt
                expected[dst.id] += amt
                transfers += 1
        tb = {"transfer_no": uid("T"), "to_merchant": ms[1].id,
              "amount": expected[ms[0].id] + 1, "currency": "CNY"}
        first = self.assertOneExecution(
            storm([(c % 2, lambda c=c: on[c % 2][ms[0].id].post("/v1/transfers", tb))
                   for c in range(4)]),
            409, "transfer beyond the balance")
        self.assertEqual(first.json()["code"], "insufficient_balance")

        # ---- afterwards: the same state on both instances ----------------------
        for m, order, amount, pid, i in orders:
            for side in (0, 1):
                r = on[side][m.id].get("/v1/payments?merchant_order_no=" + order)
                self.assertEqual(r.status, 200, r)
                p = r.json()
                self.assertEqual(p["id"], pid, "order %s names another payment" % order)
                self.assertEqual([p["status"], p["refunded_amount"]], state[pid],
                                 "payment %s on instance %s" % (pid, "AB"[side]))
        for m in ms:
            for side in (0, 1):
                self.assertEqual(on[side][m.id].balance("CNY"), expected[m.id],
                                 "balance of %s on instance %s" % (m.id, "AB"[side]))

        # ---- and behind the API, in SQL ----------------------------------------------
        ids = ",".join("'%s'" % m.id for m in ms)
        db = self.db
        rows = db.sql("SELECT merchant_id, merchant_order_no, count(*) FROM payments"
                      " WHERE merchant_id IN (%s) GROUP BY merchant_id, merchant_order_no"
                      " HAVING count(*) > 1" % ids)
        self.assertEqual(rows, [], "order numbers with more than one payment")
        self.assertEqual(int(db.scalar("SELECT count(*) FROM payments WHERE merchant_id IN (%s)"
                                       % ids)), 3 + len(orders), "payments in SQL")
        self.assertEqual(int(db.scalar("SELECT count(*) FROM refunds")), refunds,
                         "refunds in SQL")
        self.assertEqual(int(db.scalar("SELECT count(*) FROM transfers")), transfers,
                         "transfers in SQL")
        self.assertEqual(int(db.scalar("SELECT count(*) FROM notifications")),
                         2 * len(orders), "notifications in SQL (two notify_ids each)")
        paid = sum(1 for p in state.values() if p[0] != "failed")
        self.assertEqual(int(db.scalar("SELECT count(*) FROM ledger_entries")),
                         paid + refunds + 2 * transfers,
                         "ledger entries: one per credit, refund and transfer leg")
        bal = {r[0]: int(r[1]) for r in db.sql(
            "SELECT merchant_id, amount FROM balances WHERE currency = 'CNY'")}
        led = {r[0]: int(r[1]) for r in db.sql(
            "SELECT merchant_id, SUM(amount) FROM ledger_entries WHERE currency = 'CNY'"
            " GROUP BY merchant_id")}
        self.assertEqual(bal, led, "balances differ from their ledger sums")
        self.assertEqual(bal, expected, "balances in SQL differ from the client's totals")

        # the storm really was split: both instances executed first requests
        self.assertGreater(EXECUTED[0], 0, "instance A executed nothing")
        self.assertGreater(EXECUTED[1], 0, "instance B executed nothing")
        sys.stderr.write("\n%s: %d requests to A (%d executed), %d to B (%d executed); "
                         "%d payments, %d refunds, %d transfers; %.1fs\n"
                         % (BACKEND, SENT[0], EXECUTED[0], SENT[1], EXECUTED[1],
                            len(orders) + 3, refunds, transfers, time.monotonic() - t0))


if __name__ == "__main__":
    dbserver.preflight(BACKEND, private=False)
    unittest.main(verbosity=2)
