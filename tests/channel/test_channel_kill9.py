#!/usr/bin/env python3
"""kill -9 of idemd in the middle of channel calls (issue 11).

Clients keep many payments in flight on a slow simulated channel (some
creates reset after creating), idemd is killed with SIGKILL, a new idemd on
the same database with a short sweep resolves what was left: payments
'creating' and PROCESSING records whose lease ran out (the store's default
lease is 30 s, so the check waits that long). Then CHANNEL.md's five
invariants hold, every acknowledged payment is there with the same id, and
balances are exact. Runs on SQLite, or on $IDEM_TEST_DB_URL."""

import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402
from simharness import Sim, harness, uid  # noqa: E402

LEASE_S = 30.0  # the store's default two-phase lease (include/idem/store.h)


class Kill9(unittest.TestCase):
    def setUp(self):
        self.servers = []
        self.sim = Sim().start("", simharness.FAST_SCHEDULE_MS)

    def tearDown(self):
        for s in self.servers:
            s.cleanup()
        self.sim.stop()

    def start(self, port=None, **kw):
        s = harness.Server(simharness.server_args(sweep_interval_ms=200, sweep_age_ms=1500), **kw)
        self.servers.append(s)
        if port is None:
            return s.start()
        # the same port: the channel's notify_url names it
        return simharness.start_on_port(s, port)

    def test_kill9_mid_channel_calls(self):
        s1 = self.start()
        ch = simharness.add_channel(s1, self.sim, timeout_ms=2000)
        self.sim.config(pay_mode="success_after_ms", pay_delay_ms=100, notify_mode="twice",
                        seed=9, faults=[
                            {"call": "create", "mode": "slow", "delay_ms": 700, "count": -1,
                             "p": 0.6},
                            {"call": "create", "mode": "reset", "after": True, "count": -1,
                             "p": 0.15},
                            {"call": "create", "mode": "5xx_before", "count": -1, "p": 0.1}])
        merchants = [s1.new_merchant() for _ in range(3)]
        sent = []        # (merchant, key, body)
        acked = {}       # key -> first 201 response
        lock = threading.Lock()
        stop = threading.Event()

        def client(i):
            m = merchants[i % len(merchants)]
            while not stop.is_set():
                body = m.payment_body(100 + i, "CNY", ch.name)
                key = uid("K")
                with lock:
                    sent.append((m, key, body))
                for _try in range(5):
                    try:
                        r = m.post("/v1/payments", body, key=key, timeout=5)
                    except OSError:
                        return
                    if r.status == 201:
                        with lock:
                            acked.setdefault(key, r)
                        break
                    if r.status == 402 or stop.is_set():
                        break
                    time.sleep(0.05)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with lock:
                if len(acked) >= 30:
                    break
            time.sleep(0.05)
        inflight = sum(1 for c in self.sim.calls() if c["call"] == "create" and c["status"] is None)
        s1.send_signal(signal.SIGKILL)
        s1.proc.wait(10)
        t_kill = time.monotonic()
        stop.set()
        for t in threads:
            t.join(30)
        s1.stop()
        sys.stderr.write("kill9: %d payments sent, %d acknowledged, %d creates in flight at the"
                         " kill\n" % (len(sent), len(acked), inflight))
        self.assertGreater(len(acked), 5, "too little load reached idemd before the kill")

        self.sim.config(faults=[])
        s2 = self.start(port=s1.port, db_url=s1.db_url)
        ms2 = [m.on(s2) for m in merchants]
        by_id = {m.id: m2 for m, m2 in zip(merchants, ms2)}
        for key, first in acked.items():
            m2 = next(by_id[m.id] for m, k, _b in sent if k == key)
            p = m2.payment(first.json()["id"])
            self.assertEqual(p["id"], first.json()["id"])
        # leases of the dead instance's PROCESSING records run out, the sweeper
        # of the new one resolves them and every 'creating' payment
        window = max(0.0, LEASE_S - (time.monotonic() - t_kill)) + 12.0
        try:
            simharness.check_invariants(
                self.sim, s2, ms2, within=window,
                orders=[(by_id[m.id], b["merchant_order_no"]) for m, _k, b in sent],
                got201=[r.json()["id"] for r in acked.values()],
                keys=[(by_id[m.id], k) for m, k, _b in sent])
        except AssertionError as e:
            runs = simharness.metric(s2, "idem_sweeper_runs_total")
            self.fail("%s\nsweeper runs in the new idemd: %r\n--- idemd log ---\n%s"
                      % (e, runs, s2.log_tail(40)))
        # an acknowledged payment's retry replays its answer
        for m, key, body in sent:
            if key in acked:
                again = by_id[m.id].post("/v1/payments", body, key=key)
                self.assertEqual(again.status, 201, again)
                self.assertEqual(again.json()["id"], acked[key].json()["id"])
        s2.ledger_check()
        s2.stop_checked()

    def test_kill9_mid_sweep(self):
        """idemd dies while its sweeper holds the lease (in a slow query): the
        new instance's sweeper must not wait long for a dead holder."""
        s1 = self.start()
        ch = simharness.add_channel(s1, self.sim, timeout_ms=8000)
        m = s1.new_merchant()
        self.sim.faults({"call": "create", "mode": "5xx_before"},
                        {"call": "query", "mode": "slow", "delay_ms": 6000, "count": -1})
        body = m.payment_body(300, "CNY", ch.name)
        r = m.post("/v1/payments", body, key=uid("K"))
        self.assertEqual(r.status, 503, r)
        end = time.monotonic() + 10
        while not any(c["call"] == "query" for c in self.sim.calls()):
            self.assertLess(time.monotonic(), end, "the sweeper never queried")
            time.sleep(0.05)
        s1.send_signal(signal.SIGKILL)
        s1.proc.wait(10)
        s1.stop()
        t_kill = time.monotonic()
        self.sim.config(faults=[])
        s2 = self.start(port=s1.port, db_url=s1.db_url)
        m2 = m.on(s2)
        pid = simharness.payment_by_order(m2, body["merchant_order_no"])["id"]
        end = time.monotonic() + 20
        while m2.payment(pid)["status"] == "creating" and time.monotonic() < end:
            time.sleep(0.2)
        st = m2.payment(pid)["status"]
        self.assertEqual(st, "failed", "payment still %s %.0f s after the kill (sweeper runs in the"
                         " new idemd: %r): a dead instance's sweeper lease blocks sweeping"
                         % (st, time.monotonic() - t_kill,
                            simharness.metric(s2, "idem_sweeper_runs_total")))
        s2.stop_checked()


if __name__ == "__main__":
    simharness.require_channel_support()
    unittest.main(verbosity=2)
