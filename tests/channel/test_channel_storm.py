#!/usr/bin/env python3
"""32 clients retry the same 50 payments through random channel faults
(issue 11): every unknown outcome of CHANNEL.md at random on the creates,
each notification sent twice, the sweeper racing the clients' retries.
Afterwards CHANNEL.md's five invariants hold and every balance is exact.
Runs on SQLite, or on $IDEM_TEST_DB_URL (tests/fault/http_on.py)."""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402
from simharness import ChannelCase, uid  # noqa: E402

CLIENTS = 32
PAYMENTS = 50
MERCHANTS = 5
STORM_S = 35.0

FAULTS = [
    {"mode": "5xx_before"},
    {"mode": "5xx_after"},
    {"mode": "reset"},
    {"mode": "reset", "after": True},
    {"mode": "garbage"},
    {"mode": "bad_signature"},
    {"mode": "timeout_after_create", "hold_ms": 1200},
    {"mode": "slow", "delay_ms": 1100},
    {"mode": "slow", "delay_ms": 150},
]


class Storm(ChannelCase):
    SERVER_KW = {"sweep_interval_ms": 250, "sweep_age_ms": 1500}
    TIMEOUT_MS = 800

    def test_storm(self):
        rng = random.Random(int(os.environ.get("IDEM_STORM_SEED", "11")))
        self.sim.config(pay_mode="success_after_ms", pay_delay_ms=100, notify_mode="twice",
                        seed=rng.randrange(1 << 30),
                        faults=[dict(f, call="create", count=-1, p=0.1) for f in FAULTS] +
                        [{"call": "query", "mode": "5xx_before", "count": -1, "p": 0.2}])
        merchants = [self.server.new_merchant() for _ in range(MERCHANTS)]
        work = []
        for i in range(PAYMENTS):
            m = merchants[i % MERCHANTS]
            work.append({"m": m, "key": uid("K"), "body": self.body(m, 100 + 7 * i),
                         "answers": [], "done": None})
        # 200: a replay of the record the sweeper completed while the client
        # was away
        took, stats, samples = simharness.retry_storm(
            work, lambda w, _rng: w["m"].post("/v1/payments", w["body"], key=w["key"], timeout=10),
            lambda r, _code: r.status in (200, 201, 402), clients=CLIENTS, seconds=STORM_S)
        sys.stderr.write("storm: %.1fs, answers %s\n" % (took, sorted(stats.items())))
        for k, r in sorted(samples.items()):
            sys.stderr.write("storm: sample %s: %r\n" % (k, r))
        undone = [w["body"]["merchant_order_no"] for w in work if w["done"] is None]
        self.assertEqual(undone, [], "payments with no definite answer after %.0fs" % STORM_S)
        unexpected = {k: v for k, v in stats.items()
                      if k.split()[0] not in ("200", "201", "402", "503", "409")}
        self.assertEqual(unexpected, {}, "answers no client should get")
        self.sim.config(faults=[])
        got201 = []
        expected = {m.id: 0 for m in merchants}
        for w in work:
            oks = [r for r in w["answers"] if r.status in (200, 201)]
            self.assertLessEqual(len({r.json()["id"] for r in oks}), 1,
                                 "two payment ids for one key")
            firsts = [r for r in oks if r.header("Idempotent-Replayed") is None]
            self.assertLessEqual(len(firsts), 1, "two first 201s for one key: %r" % firsts)
            if oks:
                got201.append(oks[0].json()["id"])
                expected[w["m"].id] += w["body"]["amount"]
            # a 402 is possible: the sweeper closed a number it could not find
            # while the client was away, and the retry met ORDER_CLOSED
            for r in w["answers"]:
                if r.status == 402:
                    self.assertEqual(r.json().get("channel_code"), "ORDER_CLOSED", r)
                    self.assertEqual(oks, [], "201 and 402 for one key")
            # the stored answer replays, byte for byte
            again = w["m"].post("/v1/payments", w["body"], key=w["key"])
            self.assertEqual((again.status, again.body), (w["done"].status, w["done"].body))
        self.check(merchants, within=15.0,
                   orders=[(w["m"], w["body"]["merchant_order_no"]) for w in work],
                   got201=got201, keys=[(w["m"], w["key"]) for w in work])
        for m in merchants:
            self.assertEqual(m.balance(), expected[m.id], "balance of %s" % m.id)
        self.assertEqual(len([o for o in self.sim.orders() if not o["tombstone"]]), PAYMENTS)
        self.assertTrue(all(c["sig_ok"] for c in self.sim.calls()), "idemd signed a call badly")
        self.server.ledger_check()


    def test_refund_storm(self):
        """Three refunds per payment (600, 600, 300 of 1000) retried by 32
        clients through random refund faults: the cap holds (one of the 600s
        and the 300), each refund has one out_refund_no, balances exact."""
        self.sim.config(pay_mode="immediate")
        merchants = [self.server.new_merchant() for _ in range(4)]
        pays = []
        for i in range(16):
            m = merchants[i % 4]
            r = m.post("/v1/payments", self.body(m, 1000), key=uid("K"))
            self.assertEqual((r.status, r.json()["status"]), (201, "succeeded"), r)
            pays.append((m, r.json()["id"]))
        rng = random.Random(int(os.environ.get("IDEM_STORM_SEED", "11")) + 1)
        self.sim.config(seed=rng.randrange(1 << 30), faults=[
            dict(f, call="refund", count=-1, p=0.1) for f in FAULTS] +
            [{"call": "refund_query", "mode": "5xx_before", "count": -1, "p": 0.2}])
        work = []
        for m, pid in pays:
            for amount in (600, 600, 300):
                work.append({"m": m, "pid": pid, "key": uid("RK"), "done": None, "answers": [],
                             "body": {"refund_request_no": uid("R"), "payment_id": pid,
                                      "amount": amount}})
        took, stats, _samples = simharness.retry_storm(
            work, lambda w, _rng: w["m"].post("/v1/refunds", w["body"], key=w["key"], timeout=10),
            lambda r, code: r.status in (200, 201, 402) or (
                r.status == 409 and code != "request_in_progress"),
            clients=CLIENTS, seconds=STORM_S)
        sys.stderr.write("refund storm: %.1fs, answers %s\n" % (took, sorted(stats.items())))
        self.assertEqual([w["body"]["refund_request_no"] for w in work if w["done"] is None], [])
        self.sim.config(faults=[])
        for w in work:
            ok = [r for r in w["answers"] if r.status == 201]
            self.assertLessEqual(len({r.json()["id"] for r in ok}), 1, "two refund ids, one key")
            if w["done"].status == 200:
                self.fail_with_logs("a refund the sweeper resolved answered its retry with the "
                                    "backstop's 200, not its own 201: %r" % w["done"])
            if w["done"].status != 201:
                self.assertEqual((w["done"].status, w["done"].json().get("code")),
                                 (409, "refund_exceeds_payment"), w["done"])
        srefunds = self.sim.refunds()
        calls = [c for c in self.sim.calls() if c.get("call") == "refund"]
        self.assertFalse([c for c in calls if (c.get("result") or {}).get("code") ==
                          "REFUND_EXCEEDS"], "idemd let a refund past the cap reach the channel")
        for m, pid in pays:
            mine = [w for w in work if w["pid"] == pid]
            won = [w for w in mine if w["done"].status == 201]
            self.assertEqual(sorted(w["body"]["amount"] for w in won), [300, 600],
                             "refunds of %s: %s" % (pid, [(w["body"]["amount"], w["done"].status)
                                                          for w in mine]))
            self.assertEqual({c["body"]["out_refund_no"] for c in calls
                              if c["body"]["out_trade_no"] == pid},
                             {w["done"].json()["id"] for w in won}, pid)
            at_channel = [r for r in srefunds if r["out_trade_no"] == pid]
            self.assertEqual(sorted(r["amount"] for r in at_channel), [300, 600], pid)
            self.assertTrue(all(r["status"] == "SUCCESS" for r in at_channel), at_channel)
        for m in merchants:
            self.wait_for(lambda: all(m.payment(pid)["refunded_amount"] == 900
                                      for mm, pid in pays if mm is m), 15,
                          "refunded_amount 900 on every payment of %s" % m.id)
            self.assertEqual(m.balance(), 100 * 4, "balance of %s" % m.id)
        self.check(merchants, within=15.0, got201=[pid for _m, pid in pays])
        for w in work:
            again = w["m"].post("/v1/refunds", w["body"], key=w["key"])
            self.assertEqual((again.status, again.body), (w["done"].status, w["done"].body))
        self.server.ledger_check()


if __name__ == "__main__":
    simharness.main()
