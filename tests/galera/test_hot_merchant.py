"""Distinct refunds of one merchant, at once on all three nodes: every one
is 201, none a 503 (issue 13):

    python3 tests/galera/test_hot_merchant.py

What made the storm flaky, without the duplicates around it. Every refund
of a merchant takes the merchant's lock (merchants.lock_version) and debits
its balance row, so refunds of one merchant committed by three nodes at
once conflict in certification (1213 at COMMIT) or brute-force abort each
other (1213 on a statement). The loser is rolled back whole and rerun, and
unlike a duplicate's rerun (which finds the winner's claim and replays it)
it meets the same hot rows again: with K such refunds in flight, the last
may lose K-1 times in a row. None of this is a store failure, every node is
healthy, and each rerun costs milliseconds; a payment engineer expects every
refund to end in 201. idemd on main gives a unit 4 attempts (--max-retries
is 3, src/server/main.c, sized for SQLite's 2 s busy waits), and then answers
503 store_unavailable.

ROUNDS rounds of REFUNDS refunds (REFUNDS / 3 on each node), each on a
payment of its own, each under a key of its own. Proved: every answer is
201 and executed (not a replay); afterwards, on every node, the refund rows,
the payments' refunded amounts, one debit per refund, and the balance equal
to its ledger sum and to the client's total. The certification conflicts
and brute-force aborts the cluster saw are printed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import galera  # noqa: E402
from galera import dbserver, harness  # noqa: E402
from harness import uid  # noqa: E402

REFUNDS = 9
ROUNDS = 4
AMOUNT, PART = 5000, 100


def conflicts(cluster):
    """Certification failures plus brute-force aborts, summed over the nodes."""
    n = 0
    for i in range(cluster.n):
        st = cluster.status(i)
        n += int(st.get("wsrep_local_cert_failures", 0)) + \
            int(st.get("wsrep_local_bf_aborts", 0))
    return n


class HotMerchant(galera.ClusterTest):
    def test_refunds_of_one_merchant_on_three_nodes(self):
        srv, cl = self.setup.servers, self.cluster
        ch = srv[0].new_channel()
        m = srv[0].new_merchant()
        on = [m.on(s) for s in srv]
        pids = []
        for _ in range(REFUNDS):
            r = on[0].post("/v1/payments", m.payment_body(AMOUNT, "CNY", ch.name), key=uid("K"))
            self.assertEqual(r.status, 201, r)
            pids.append(r.json()["id"])
            n = ch.post(harness.dumps(ch.body(pids[-1], AMOUNT, "SUCCESS", uid("N"))))
            self.assertEqual(n.status, 200, n)
        c0 = conflicts(cl)
        for rnd in range(ROUNDS):
            calls = []
            for j, pid in enumerate(pids):
                rb = {"refund_request_no": uid("R"), "payment_id": pid, "amount": PART}
                key = uid("RK")
                calls.append((j % 3, lambda j=j, rb=rb, key=key:
                              on[j % 3].post("/v1/refunds", rb, key=key)))
            rs = galera.storm(calls)
            for j, r in enumerate(rs):
                self.assertNotIsInstance(r, Exception, "round %d refund %d" % (rnd, j))
                if (r.status, r.header("Idempotent-Replayed")) != (201, None):
                    self.fail("round %d, refund %d on node %d: %r\nthat node's idemd:\n%s"
                              % (rnd + 1, j + 1, j % 3 + 1, r, srv[j % 3].log_tail()))
        total = REFUNDS * AMOUNT - ROUNDS * REFUNDS * PART
        for i in range(cl.n):
            node = galera.NodeDb(cl, self.setup, i)
            self.assertEqual(dbserver.sql(node.url, "SELECT count(*), sum(amount) FROM refunds"),
                             [[str(ROUNDS * REFUNDS), str(ROUNDS * REFUNDS * PART)]],
                             "node %d: refund rows" % (i + 1))
            self.assertEqual(dbserver.sql(node.url, "SELECT DISTINCT refunded_amount, status"
                                          " FROM payments WHERE merchant_id = '%s'" % m.id),
                             [[str(ROUNDS * PART), "partially_refunded"]],
                             "node %d: the payments' refunded amounts" % (i + 1))
            self.assertEqual(dbserver.sql(node.url, "SELECT count(*) FROM ledger_entries"
                                          " WHERE merchant_id = '%s' AND amount < 0" % m.id),
                             [[str(ROUNDS * REFUNDS)]], "node %d: debits" % (i + 1))
            self.assertEqual(galera.ledger_sql(node), {m.id: total},
                             "node %d: the balance" % (i + 1))
            self.assertEqual(on[i].balance("CNY"), total, "balance through node %d" % (i + 1))
        galera.note("\ngalera hot merchant: %d refunds of one merchant, %d at once; %d"
                    " certification failures and brute-force aborts"
                    % (ROUNDS * REFUNDS, REFUNDS, conflicts(cl) - c0))


if __name__ == "__main__":
    galera.main()
