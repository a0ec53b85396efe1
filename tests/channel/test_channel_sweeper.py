#!/usr/bin/env python3
"""The channel pool and the sweeper of CHANNEL.md against a real idemd (issue 11):

    pool        bounded (never more calls at once than --channel-workers, 503
                channel_busy when the queue is full), never on an HTTP thread,
                connections kept alive
    sweeper     a 'creating' payment is queried; found -> completed with the
                channel's status; ORDER_NOT_EXIST -> /close, then failed (a
                late create is refused); refunds the same way
Runs on SQLite, or on $IDEM_TEST_DB_URL (tests/fault/http_on.py)."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402
from simharness import ChannelCase, uid  # noqa: E402


class PoolFull(ChannelCase):
    SERVER_KW = {"workers": 1, "queue": 1, "sweep_interval_ms": 300, "sweep_age_ms": 6000}
    TIMEOUT_MS = 3000

    def test_channel_busy(self):
        self.sim.faults({"call": "create", "mode": "slow", "delay_ms": 800, "count": -1})
        m = self.server.new_merchant()
        res = []
        lock = threading.Lock()

        def go():
            r = m.post("/v1/payments", self.body(m, 100), key=uid("K"))
            with lock:
                res.append(r)

        ts = [threading.Thread(target=go) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        codes = sorted((r.status, (r.json() or {}).get("code")) for r in res)
        busy = [r for r in res if r.status == 503 and r.json().get("code") == "channel_busy"]
        self.assertTrue(busy, "no channel_busy with 1 worker, queue 1 and 6 slow calls: %s" % codes)
        for r in busy:
            self.assertIsNotNone(r.header("Retry-After"), r)
        self.assertTrue(any(r.status == 201 for r in res), codes)


class Pool(ChannelCase):
    """Channel calls run on a bounded pool that keeps its connections."""

    SERVER_KW = {"workers": 2, "queue": 100, "sweep_interval_ms": 300, "sweep_age_ms": 6000}
    TIMEOUT_MS = 5000

    def test_bounded_concurrency(self):
        self.sim.faults({"call": "create", "mode": "slow", "delay_ms": 300, "count": -1})
        m = self.server.new_merchant()
        res = []

        def go():
            res.append(m.post("/v1/payments", self.body(m, 100), key=uid("K")))

        ts = [threading.Thread(target=go) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        self.assertEqual(sorted(r.status for r in res), [201] * 8, res)
        spans = [(c["t"], c["t_end"]) for c in self.creates()]
        peak = max(sum(1 for a, b in spans if a <= t < b) for t, _e in spans)
        self.assertLessEqual(peak, 2, "more channel calls at once than --channel-workers 2")
        self.assertEqual(peak, 2, "the two workers never worked at once")

    def test_connections_reused(self):
        m = self.server.new_merchant()
        for _ in range(12):
            self.assertEqual(m.post("/v1/payments", self.body(m, 100), key=uid("K")).status, 201)
        peers = {c["peer"] for c in self.creates()}
        self.assertLessEqual(len(peers), 2, "12 sequential creates on %d connections: no"
                             " keep-alive" % len(peers))


class NotOnHttpThreads(ChannelCase):
    """One HTTP thread: a slow channel call must not hold it."""

    SERVER_KW = {"extra": ["--threads", "1"], "sweep_interval_ms": 300, "sweep_age_ms": 6000}
    TIMEOUT_MS = 5000

    def test_http_answers_while_channel_is_slow(self):
        self.sim.faults({"call": "create", "mode": "slow", "delay_ms": 1500, "count": -1})
        m = self.server.new_merchant()
        res = []
        ts = [threading.Thread(target=lambda: res.append(
            m.post("/v1/payments", self.body(m, 100), key=uid("K")))) for _ in range(3)]
        for t in ts:
            t.start()
        self.wait_for(lambda: self.creates(), 5, "the creates to reach the channel")
        t0 = time.monotonic()
        self.assertEqual(self.server.request("GET", "/healthz").status, 200)
        self.assertEqual(m.get("/v1/balance").status, 200)
        took = time.monotonic() - t0
        for t in ts:
            t.join(30)
        self.assertLess(took, 0.8, "GETs waited %.2fs behind channel calls" % took)
        self.assertEqual(sorted(r.status for r in res), [201] * 3, res)


class Sweeper(ChannelCase):
    """Clients that never come back: the sweeper resolves their payments."""

    SERVER_KW = {"sweep_interval_ms": 200, "sweep_age_ms": 1500}

    def lost(self, m, fault, amount=800):
        self.sim.faults(dict(fault, call="create"))
        body = self.body(m, amount)
        key = uid("K")
        r = m.post("/v1/payments", body, key=key)
        self.assertUnknown(r)
        self.sim.config(faults=[])
        p = simharness.payment_by_order(m, body["merchant_order_no"])
        self.assertEqual(p["status"], "creating")
        return body, key, p

    def test_found_pending(self):
        m = self.server.new_merchant()
        body, key, p = self.lost(m, {"mode": "reset", "after": True, "count": 2})
        self.wait_status(m, p["id"], "processing", timeout=10)
        q = [c for c in self.sim.calls() if c["call"] == "query"]
        self.assertTrue(q, "the sweeper never queried the channel")
        self.assertTrue(all(c["sig_ok"] for c in q), q)
        self.assertEqual(q[0]["number"], p["id"])
        self.sim.pay(p["id"], "SUCCESS")
        self.wait_status(m, p["id"], "succeeded")
        self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])

    def test_found_success_no_notification(self):
        self.sim.config(pay_mode="immediate", notify_mode="none")
        m = self.server.new_merchant()
        body, key, p = self.lost(m, {"mode": "5xx_after"}, 820)
        self.wait_status(m, p["id"], "succeeded", timeout=10)
        self.assertEqual(m.balance(), 820)
        self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])
        # the client comes back late: the stored answer
        r = m.post("/v1/payments", body, key=key)
        self.assertIn(r.status, (200, 201), r)
        self.assertEqual(r.json()["status"], "succeeded", r)
        self.assertEqual(len(self.creates()), 1, "the late retry called the channel again")
        self.assertEqual(m.balance(), 820)

    def test_not_exist_closed_then_failed(self):
        m = self.server.new_merchant()
        body, key, p = self.lost(m, {"mode": "5xx_before"})
        self.wait_status(m, p["id"], "failed", timeout=10)
        o = self.sim.order_map().get(p["id"])
        self.assertIsNotNone(o, "the sweeper failed the payment without closing its number")
        self.assertEqual(o["status"], "CLOSED")
        calls = [c["call"] for c in self.sim.calls() if c.get("number") == p["id"]]
        self.assertIn("query", calls)
        self.assertIn("close", calls)
        self.assertLess(calls.index("query"), calls.index("close"))
        # a create still in flight can never be paid now
        st, js = simharness.channel_call(self.sim, self.ch.secret, "POST", "/orders",
                                         {"out_trade_no": p["id"], "amount": 800,
                                          "currency": "CNY", "notify_url": "http://127.0.0.1:9/",
                                          "expire_at": None})
        self.assertEqual((st, js["code"]), (409, "ORDER_CLOSED"))
        self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])
        n = simharness.metric(self.server, "idem_sweeper_resolved_total")
        self.assertTrue(n and n >= 1, "idem_sweeper_resolved_total: %r" % n)
        # the client's late retry does not pay it either
        r = m.post("/v1/payments", body, key=key)
        self.assertNotEqual(r.status, 201, r)
        self.assertEqual(m.balance(), 0)

    def test_create_in_flight_when_swept(self):
        """The create reaches the channel only after idemd gave up on it and the
        sweeper found nothing: closed first, so the late create is refused."""
        m = self.server.new_merchant()
        body, key, p = self.lost(m, {"mode": "slow", "delay_ms": 4000})
        self.wait_status(m, p["id"], "failed", timeout=10)
        self.wait_for(lambda: any(c.get("result") for c in self.creates()), timeout=6,
                      what="the slow create to finish")
        res = [c["result"] for c in self.creates()]
        self.assertEqual(res[0].get("code"), "ORDER_CLOSED", res)
        self.assertEqual(self.sim.order_map()[p["id"]]["status"], "CLOSED")
        self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])

    def test_found_failed_or_closed(self):
        for final in ("FAILED", "CLOSED"):
            with self.subTest(status=final):
                self.sim.reset()
                self.sim.config(notify_mode="none")
                m = self.server.new_merchant()
                body, key, p = self.lost(m, {"mode": "5xx_after"}, 840)
                if final == "FAILED":
                    self.assertEqual(self.sim.pay(p["id"], "FAILED")[0], 200)
                else:
                    st, _js = simharness.channel_call(self.sim, self.ch.secret, "POST",
                                                      "/orders/%s/close" % p["id"], {})
                    self.assertEqual(st, 200)
                self.wait_status(m, p["id"], "failed", timeout=10)
                self.assertEqual(m.balance(), 0)
                self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])
                r = m.post("/v1/payments", body, key=key)
                self.assertNotEqual(r.status, 503, r)
                self.assertEqual(self.sim.order_map()[p["id"]]["status"], final)

    def test_found_success_other_amount_not_credited(self):
        """The channel's query says SUCCESS for another amount: like a
        notification with that amount (422 amount_mismatch), nothing is
        credited."""
        self.sim.config(notify_mode="none")
        m = self.server.new_merchant()
        body, key, p = self.lost(m, {"mode": "5xx_after"}, 840)
        self.assertEqual(self.sim.pay(p["id"], "SUCCESS", amount=1)[0], 200)
        self.wait_for(lambda: [c for c in self.sim.calls() if c["call"] == "query"], 10,
                      "the sweeper's query")
        time.sleep(1.0)
        got = m.payment(p["id"])
        self.assertEqual(m.balance(), 0, "the sweeper credited %d for a channel that was paid 1"
                         " (payment now %s)" % (m.balance(), got["status"]))
        self.assertNotEqual(got["status"], "succeeded")

    def test_create_lands_while_closing(self):
        """The late create lands between the sweeper's ORDER_NOT_EXIST and its
        close (answered in time: ORDER_PAID; or too late: unknown): never
        failed while the channel has it paid."""
        for name, close_ms, create_ms in (("close_paid", 900, 2000),
                                          ("close_unknown", 2000, 2500)):
            with self.subTest(case=name):
                self.sim.reset()
                self.sim.config(notify_mode="none", pay_mode="immediate")
                self.sim.faults({"call": "create", "mode": "slow", "delay_ms": create_ms},
                                {"call": "close", "mode": "slow", "delay_ms": close_ms})
                m = self.server.new_merchant()
                body = self.body(m, 850)
                key = uid("K")
                self.assertUnknown(m.post("/v1/payments", body, key=key))
                pid = simharness.payment_by_order(m, body["merchant_order_no"])["id"]
                self.wait_for(lambda: [c for c in self.sim.calls()
                                       if c["call"] == "close" and c.get("t_end")], 10,
                              "the sweeper's close to be answered")
                p = self.wait_status(m, pid, ("succeeded", "failed"), timeout=10)
                o = self.sim.order_map()[pid]
                if o["status"] == "SUCCESS":
                    self.assertEqual((p["status"], m.balance()), ("succeeded", 850), name)
                else:
                    self.assertEqual((o["status"], p["status"], m.balance()),
                                     ("CLOSED", "failed", 0), name)
                self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])

    def test_query_fails_then_resolves(self):
        self.sim.config(pay_mode="immediate", notify_mode="none")
        m = self.server.new_merchant()
        body, key, p = self.lost(m, {"mode": "reset", "after": True, "count": 2}, 830)
        self.sim.faults({"call": "query", "mode": "5xx_before", "count": 3})
        self.wait_status(m, p["id"], "succeeded", timeout=12)
        self.assertGreaterEqual(len([c for c in self.sim.calls() if c["call"] == "query"]), 4)
        self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])

    # ---- refunds the client never came back for ------------------------
    def paid(self, m, amount=1000):
        self.sim.config(pay_mode="immediate")
        r = m.post("/v1/payments", self.body(m, amount), key=uid("K"))
        self.assertEqual((r.status, r.json()["status"]), (201, "succeeded"), r)
        self.sim.config(pay_mode="pending")
        return r.json()

    def refund_calls(self, call="refund"):
        return [c for c in self.sim.calls() if c.get("call") == call]

    def wait_refunded(self, m, pid, amount, timeout=10):
        return self.wait_for(lambda: m.payment(pid)["refunded_amount"] == amount, timeout,
                             "refunded_amount %d on %s (now %r)"
                             % (amount, pid, m.payment(pid)["refunded_amount"]))

    def test_refund_lost_sent_again(self):
        """The refund never reached the channel: the sweeper finds
        REFUND_NOT_EXIST and sends it again under the same out_refund_no."""
        m = self.server.new_merchant()
        p = self.paid(m, 1000)
        self.sim.faults({"call": "refund", "mode": "reset", "count": 2})
        body = {"refund_request_no": uid("R"), "payment_id": p["id"], "amount": 300}
        key = uid("RK")
        self.assertUnknown(m.post("/v1/refunds", body, key=key))
        self.sim.config(faults=[])
        no = {c["body"]["out_refund_no"] for c in self.refund_calls()}
        self.assertEqual(len(no), 1)
        no = no.pop()
        self.assertTrue(no.startswith("re_"), no)
        self.wait_for(lambda: no in {r["out_refund_no"] for r in self.sim.refunds()}, 10,
                      "the sweeper to send the refund again")
        self.assertEqual({c["body"]["out_refund_no"] for c in self.refund_calls()}, {no})
        self.assertIn(no, [c["number"] for c in self.refund_calls("refund_query")])
        self.wait_refunded(m, p["id"], 300)
        self.wait_for(lambda: m.balance() == 700, 5, "balance 700 (now %d)" % m.balance())
        self.check([m], got201=[p["id"]])
        r = m.post("/v1/refunds", body, key=key)
        self.assertEqual(r.status, 201, r)
        self.assertEqual((r.json()["id"], r.json()["status"]), (no, "succeeded"), r)
        self.assertEqual(len(self.sim.refunds()), 1)

    def test_refund_found_after_unknown(self):
        m = self.server.new_merchant()
        p = self.paid(m, 1000)
        self.sim.faults({"call": "refund", "mode": "5xx_after"})
        body = {"refund_request_no": uid("R"), "payment_id": p["id"], "amount": 450}
        key = uid("RK")
        self.assertUnknown(m.post("/v1/refunds", body, key=key))
        self.sim.config(faults=[])
        self.wait_for(lambda: self.refund_calls("refund_query"), 10, "a refund query")
        time.sleep(0.5)
        self.assertEqual(len(self.sim.refunds()), 1)
        self.assertEqual(len(self.refund_calls()), 1, "the refund found was sent again")
        self.assertEqual(m.payment(p["id"])["refunded_amount"], 450)
        self.assertEqual(m.balance(), 550)
        self.check([m], got201=[p["id"]])
        # the client comes back: the refund's own answer, as for payments
        r = m.post("/v1/refunds", body, key=key)
        self.assertEqual((r.status, r.json().get("status")), (201, "succeeded"), r)
        self.assertEqual(len(self.refund_calls()), 1)

    def test_refund_processing_then_failed_gives_back(self):
        m = self.server.new_merchant()
        p = self.paid(m, 1000)
        self.sim.config(refund_mode="processing")
        body = {"refund_request_no": uid("R"), "payment_id": p["id"], "amount": 400}
        r = m.post("/v1/refunds", body, key=uid("RK"))
        self.assertEqual((r.status, r.json().get("status")), (201, "processing"), r)
        rid = r.json()["id"]
        self.assertEqual(m.balance(), 600, "a processing refund holds its amount")
        self.assertEqual(self.sim.refund_set(rid, "FAILED")[0], 200)
        self.wait_refunded(m, p["id"], 0)
        self.wait_for(lambda: m.balance() == 1000, 5, "the amount given back")
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        # and the processing one that succeeds stays refunded
        r = m.post("/v1/refunds", dict(body, refund_request_no=uid("R")), key=uid("RK"))
        self.assertEqual((r.status, r.json().get("status")), (201, "processing"), r)
        self.sim.refund_set(r.json()["id"], "SUCCESS")
        self.wait_for(lambda: any(c["number"] == r.json()["id"]
                                  for c in self.refund_calls("refund_query")), 10,
                      "the sweeper to query the processing refund")
        time.sleep(0.5)
        self.assertEqual(m.payment(p["id"])["refunded_amount"], 400)
        self.assertEqual(m.balance(), 600)

    def test_sweeper_metrics(self):
        self.wait_for(lambda: (simharness.metric(self.server, "idem_sweeper_runs_total") or 0) > 0,
                      what="idem_sweeper_runs_total > 0")


if __name__ == "__main__":
    simharness.main()
