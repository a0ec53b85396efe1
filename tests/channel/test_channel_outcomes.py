#!/usr/bin/env python3
"""Every outcome row of CHANNEL.md and every fault mode of the simulator,
one payment (or refund) at a time, against a real idemd (issue 11).

    definite OK       -> 201 processing / succeeded, stored
    4xx with a code   -> 402 channel_declined + channel_code, stored, failed
    unknown           -> 503 channel_unavailable + Retry-After, not stored,
                         payment 'creating', a retry sends the same out_trade_no
and the notification modes, refunds, --public-url and bad configuration.
The pool and the sweeper: test_channel_sweeper.py. Runs on SQLite, or on
$IDEM_TEST_DB_URL (tests/fault/http_on.py)."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402
from simharness import ChannelCase, uid  # noqa: E402

UNKNOWN_FAULTS = [
    ("5xx_before", {"mode": "5xx_before"}, False),
    ("5xx_after", {"mode": "5xx_after"}, True),
    # count 2: libcurl itself resends once when a reused connection dies with
    # no answer (harmless: the channel is idempotent on the number)
    ("reset_before", {"mode": "reset", "count": 2}, False),
    ("reset_after", {"mode": "reset", "after": True, "count": 2}, True),
    ("garbage", {"mode": "garbage"}, True),
    # a 4xx is a refusal only with a code: a proxy's HTML 404, or JSON with no code
    ("4xx_html", {"mode": "garbage", "status": 404}, True),
    ("4xx_no_code", {"mode": "decline", "status": 400, "code": None}, False),
    # the channel could not check our signature (a secret being rotated)
    ("401_sign_error", {"mode": "decline", "status": 401, "code": "SIGN_ERROR"}, False),
    ("bad_signature", {"mode": "bad_signature"}, True),
    ("timeout_after_create", {"mode": "timeout_after_create", "hold_ms": 2500}, True),
    # slower than the channel's 1 s timeout: the order appears only after idemd gave up
    ("slow", {"mode": "slow", "delay_ms": 1600}, None),
]


class Outcomes(ChannelCase):
    # a long sweep age: these tests retry themselves, the sweeper must not race them
    SERVER_KW = {"sweep_interval_ms": 300, "sweep_age_ms": 6000}

    def test_ok_pending_then_success_notification(self):
        m = self.server.new_merchant()
        key = uid("K")
        body = self.body(m, 1234)
        r = m.post("/v1/payments", body, key=key)
        self.assertEqual(r.status, 201, r)
        p = r.json()
        self.assertEqual(p["status"], "processing", r)
        self.assertTrue(p["id"].startswith("pay_"), r)
        o = self.sim.order_map().get(p["id"])
        self.assertIsNotNone(o, "no order %s at the channel" % p["id"])
        self.assertEqual((o["amount"], o["currency"], o["status"]), (1234, "CNY", "PENDING"))
        self.assertEqual(o["notify_url"], "http://127.0.0.1:%d/v1/notifications/%s"
                         % (self.server.port, self.ch.name))
        self.assertIsNotNone(o["expire_at"])
        calls = self.creates(p["id"])
        self.assertEqual(len(calls), 1)
        self.assertTrue(calls[0]["sig_ok"])
        self.assertTrue(calls[0]["request_id"], "no X-Request-Id on the create")
        again = m.post("/v1/payments", body, key=key)
        self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                         (201, r.body, "true"))
        self.assertEqual(len(self.creates()), 1, "a replay called the channel again")
        self.assertEqual(self.sim.pay(p["id"], "SUCCESS")[0], 200)
        self.wait_status(m, p["id"], "succeeded")
        self.check([m], orders=[(m, body["merchant_order_no"])], got201=[p["id"]],
                   keys=[(m, key)])
        self.assertEqual(m.balance(), 1234)

    def test_ok_success_immediate(self):
        self.sim.config(pay_mode="immediate")
        m = self.server.new_merchant()
        body = self.body(m, 500)
        r = m.post("/v1/payments", body, key=uid("K"))
        self.assertEqual(r.status, 201, r)
        p = r.json()
        self.assertEqual(p["status"], "succeeded", r)
        self.assertEqual(m.balance(), 500)
        # the SUCCESS notification arrives too: credited once
        self.wait_for(lambda: any(d["http_status"] == 200 for d in self.sim.notifications()),
                      what="the SUCCESS notification acknowledged")
        self.check([m], orders=[(m, body["merchant_order_no"])], got201=[p["id"]])
        self.assertEqual(m.balance(), 500)

    def test_ok_failed_at_once(self):
        """OK with status FAILED: definite, the payment failed as the status says."""
        self.sim.config(pay_mode="immediate_fail")
        m = self.server.new_merchant()
        key = uid("K")
        body = self.body(m, 640)
        r = m.post("/v1/payments", body, key=key)
        self.assertEqual(r.status, 201, r)
        self.assertEqual(r.json()["status"], "failed", r)
        again = m.post("/v1/payments", body, key=key)
        self.assertEqual((again.status, again.body), (201, r.body))
        self.wait_for(lambda: any(d["http_status"] == 200 for d in self.sim.notifications()),
                      what="the FAILED notification acknowledged")
        self.assertEqual(m.payment(r.json()["id"])["status"], "failed")
        self.assertEqual(m.balance(), 0)
        self.check([m], orders=[(m, body["merchant_order_no"])], got201=[r.json()["id"]],
                   keys=[(m, key)])

    def test_ok_after_delay(self):
        self.sim.config(pay_mode="success_after_ms", pay_delay_ms=200)
        m = self.server.new_merchant()
        body = self.body(m, 700)
        r = m.post("/v1/payments", body, key=uid("K"))
        self.assertEqual((r.status, r.json()["status"]), (201, "processing"), r)
        self.wait_status(m, r.json()["id"], "succeeded")
        self.check([m], orders=[(m, body["merchant_order_no"])], got201=[r.json()["id"]])

    def test_failed_notification(self):
        m = self.server.new_merchant()
        r = m.post("/v1/payments", self.body(m, 300), key=uid("K"))
        self.assertEqual(r.status, 201, r)
        pid = r.json()["id"]
        self.sim.pay(pid, "FAILED")
        self.wait_status(m, pid, "failed")
        self.assertEqual(m.balance(), 0)
        self.check([m], got201=[pid])

    def test_closed_notification(self):
        m = self.server.new_merchant()
        r = m.post("/v1/payments", self.body(m, 300), key=uid("K"))
        self.assertEqual(r.status, 201, r)
        pid = r.json()["id"]
        # the channel closes the order itself (it expired): a CLOSED notification
        st, js = simharness.channel_call(self.sim, self.ch.secret, "POST",
                                         "/orders/%s/close" % pid, {})
        self.assertEqual((st, js["status"]), (200, "CLOSED"))
        self.wait_status(m, pid, "failed")
        self.assertEqual(m.balance(), 0)
        self.check([m], got201=[pid])

    def test_notify_modes_credit_once(self):
        for mode in ("twice", "out_of_order", "before_return"):
            with self.subTest(mode=mode):
                self.sim.reset()
                self.sim.config(notify_mode=mode, pay_mode="pending")
                m = self.server.new_merchant()
                body = self.body(m, 900)
                r = m.post("/v1/payments", body, key=uid("K"))
                self.assertEqual(r.status, 201, r)
                pid = r.json()["id"]
                if mode == "before_return":
                    self.assertIn(r.json()["status"], ("processing", "succeeded"), r)
                    self.assertEqual(len(self.sim.notifications()), 1)
                else:
                    self.sim.pay(pid, "SUCCESS")
                self.wait_status(m, pid, "succeeded")
                want = {"twice": 2, "out_of_order": 2, "before_return": 1}[mode]
                self.wait_for(lambda: sum(1 for d in self.sim.notifications()
                                          if d["http_status"] == 200) >= want,
                              what="%d acknowledged deliveries" % want)
                time.sleep(0.2)
                self.assertEqual(self.wait_status(m, pid, "succeeded")["status"], "succeeded")
                self.assertEqual(m.balance(), 900)
                bad = [d for d in self.sim.notifications() if d["http_status"] != 200]
                self.assertEqual(bad, [], "idemd refused a delivery")
                self.check([m], orders=[(m, body["merchant_order_no"])], got201=[pid])

    def test_decline_stored(self):
        # (401 and 403 are unknown, not refusals: a secret being rotated; b979219)
        for status, code in ((400, "INVALID_FIELD"), (422, "ACCOUNT_BLOCKED"),
                             (409, "OUT_TRADE_NO_USED")):
            with self.subTest(code=code):
                self.sim.reset()
                self.sim.faults({"call": "create", "mode": "decline", "status": status,
                                 "code": code})
                m = self.server.new_merchant()
                key = uid("K")
                body = self.body(m, 400)
                r = m.post("/v1/payments", body, key=key)
                self.assertDeclined(r, code)
                self.assertEqual(r.header("Content-Type").split(";")[0], "application/problem+json")
                again = m.post("/v1/payments", body, key=key)
                self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                                 (402, r.body, "true"))
                self.assertEqual(len(self.creates()), 1, "a stored refusal called the channel")
                p = simharness.payment_by_order(m, body["merchant_order_no"])
                self.assertIsNotNone(p, "no payment for a declined order")
                self.assertEqual(p["status"], "failed")
                self.assertEqual(self.creates()[0]["number"], p["id"])
                self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])

    def test_order_closed_before_retry(self):
        """The channel closed the number between the unknown create and the
        retry: the retry is a definite ORDER_CLOSED refusal."""
        self.sim.faults({"call": "create", "mode": "reset", "count": 2})
        m = self.server.new_merchant()
        key = uid("K")
        body = self.body(m, 250)
        self.assertUnknown(m.post("/v1/payments", body, key=key))
        self.sim.config(faults=[])
        no = self.creates()[0]["number"]
        self.assertEqual({c["number"] for c in self.creates()}, {no})
        st, js = simharness.channel_call(self.sim, self.ch.secret, "POST",
                                         "/orders/%s/close" % no, {})
        self.assertEqual(st, 200)
        r = m.post("/v1/payments", body, key=key)
        self.assertDeclined(r, "ORDER_CLOSED")
        self.assertEqual({c["number"] for c in self.creates()}, {no})
        self.assertEqual(simharness.payment_by_order(m, body["merchant_order_no"])["status"],
                         "failed")
        self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)])

    def test_unknown_outcomes_retry_same_number(self):
        for name, fault, exists in UNKNOWN_FAULTS:
            with self.subTest(fault=name):
                self.sim.reset()
                self.sim.faults(dict(fault, call="create"))
                m = self.server.new_merchant()
                key = uid("K")
                body = self.body(m, 610)
                t0 = time.monotonic()
                r = m.post("/v1/payments", body, key=key)
                self.assertUnknown(r, name)
                self.assertLess(time.monotonic() - t0, 5.0, "%s: the 503 took too long" % name)
                p = simharness.payment_by_order(m, body["merchant_order_no"])
                self.assertIsNotNone(p, "%s: no payment visible after the 503" % name)
                self.assertEqual(p["status"], "creating", "%s: %r" % (name, p))
                self.assertTrue(p["id"].startswith("pay_"))
                first = self.creates()
                self.assertEqual({c["number"] for c in first}, {p["id"]}, name)
                if exists is not None:
                    self.assertEqual(p["id"] in self.sim.order_map(), exists, name)
                # the client retries with the same key: the same number goes out
                self.sim.config(faults=[])
                r2 = m.post("/v1/payments", body, key=key)
                if r2.status == 409 and r2.json().get("code") == "request_in_progress":
                    time.sleep(1.0)
                    r2 = m.post("/v1/payments", body, key=key)
                self.assertEqual(r2.status, 201, "%s: retry %r" % (name, r2))
                self.assertIsNone(r2.header("Idempotent-Replayed"), name)
                self.assertEqual(r2.json()["id"], p["id"], name)
                self.assertEqual(r2.json()["status"], "processing", name)
                self.assertEqual({c["number"] for c in self.creates()}, {p["id"]}, name)
                live = [n for n, o in self.sim.order_map().items() if not o["tombstone"]]
                self.assertEqual(live, [p["id"]], name)
                self.assertTrue(all(c["sig_ok"] for c in self.creates()), name)
                r3 = m.post("/v1/payments", body, key=key)
                self.assertEqual((r3.status, r3.body, r3.header("Idempotent-Replayed")),
                                 (201, r2.body, "true"), name)
                self.sim.pay(p["id"], "SUCCESS")
                self.wait_status(m, p["id"], "succeeded")
                self.check([m], orders=[(m, body["merchant_order_no"])], got201=[p["id"]],
                           keys=[(m, key)])
                self.assertEqual(m.balance(), 610)

    def test_declined_answer_with_bad_signature_is_unknown(self):
        """A 4xx whose signature is wrong is no definite refusal: not stored."""
        self.sim.faults({"call": "create", "mode": "reset", "count": 2})
        m = self.server.new_merchant()
        key = uid("K")
        body = self.body(m, 260)
        self.assertUnknown(m.post("/v1/payments", body, key=key))
        no = self.creates()[0]["number"]
        st, _js = simharness.channel_call(self.sim, self.ch.secret, "POST",
                                          "/orders/%s/close" % no, {})
        self.assertEqual(st, 200)
        self.sim.faults({"call": "create", "mode": "bad_signature", "count": 2})
        r = m.post("/v1/payments", body, key=key)
        self.assertUnknown(r, "409 ORDER_CLOSED with a bad signature")
        self.assertEqual(simharness.payment_by_order(m, body["merchant_order_no"])["status"],
                         "creating")
        self.sim.config(faults=[])
        self.assertDeclined(m.post("/v1/payments", body, key=key), "ORDER_CLOSED")

    def test_notification_before_an_unknown_answer(self):
        """The SUCCESS notification arrives while the create is in flight, and
        then the create's answer is lost: the payment stays succeeded,
        credited once, and the retry answers it."""
        for name, fault in (("5xx_after", {"mode": "5xx_after"}),
                            ("reset_after", {"mode": "reset", "after": True, "count": 2})):
            with self.subTest(fault=name):
                self.sim.reset()
                self.sim.config(notify_mode="before_return")
                self.sim.faults(dict(fault, call="create"))
                m = self.server.new_merchant()
                key = uid("K")
                body = self.body(m, 710)
                r = m.post("/v1/payments", body, key=key)
                self.assertIn(r.status, (201, 503), r)
                self.sim.config(faults=[])
                deliveries = self.sim.notifications()
                self.assertEqual([d["http_status"] for d in deliveries], [200], name)
                p = simharness.payment_by_order(m, body["merchant_order_no"])
                self.assertEqual(p["status"], "succeeded", "%s: %r after the notification"
                                 % (name, p))
                self.assertEqual(m.balance(), 710, name)
                r2 = m.post("/v1/payments", body, key=key)
                self.assertEqual(r2.status, 201, "%s: %r" % (name, r2))
                self.assertEqual((r2.json()["id"], r2.json()["status"]), (p["id"], "succeeded"))
                time.sleep(0.3)
                self.assertEqual(m.balance(), 710, name)
                self.check([m], orders=[(m, body["merchant_order_no"])], keys=[(m, key)],
                           got201=[p["id"]])

    def test_slow_within_timeout_is_ok(self):
        self.sim.faults({"call": "create", "mode": "slow", "delay_ms": 400})
        m = self.server.new_merchant()
        r = m.post("/v1/payments", self.body(m, 100), key=uid("K"))
        self.assertEqual((r.status, r.json()["status"]), (201, "processing"), r)

    def test_connection_refused(self):
        port = simharness.harness.free_port()
        name = "dead" + simharness.uuid_hex()
        self.server.idemctl("--json", "channel", "add", name, "--base-url",
                            "http://127.0.0.1:%d" % port, "--timeout-ms", "1000")
        m = self.server.new_merchant()
        body = self.body(m, 100, channel=name)
        key = uid("K")
        self.assertUnknown(m.post("/v1/payments", body, key=key))
        p = simharness.payment_by_order(m, body["merchant_order_no"])
        self.assertEqual(p["status"], "creating")
        self.assertUnknown(m.post("/v1/payments", body, key=key))
        self.assertEqual(simharness.payment_by_order(m, body["merchant_order_no"])["id"], p["id"])

    def test_metrics(self):
        m = self.server.new_merchant()
        self.assertEqual(m.post("/v1/payments", self.body(m), key=uid("K")).status, 201)
        n = simharness.metric(self.server, "idem_channel_calls_total", channel=self.ch.name,
                              call="create")
        self.assertIsNotNone(n, "no idem_channel_calls_total{channel,call=create}")
        self.assertGreaterEqual(n, 1)
        self.assertIsNotNone(simharness.metric(self.server, "idem_channel_queue_depth"))
        for fault, outcome in (({"mode": "5xx_before"}, "unknown"),
                               ({"mode": "decline", "code": "X"}, "declined")):
            before = simharness.metric(self.server, "idem_channel_calls_total",
                                       channel=self.ch.name, call="create", outcome=outcome) or 0
            self.sim.faults(dict(fault, call="create"))
            r = m.post("/v1/payments", self.body(m), key=uid("K"))
            self.assertIn(r.status, (402, 503), r)
            after = simharness.metric(self.server, "idem_channel_calls_total",
                                      channel=self.ch.name, call="create", outcome=outcome)
            self.assertEqual(after, before + 1, "idem_channel_calls_total outcome=%s" % outcome)
        self.assertIsNotNone(simharness.metric(self.server, "idem_sweeper_runs_total"))

    # ---- refunds -------------------------------------------------------
    def paid(self, m, amount=1000):
        self.sim.config(pay_mode="immediate")
        r = m.post("/v1/payments", self.body(m, amount), key=uid("K"))
        self.assertEqual((r.status, r.json()["status"]), (201, "succeeded"), r)
        self.sim.config(pay_mode="pending")
        return r.json()

    def refund(self, m, pid, amount, key=None, rno=None):
        body = {"refund_request_no": rno or uid("R"), "payment_id": pid, "amount": amount}
        return body, m.post("/v1/refunds", body, key=key or uid("RK"))

    def refund_calls(self):
        return [c for c in self.sim.calls() if c.get("call") == "refund"]

    def test_refund_success(self):
        m = self.server.new_merchant()
        p = self.paid(m, 1000)
        body, r = self.refund(m, p["id"], 300)
        self.assertEqual(r.status, 201, r)
        rf = r.json()
        self.assertEqual(rf["status"], "succeeded", r)
        self.assertTrue(rf["id"].startswith("re_"), r)
        calls = self.refund_calls()
        self.assertEqual(len(calls), 1)
        self.assertEqual(calls[0]["body"]["out_refund_no"], rf["id"])
        self.assertEqual(calls[0]["body"]["out_trade_no"], p["id"])
        self.assertEqual(calls[0]["body"]["amount"], 300)
        self.assertTrue(calls[0]["sig_ok"])
        self.assertEqual(m.balance(), 700)
        pay = m.payment(p["id"])
        self.assertEqual((pay["status"], pay["refunded_amount"]), ("partially_refunded", 300))
        # the cap is still idemd's: 800 more would pass the payment
        body2, r2 = self.refund(m, p["id"], 800)
        self.assertEqual((r2.status, r2.json().get("code")), (409, "refund_exceeds_payment"), r2)
        self.assertEqual(len(self.refund_calls()), 1, "an over-cap refund reached the channel")

    def test_refund_processing(self):
        m = self.server.new_merchant()
        p = self.paid(m, 1000)
        self.sim.config(refund_mode="processing")
        body, r = self.refund(m, p["id"], 400)
        self.assertEqual((r.status, r.json().get("status")), (201, "processing"), r)

    def test_refund_declined_restores_balance(self):
        m = self.server.new_merchant()
        p = self.paid(m, 1000)
        self.sim.config(refund_mode="decline")
        key = uid("RK")
        body, r = self.refund(m, p["id"], 400, key=key)
        self.assertDeclined(r, "REFUND_DECLINED")
        again = m.post("/v1/refunds", body, key=key)
        self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                         (402, r.body, "true"))
        self.assertEqual(m.balance(), 1000)
        pay = m.payment(p["id"])
        self.assertEqual((pay["status"], pay["refunded_amount"]), ("succeeded", 0))
        # the whole amount can still be refunded
        self.sim.config(refund_mode="success")
        body2, r2 = self.refund(m, p["id"], 1000)
        self.assertEqual((r2.status, r2.json().get("status")), (201, "succeeded"), r2)
        self.assertEqual(m.balance(), 0)

    def test_refund_unknown_retry_same_number(self):
        for name, fault, _exists in UNKNOWN_FAULTS[:6]:
            with self.subTest(fault=name):
                self.sim.reset()
                m = self.server.new_merchant()
                p = self.paid(m, 1000)
                self.sim.faults(dict(fault, call="refund"))
                key = uid("RK")
                body, r = self.refund(m, p["id"], 250, key=key)
                self.assertUnknown(r, name)
                self.sim.config(faults=[])
                nos = {c["body"]["out_refund_no"] for c in self.refund_calls()}
                self.assertEqual(len(nos), 1, name)
                r2 = m.post("/v1/refunds", body, key=key)
                if r2.status == 409 and r2.json().get("code") == "request_in_progress":
                    time.sleep(1.0)
                    r2 = m.post("/v1/refunds", body, key=key)
                self.assertEqual(r2.status, 201, "%s: %r" % (name, r2))
                self.assertEqual(r2.json()["id"], nos.pop(), name)
                self.assertEqual({c["body"]["out_refund_no"] for c in self.refund_calls()},
                                 {r2.json()["id"]}, name)
                self.assertEqual(len(self.sim.refunds()), 1, name)
                self.assertEqual(m.balance(), 750, name)


if __name__ == "__main__":
    simharness.main()
