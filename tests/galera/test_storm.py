"""A duplicate storm across a 3-node Galera cluster, one idemd per node
(issue 14):

    python3 tests/galera/test_storm.py

Every logical request (payment, notification, refund, transfer) is sent
several times at once, the copies spread over the three instances and
released together by a barrier, so the copies race on three different
database nodes: the loser either finds the winner's row already replicated
(errno 1062 on the claim: a duplicate) or fails certification (errno 1213 at
COMMIT: retried, then a duplicate). Proved: exactly one copy executes, every
other replays its answer byte for byte (or is the business backstop's 200
replay of the same resource), nothing is 5xx, 409 request_in_progress or
422; afterwards every instance shows the same payments and balances, equal
to the client's totals; in SQL (on each node) one row per order number and
every balance equal to its ledger sum. The run prints how many certification
conflicts the cluster saw (wsrep_local_cert_failures + wsrep_local_bf_aborts),
and asserts there were some: a storm that never raced across nodes would
prove nothing about Galera.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import galera  # noqa: E402
from galera import dbserver, harness  # noqa: E402
from harness import uid  # noqa: E402

NODES = 3
ORDERS_PER_MERCHANT = 12
EXECUTED = [0] * NODES
_count = threading.Lock()


def conflicts(cluster):
    """[certification failures, brute-force aborts] summed over the nodes."""
    n = [0, 0]
    for i in range(cluster.n):
        st = cluster.status(i)
        n[0] += int(st.get("wsrep_local_cert_failures", 0))
        n[1] += int(st.get("wsrep_local_bf_aborts", 0))
    return n


class GaleraStorm(galera.ClusterTest):
    def assertOneExecution(self, rs, first_status, what, backstop=False):
        errs = [r for r in rs if isinstance(r, Exception)]
        self.assertEqual(errs, [], "%s: transport errors" % what)
        for r in rs:
            self.assertLess(r.status, 500, "%s: %r" % (what, r))
            self.assertNotEqual(r.status, 422, "%s: %r" % (what, r))
            if r.status == 409:
                self.assertNotEqual(r.json().get("code"), "request_in_progress",
                                    "%s: in progress in atomic mode: %r" % (what, r))
        firsts = [r for r in rs if r.header("Idempotent-Replayed") is None]
        self.assertEqual(len(firsts), 1, "%s: %d copies executed: %r"
                         % (what, len(firsts), [(r.status, r.body[:80]) for r in rs]))
        first = firsts[0]
        with _count:
            EXECUTED[first.side] += 1
        self.assertEqual(first.status, first_status, "%s: first answer %r" % (what, first))
        for r in rs:
            if r is first:
                continue
            self.assertEqual(r.header("Idempotent-Replayed"), "true", "%s: %r" % (what, r))
            if r.status == 200 and backstop and first_status == 201:
                self.assertEqual(r.json()["id"], first.json()["id"], what)
            else:
                self.assertEqual((r.status, r.body), (first.status, first.body),
                                 "%s: replay differs from the first answer" % what)
        return first

    def test_duplicate_storm_across_three_nodes(self):
        t0 = time.monotonic()
        c0 = conflicts(self.cluster)
        srv = self.setup.servers
        ch = srv[0].new_channel()
        ms = [srv[0].new_merchant() for _ in range(3)]
        on = {s: {m.id: m.on(srv[s]) for m in ms} for s in range(NODES)}
        chan = {s: harness.Channel(srv[s], ch.name, ch.secret) for s in range(NODES)}
        expected = {m.id: 0 for m in ms}

        def pay_call(side, m, body, key):
            return side, lambda: on[side][m.id].post("/v1/payments", body, key=key)

        # 0. hot keys: 18 copies of one payment, 6 on each node
        for _ in range(3):
            m = ms[0]
            body = m.payment_body(777, "CNY", ch.name)
            key = uid("HOT")
            calls = [pay_call(i % 3, m, body, key) for i in range(18)]
            self.assertOneExecution(galera.storm(calls), 201, "hot payment")

        # 1. payments: 3 copies each (one per node), 6 orders per storm
        orders = []
        work = []
        for mi, m in enumerate(ms):
            for i in range(ORDERS_PER_MERCHANT):
                body = m.payment_body(1000 + 13 * i + mi, "CNY", ch.name)
                mode = i % 3
                if mode == 0:
                    keys = [uid("K")] * 3
                elif mode == 1:
                    keys = [None] * 3
                else:  # a header key and the natural key: the backstop
                    k = uid("K")
                    keys = [k, None, k]
                work.append((m, body, keys, i))
        for g in range(0, len(work), 6):
            group = work[g:g + 6]
            calls = []
            for j, (m, body, keys, _i) in enumerate(group):
                calls += [pay_call((c + j) % 3, m, body, keys[c]) for c in range(3)]
            rs = galera.storm(calls)
            for j, (m, body, keys, i) in enumerate(group):
                first = self.assertOneExecution(rs[3 * j:3 * j + 3], 201,
                                                "payment %s" % body["merchant_order_no"],
                                                backstop=True)
                orders.append((m, body["merchant_order_no"], body["amount"],
                               first.json()["id"], i))

        # 2. notifications: one notify_id 3 times (one per node), a second
        #    notify_id for the same payment twice; every 4th payment FAILED
        state = {}
        for g in range(0, len(orders), 3):
            group = orders[g:g + 3]
            calls, spans = [], []
            for j, (m, order, amount, pid, i) in enumerate(group):
                status = "FAILED" if i % 4 == 3 else "SUCCESS"
                txn = uid("TXN")
                n1 = harness.dumps(ch.body(pid, amount, status, uid("N"), txn))
                n2 = harness.dumps(ch.body(pid, amount, status, uid("N"), txn))
                start = len(calls)
                for c, nb in enumerate([n1, n1, n1, n2, n2]):
                    side = (c + j) % 3
                    calls.append((side, lambda side=side, nb=nb: chan[side].post(nb)))
                spans.append((start, pid, m, amount, status))
            rs = galera.storm(calls)
            for start, pid, m, amount, status in spans:
                one, two = rs[start:start + 3], rs[start + 3:start + 5]
                self.assertOneExecution(one, 200, "notification of %s" % pid)
                self.assertOneExecution(two, 200, "second notification of %s" % pid)
                for r in one + two:
                    self.assertEqual(r.json(), {"result": "success"})
                if status == "SUCCESS":
                    expected[m.id] += amount
                    state[pid] = ["succeeded", 0]
                else:
                    state[pid] = ["failed", 0]

        # 3. refunds, 3 copies each: 300 off every even succeeded payment
        refunds = 0
        calls, checks = [], []
        for m, order, amount, pid, i in orders:
            if state[pid][0] != "succeeded" or i % 2:
                continue
            rb = {"refund_request_no": uid("R"), "payment_id": pid, "amount": 300}
            key = uid("RK")
            checks.append((len(calls), "refund of %s" % pid))
            for c in range(3):
                calls.append((c, lambda c=c, m=m, rb=rb, key=key:
                              on[c][m.id].post("/v1/refunds", rb, key=key)))
            expected[m.id] -= 300
            state[pid] = ["partially_refunded", 300]
            refunds += 1
        for s in range(0, len(checks), 4):
            part = checks[s:s + 4]
            lo, hi = part[0][0], part[-1][0] + 3
            rs = galera.storm(calls[lo:hi])
            for off, what in part:
                self.assertOneExecution(rs[off - lo:off - lo + 3], 201, what)

        # 4. transfers around the three merchants (one merchant's balance is
        #    written by two nodes at once), 3 copies each
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
                for c in range(3):
                    calls.append(((c + k) % 3, lambda c=c, k=k, src=src, tb=tb, key=key:
                                  on[(c + k) % 3][src.id].post("/v1/transfers", tb, key=key)))
            rs = galera.storm(calls)
            for off, src, dst, amt in plan:
                self.assertOneExecution(rs[off:off + 3], 201, "transfer %d" % amt)
                expected[src.id] -= amt
                expected[dst.id] += amt
                transfers += 1

        # ---- afterwards: the same state on every node ------------------------------
        for m, order, amount, pid, i in orders:
            for side in range(NODES):
                r = on[side][m.id].get("/v1/payments?merchant_order_no=" + order)
                self.assertEqual(r.status, 200, r)
                p = r.json()
                self.assertEqual(p["id"], pid, "order %s names another payment" % order)
                self.assertEqual([p["status"], p["refunded_amount"]], state[pid],
                                 "payment %s on node %d" % (pid, side + 1))
        for m in ms:
            for side in range(NODES):
                self.assertEqual(on[side][m.id].balance("CNY"), expected[m.id],
                                 "balance of %s on node %d" % (m.id, side + 1))

        # ---- and behind the API, in SQL on every node ------------------------------
        ids = ",".join("'%s'" % m.id for m in ms)
        paid = sum(1 for p in state.values() if p[0] != "failed")
        for side in range(NODES):
            node = galera.NodeDb(self.cluster, self.setup, side)
            db = node.url
            rows = dbserver.sql(db, "SELECT merchant_id, merchant_order_no, count(*)"
                                " FROM payments GROUP BY merchant_id, merchant_order_no"
                                " HAVING count(*) > 1")
            self.assertEqual(rows, [], "node %d: order numbers with two payments" % (side + 1))
            counts = dbserver.sql(db, "SELECT (SELECT count(*) FROM payments WHERE merchant_id"
                                  " IN (%s)), (SELECT count(*) FROM refunds), (SELECT count(*)"
                                  " FROM transfers), (SELECT count(*) FROM notifications),"
                                  " (SELECT count(*) FROM ledger_entries)" % ids)[0]
            self.assertEqual([int(x) for x in counts],
                             [3 + len(orders), refunds, transfers, 2 * len(orders),
                              paid + refunds + 2 * transfers],
                             "node %d: payments, refunds, transfers, notifications, ledger"
                             % (side + 1))
            self.assertEqual(galera.ledger_sql(node), expected,
                             "node %d: balances differ from the client's totals" % (side + 1))

        for side in range(NODES):
            self.assertGreater(EXECUTED[side], 0, "node %d executed nothing" % (side + 1))
        c1 = conflicts(self.cluster)
        cert, bf = c1[0] - c0[0], c1[1] - c0[1]
        galera.note("\ngalera storm: executed per node %r; %d payments, %d refunds, %d transfers;"
                    " %d certification failures, %d brute-force aborts; %.1fs"
                    % (EXECUTED, len(orders) + 3, refunds, transfers, cert, bf,
                       time.monotonic() - t0))
        self.assertGreater(cert + bf, 0, "no copy ever lost certification: the storm did not race"
                           " across nodes")


if __name__ == "__main__":
    galera.main()
