#!/usr/bin/env python3
"""Two idemd on one PostgreSQL (or MariaDB) database, the sweeper running in
both, clients retrying the same payments through random channel faults on
either instance (issue 11): still one out_trade_no per payment, CHANNEL.md's
invariants hold on both, balances exact, one payment row per order number.

    python3 tests/fault/http_on.py postgres tests/channel/test_channel_two_idemd.py

Needs $IDEM_TEST_DB_URL (a server database): skipped (77) on SQLite."""

import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402
from simharness import Sim, harness, uid  # noqa: E402

sys.path.insert(0, os.path.join(simharness.ROOT, "tests", "fault"))
import dbserver  # noqa: E402

PAYMENTS = 40
CLIENTS = 16
STORM_S = 35.0


class TwoIdemd(unittest.TestCase):
    def setUp(self):
        self.url = os.environ.get("IDEM_TEST_DB_URL")
        self.servers = []
        self.sim = Sim().start("", simharness.FAST_SCHEDULE_MS)

    def tearDown(self):
        for s in self.servers:
            s.cleanup()
        self.sim.stop()

    def test_one_out_trade_no_per_payment(self):
        args = simharness.server_args(sweep_interval_ms=150, sweep_age_ms=1200)
        a = harness.Server(args, db_url=self.url)
        self.servers.append(a)
        a.start()
        b = harness.Server(args, db_url=self.url)
        self.servers.append(b)
        b.start()
        ch = simharness.add_channel(a, self.sim, timeout_ms=800)
        self.sim.config(pay_mode="success_after_ms", pay_delay_ms=100, notify_mode="twice",
                        seed=22, faults=[
                            {"call": "create", "mode": "5xx_before", "count": -1, "p": 0.1},
                            {"call": "create", "mode": "reset", "after": True, "count": -1,
                             "p": 0.1},
                            {"call": "create", "mode": "timeout_after_create", "hold_ms": 1000,
                             "count": -1, "p": 0.08},
                            {"call": "create", "mode": "slow", "delay_ms": 1000, "count": -1,
                             "p": 0.08},
                            {"call": "query", "mode": "slow", "delay_ms": 300, "count": -1,
                             "p": 0.3}])
        ms = [a.new_merchant() for _ in range(4)]
        work = [{"m": ms[i % 4], "key": uid("K"),
                 "body": ms[i % 4].payment_body(200 + i, "CNY", ch.name), "done": None,
                 "answers": []} for i in range(PAYMENTS)]
        # payments whose clients never come back: both sweepers compete for them
        abandoned = []
        faults = self.sim.config()["faults"]
        for i in range(16):
            m = ms[i % 4] if i % 2 == 0 else ms[i % 4].on(b)
            body = m.payment_body(900 + i, "CNY", ch.name)
            self.sim.config(faults=[{"call": "create", "count": 2,
                                     "mode": "5xx_before" if i % 4 < 2 else "5xx_after"}])
            key = uid("KA")
            r = m.post("/v1/payments", body, key=key)
            self.assertEqual(r.status, 503, r)
            abandoned.append((ms[i % 4], body["merchant_order_no"], key))
        self.sim.config(faults=[dict(f, count=-1) for f in faults
                                if f["call"] != "create"] +
                        [dict((k, v) for k, v in f.items() if k != "applied")
                         for f in faults if f["call"] == "create"])
        sides = [0, 0]
        sides_lock = threading.Lock()

        def send(w, rng):
            side = rng.randrange(2)
            with sides_lock:
                sides[side] += 1
            return (w["m"] if side == 0 else w["m"].on(b)).post(
                "/v1/payments", w["body"], key=w["key"], timeout=10)

        # 200: a replay of the record a notification or the sweeper completed
        # while the clients were away
        took, _stats, _samples = simharness.retry_storm(
            work, send, lambda r, _code: r.status in (200, 201, 402), clients=CLIENTS,
            seconds=STORM_S, pause=(0.02, 0.1))
        for w in work:
            w["ids"] = {r.json()["id"] for r in w["answers"] if r.status in (200, 201)}
        sys.stderr.write("two_idemd: %.1fs, requests A %d, B %d\n" % (took, sides[0], sides[1]))
        self.assertEqual([w["body"]["merchant_order_no"] for w in work if w["done"] is None], [])
        self.sim.config(faults=[])
        for w in work:
            self.assertLessEqual(len(w["ids"]), 1, "two payment ids for one key: %s" % w["ids"])
        orders = [(w["m"], w["body"]["merchant_order_no"]) for w in work] + \
            [(m, o) for m, o, _k in abandoned]
        got201 = [i for w in work for i in w["ids"]]
        keys = [(w["m"], w["key"]) for w in work] + [(m, k) for m, _o, k in abandoned]
        for srv in (a, b):
            view = [m.on(srv) for m in ms]
            by = {m.id: m for m in view}
            try:
                simharness.check_invariants(
                    self.sim, srv, view, within=15.0,
                    orders=[(by[m.id], o) for m, o in orders], got201=got201,
                    keys=[(by[m.id], k) for m, k in keys])
            except AssertionError as e:
                self.fail("%s\n--- A ---\n%s\n--- B ---\n%s" % (e, a.log_tail(30), b.log_tail(30)))
        # behind the API: one payment row per order number, one number per row
        dup = dbserver.sql(self.url, "SELECT merchant_id, merchant_order_no, count(*) FROM payments"
                                     " GROUP BY merchant_id, merchant_order_no HAVING count(*) > 1")
        self.assertEqual(dup, [], "two payment rows for one order number")
        nos = {}
        for c in self.sim.calls():
            if c["call"] == "create" and c.get("body"):
                nos.setdefault(c["body"]["out_trade_no"], set()).add(
                    (c["body"]["amount"], c["body"]["currency"]))
        self.assertTrue(all(len(v) == 1 for v in nos.values()), "one number, two amounts")
        self.assertLessEqual(len(self.sim.order_map()), PAYMENTS + len(abandoned))
        for m, o, _k in abandoned:
            st = simharness.payment_by_order(m, o)["status"]
            self.assertIn(st, ("failed", "processing", "succeeded"), (o, st))
        # one sweeper at a time, and each sweeps one call after another: no two
        # query/close calls (only sweepers make them) ever overlap in time
        swept = sorted((c["t"], c.get("t_end") or c["t"], c.get("number"))
                       for c in self.sim.calls() if c["call"] in ("query", "close"))
        sys.stderr.write("two_idemd: %d sweeper calls\n" % len(swept))
        self.assertGreater(len(swept), 0, "the sweepers had nothing to do")
        busy_until, by = 0.0, None
        for t, e, no in swept:
            self.assertGreaterEqual(t, busy_until - 0.002, "sweeper calls overlap: %s until %.3f,"
                                    " %s from %.3f (two sweepers at once?)" % (by, busy_until, no, t))
            if e > busy_until:
                busy_until, by = e, no
        runs = [simharness.metric(s, "idem_sweeper_runs_total") or 0 for s in (a, b)]
        sys.stderr.write("two_idemd: sweeper runs A %d, B %d\n" % tuple(runs))
        self.assertGreater(sum(runs), 0, "no sweeper ran")
        a.stop_checked()
        b.stop_checked()


if __name__ == "__main__":
    simharness.require_channel_support()
    if not os.environ.get("IDEM_TEST_DB_URL"):
        sys.stderr.write("SKIPPED: needs IDEM_TEST_DB_URL (run through tests/fault/http_on.py)\n")
        sys.exit(77)
    unittest.main(verbosity=2)
