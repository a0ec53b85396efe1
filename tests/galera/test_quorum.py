"""Quorum lost on the 3-node Galera cluster (issue 14):

    python3 tests/galera/test_quorum.py

One idemd per node under steady traffic (as in test_node_kill.py). Node 2
is killed -9, and once the cluster has evicted it, node 3: node 1 is left
alone, non-primary (it cannot tell a crash of the other two from a
partition, so it must not take writes). Proved: while quorum is lost, node
1's idemd answers 503 store_unavailable and nothing else, to new requests
and to the copies the clients retry (a copy whose first answer it committed
before the loss excepted: its front cache replays that), and /healthz
answers 503; when node 3
returns (start.sh), the last primary component re-forms by itself
(pc.recovery) and node 1's idemd serves again (the seconds from start.sh
to its first 201 are measured and printed); afterwards node 2 rejoins too,
every acknowledged payment and credit is there exactly once, the balances
exact. All nodes are Synced at the end.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import galera  # noqa: E402
from galera import harness  # noqa: E402

LAST = 0              # node 1 is left alone
FIRST, SECOND = 1, 2  # killed in this order; SECOND comes back first
LOST_FOR = 4.0        # seconds the lone node is probed without quorum


class Quorum(galera.ClusterTest):
    def test_quorum_lost_and_regained(self):
        cl, srv = self.cluster, self.setup.servers
        ch = srv[0].new_channel()
        ms = [srv[0].new_merchant() for _ in range(3)]
        lone = ms[0].on(srv[LAST])
        probes = galera.Answers()
        traffic = galera.Traffic(self.setup, ms, ch, workers=3).start()
        try:
            time.sleep(2)
            cl.kill(FIRST)
            for i in (LAST, SECOND):
                cl.wait(i, cl.n - 1, timeout=60)
            cl.kill(SECOND)
            t_lost = time.monotonic()
            nonprimary = cl.wait(LAST, 1, primary=False, timeout=60)
            # Without quorum: node 1's idemd refuses, promptly and only with 503.
            health = []
            t0 = time.monotonic()
            while time.monotonic() - t0 < LOST_FOR:
                body = ms[0].payment_body(999, "CNY", ch.name)
                r = lone.post("/v1/payments", body, key=harness.uid("QK"))
                probes.add(time.monotonic(), LAST, r.status, galera.code_of(r), r.replayed)
                h = harness.http_request(srv[LAST].port, "GET", "/healthz", timeout=10)
                health.append(h.status)
                time.sleep(0.2)
            acked_before = len(traffic.acked)
            t_ret = time.monotonic()
            cl.start(SECOND)
            back = None
            # One payment, retried as a client would (same key) until it is 201.
            body = ms[0].payment_body(555, "CNY", ch.name)
            key = harness.uid("QR")
            while time.monotonic() - t_ret < 120:
                try:
                    r = lone.post("/v1/payments", body, key=key)
                except OSError:
                    r = None
                if r is not None:
                    probes.add(time.monotonic(), LAST, r.status, galera.code_of(r), r.replayed)
                    if r.status == 201:
                        back = time.monotonic() - t_ret
                        traffic.acked.append((ms[0], body["merchant_order_no"], 555,
                                              r.json()["id"], False))
                        break
                time.sleep(0.1)
            if back is None:
                self.fail("node 1 did not serve again within 120 s of node 3's start.sh; last"
                          " answer: %s\n%s\nnode 1's idemd:\n%s"
                          % (probes.rows[-1] if probes.rows else None, cl.describe(),
                             srv[LAST].log_tail()))
            primary = cl.wait(LAST, cl.n - 1, timeout=60)
            cl.start(FIRST)
            for i in range(cl.n):
                cl.wait(i, cl.n, timeout=120)
            time.sleep(2)
        finally:
            traffic.stop()

        lost = [r for r in probes.rows if r[0] < t_ret]
        self.assertTrue(lost, "node 1 was never probed without quorum")
        self.assertEqual([r for r in lost if (r[2], r[3]) != (503, "store_unavailable")], [],
                         "node 1 without quorum answered other than 503 store_unavailable")
        self.assertEqual(set(health), {503}, "/healthz without quorum: %r" % health)
        self.assertEqual(probes.bad(), [], "probes answered other than 2xx / 503")
        during = [r for r in traffic.answers.rows if t_lost + nonprimary < r[0] < t_ret]
        # A copy whose first answer node 1's idemd committed before quorum was
        # lost is answered from its front cache as the replay it is (the two
        # copies' ids are compared in traffic.wrong); nothing else but 503.
        self.assertEqual([r for r in during if r[2] != 503 and not (r[2] in (200, 201) and r[4])],
                         [], "the traffic got answers other than 503 or a cached replay"
                         " without quorum")
        self.assertEqual(traffic.wrong, [], "wrong answers")
        self.assertEqual(traffic.unfinished, [], "operations without a final answer")
        self.assertEqual(traffic.answers.bad(), [], "answers other than 2xx or 503")
        galera.note("\ngalera quorum: node 1 non-primary %.1fs after the second kill; %d probes"
                    " and %d retried copies without quorum, all 503; serving again %.1fs after"
                    " node 3's start.sh (Primary with 2 nodes after %.1fs more); %d payments"
                    " acknowledged before, %d in all"
                    % (nonprimary, len(lost), len(during), back, primary, acked_before,
                       len(traffic.acked)))
        galera.check_exactly_once(self, cl, self.setup, traffic)


if __name__ == "__main__":
    galera.main()
