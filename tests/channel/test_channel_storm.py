#!/usr/bin/env python3
"""32 clients retry the same 50 payments through random channel faults
(issue 11): every unknown outcome of CHANNEL.md at random on the creates,
each notification sent twice, the sweeper racing the clients' retries.
Afterwards CHANNEL.md's five invariants hold and every balance is exact.
Runs on SQLite, or on $IDEM_TEST_DB_URL (tests/fault/http_on.py)."""

import os
import random
import sys
import threading
import time

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
        lock = threading.Lock()
        stop = threading.Event()
        stats = {}
        samples = {}

        def client(seed):
            r_ = random.Random(seed)
            while not stop.is_set():
                with lock:
                    open_ = [w for w in work if w["done"] is None]
                if not open_:
                    return
                w = r_.choice(open_)
                try:
                    r = w["m"].post("/v1/payments", w["body"], key=w["key"], timeout=10)
                except OSError as e:
                    with lock:
                        stats["oserror"] = stats.get("oserror", 0) + 1
                    time.sleep(0.05)
                    continue
                code = (r.json() or {}).get("code") if r.status >= 400 else None
                with lock:
                    k = "%d %s" % (r.status, code or "")
                    stats[k] = stats.get(k, 0) + 1
                    samples.setdefault(k, r)
                    w["answers"].append(r)
                    # 200: a replay of the record the sweeper completed while
                    # this client was away
                    if r.status in (200, 201, 402) and w["done"] is None:
                        w["done"] = r
                if r.status not in (200, 201, 402):
                    time.sleep(r_.uniform(0.02, 0.15))

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        while time.monotonic() - t0 < STORM_S:
            with lock:
                if all(w["done"] is not None for w in work):
                    break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(30)
        sys.stderr.write("storm: %.1fs, answers %s\n" % (time.monotonic() - t0, sorted(stats.items())))
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
        self.assertEqual(len(self.sim.order_map()), PAYMENTS)
        self.assertTrue(all(c["sig_ok"] for c in self.sim.calls()), "idemd signed a call badly")
        self.server.ledger_check()


if __name__ == "__main__":
    simharness.main()
