"""Tenant isolation (issue 13), over a real idemd: for every read and write
route, merchant A's key never sees or changes merchant B's payments,
refunds, transfers, notifications or idempotency records, and one channel's
signature never acts for another channel. Each check also reads B's state
back with B's own key, so "A got a 404" cannot hide "and B's data moved".

Runs on SQLite by default, on any backend with IDEM_TEST_DB_URL.
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "http"))

import harness  # noqa: E402
from harness import uid  # noqa: E402


class Tenancy(harness.TestCase):
    def setUp(self):
        self.a = self.merchant()
        self.b = self.merchant()
        self.ch_b = self.channel()
        self.ch_other = self.channel()
        # B's world: a paid payment, a refund, a transfer to C, records of each.
        self.c = self.merchant()
        self.pay_key = uid("K")
        self.order = uid("ORD")
        p = self.b.create_payment(self.ch_b.name, 5000, order=self.order, key=self.pay_key)
        self.notify_id = uid("N")
        r = self.ch_b.notify(p["id"], 5000, notify_id=self.notify_id)
        self.assertStatus(r, 200)
        self.pay_b = self.b.payment(p["id"])
        self.refund_no = uid("R")
        r = self.b.post("/v1/refunds", {"refund_request_no": self.refund_no,
                                        "payment_id": self.pay_b["id"], "amount": 700})
        self.assertStatus(r, 201)
        self.refund_b = r.json()
        self.transfer_no = uid("T")
        r = self.b.post("/v1/transfers", {"transfer_no": self.transfer_no,
                                          "to_merchant": self.c.id, "amount": 300,
                                          "currency": "CNY"})
        self.assertStatus(r, 201)
        self.snapshot = self.b_state()

    def b_state(self):
        """Everything of B's, read with B's key."""
        pay = self.b.payment(self.pay_b["id"])
        recs = {}
        for t, k in (("payment", self.pay_key), ("refund", self.refund_no),
                     ("transfer", self.transfer_no)):
            r = self.b.record(t, k)
            self.assertStatus(r, 200)
            recs[t] = r.json()
        return {"payment": pay, "balance": self.b.balances(), "records": recs,
                "c_balance": self.c.balances()}

    def assertBUnchanged(self):
        self.assertEqual(self.b_state(), self.snapshot)
        self.assertLedger()

    # ---- reads

    def test_get_payment_by_id(self):
        self.assertProblem(self.a.get("/v1/payments/" + self.pay_b["id"]), 404, "not_found")
        self.assertBUnchanged()

    def test_find_payment_by_order_no(self):
        self.assertProblem(self.a.get("/v1/payments?merchant_order_no=" + self.order), 404,
                           "not_found")
        # A may use the same order number: its own payment, B's untouched.
        mine = self.a.create_payment(self.ch_b.name, 100, order=self.order)
        r = self.a.get("/v1/payments?merchant_order_no=" + self.order)
        self.assertStatus(r, 200)
        self.assertEqual(r.json()["id"], mine["id"])
        self.assertNotEqual(mine["id"], self.pay_b["id"])
        r = self.b.get("/v1/payments?merchant_order_no=" + self.order)
        self.assertEqual(r.json()["id"], self.pay_b["id"])
        self.assertBUnchanged()

    def test_balance(self):
        self.assertEqual(self.a.balances(), {})
        self.assertBUnchanged()

    def test_records_of_every_type(self):
        for t, k in (("payment", self.pay_key), ("refund", self.refund_no),
                     ("transfer", self.transfer_no), ("notification", self.notify_id)):
            self.assertProblem(self.a.record(t, k), 404, "not_found")
        # The notification's record belongs to the channel, not to B either.
        self.assertProblem(self.b.record("notification", self.notify_id), 404, "not_found")
        self.assertBUnchanged()

    # ---- writes

    def test_same_idempotency_key_is_a_separate_record(self):
        body = self.a.payment_body(100, channel=self.ch_b.name)
        r = self.a.post("/v1/payments", body, key=self.pay_key)
        self.assertFirst(r, 201)           # not B's replay, not a key conflict
        self.assertNotEqual(r.json()["id"], self.pay_b["id"])
        # Even B's exact body under B's key is A's own, first request.
        r = self.a.post("/v1/payments", {"merchant_order_no": self.order, "amount": 5000,
                                         "currency": "CNY", "channel": self.ch_b.name},
                        key=uid("K"))
        self.assertFirst(r, 201)
        self.assertNotEqual(r.json()["id"], self.pay_b["id"])
        self.assertBUnchanged()

    def test_refund_of_another_merchants_payment(self):
        r = self.a.post("/v1/refunds", {"refund_request_no": uid("R"),
                                        "payment_id": self.pay_b["id"], "amount": 100})
        self.assertProblem(r, 404, "not_found")
        # Reusing B's refund number is A's own (and finds no payment of A's).
        r = self.a.post("/v1/refunds", {"refund_request_no": self.refund_no,
                                        "payment_id": self.pay_b["id"], "amount": 700})
        self.assertProblem(r, 404, "not_found")
        self.assertBUnchanged()

    def test_transfer_cannot_move_another_merchants_money(self):
        # The sender is always the caller: A has nothing, so nothing moves.
        r = self.a.post("/v1/transfers", {"transfer_no": uid("T"), "to_merchant": self.c.id,
                                          "amount": 1, "currency": "CNY"})
        self.assertProblem(r, 409, "insufficient_balance")
        # B's transfer number is A's own namespace: not B's replay.
        r = self.a.post("/v1/transfers", {"transfer_no": self.transfer_no,
                                          "to_merchant": self.c.id, "amount": 300,
                                          "currency": "CNY"})
        self.assertProblem(r, 409, "insufficient_balance")
        self.assertIsNone(r.header("Idempotent-Replayed"))
        # A cannot name B as the sender: unknown members are refused.
        r = self.a.post("/v1/transfers", {"transfer_no": uid("T"), "to_merchant": self.a.id,
                                          "from_merchant": self.b.id, "amount": 1,
                                          "currency": "CNY"})
        self.assertProblem(r, 400, "invalid_request")
        self.assertBUnchanged()

    def test_notifications_are_bound_to_their_channel(self):
        p = self.b.create_payment(self.ch_b.name, 900)
        body = self.ch_b.body(p["id"], 900)
        # Another channel's signature on B's channel path: refused.
        r = self.ch_b.post(body, signature=harness.sign(self.ch_other.secret,
                                                        harness.dumps(body)))
        self.assertProblem(r, 401, "invalid_signature")
        # Another channel notifying, correctly signed, on its own path: not its payment.
        r = self.ch_other.post(body)
        self.assertProblem(r, 404, "not_found")
        self.assertEqual(self.b.payment(p["id"])["status"], "processing")
        # A merchant key is no channel credential.
        r = self.a.server.request("POST", "/v1/notifications/" + self.ch_b.name,
                                  harness.dumps(body), self.a.headers())
        self.assertProblem(r, 401, "invalid_signature")
        self.assertEqual(self.b.payment(p["id"])["status"], "processing")
        # Replaying B's delivered notify_id from another channel is not B's replay.
        r = self.ch_other.post(self.ch_b.body(self.pay_b["id"], 5000, notify_id=self.notify_id))
        self.assertProblem(r, 404, "not_found")
        self.assertBUnchanged()

    def test_a_channel_secret_is_no_merchant_key(self):
        key = self.b.api_key
        near = key[:-1] + ("1" if key[-1] == "0" else "0")   # one digit off
        for cred in (self.ch_b.secret, near, key.upper(), key + "0", key[:-1]):
            r = self.a.server.request("GET", "/v1/balance", None,
                                      {"Authorization": "Bearer " + cred})
            self.assertProblem(r, 401, "unauthorized")
        self.assertBUnchanged()

if __name__ == "__main__":
    harness.main()
