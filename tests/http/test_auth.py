"""Authentication and isolation between merchants: bearer keys, 401s that
write nothing, per-merchant scope of keys, reads, refunds and records."""

import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402


class Auth(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()

    def post_as(self, auth, body, key=None):
        h = {"Content-Type": "application/json"}
        if auth is not None:
            h["Authorization"] = auth
        if key is not None:
            h["Idempotency-Key"] = key
        return self.server.request("POST", "/v1/payments", harness.dumps(body), h)

    def test_missing_or_wrong_bearer_is_401_and_writes_nothing(self):
        m = self.merchant()
        other = self.merchant()
        cases = {
            "missing": None,
            "empty": "",
            "bearer only": "Bearer",
            "bearer space": "Bearer ",
            "wrong key": "Bearer sk_" + "0" * 40,
            "truncated key": "Bearer " + m.api_key[:-1],
            "key plus byte": "Bearer " + m.api_key + "x",
            "no scheme": m.api_key,
            "basic": "Basic " + m.api_key,
            "two keys": "Bearer %s %s" % (m.api_key, other.api_key),
        }
        for name, auth in cases.items():
            with self.subTest(name):
                key = uid("K")
                body = m.payment_body(100, "CNY", self.ch.name)
                self.assertProblem(self.post_as(auth, body, key), 401, "unauthorized")
                # nothing written: no record, no payment, and the same key with
                # the right bearer is a first request
                self.assertNoRecord(m, "payment", key)
                self.assertProblem(m.get("/v1/payments?merchant_order_no="
                                         + body["merchant_order_no"]), 404, "not_found")
                self.assertFirst(m.post("/v1/payments", body, key=key), 201)

    def test_401_on_reads(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name)
        for path in ("/v1/payments/" + p["id"], "/v1/balance",
                     "/v1/payments?merchant_order_no=" + p["merchant_order_no"],
                     "/v1/idempotency-records/payment/" + p["merchant_order_no"]):
            with self.subTest(path):
                self.assertProblem(self.server.request("GET", path), 401, "unauthorized")
                self.assertProblem(self.server.request(
                    "GET", path, headers={"Authorization": "Bearer sk_nope"}), 401,
                    "unauthorized")

    def test_401_on_refunds_and_transfers(self):
        m = self.merchant()
        b = self.merchant()
        p = m.paid_payment(self.ch, 1000)
        rno, tno = uid("R"), uid("T")
        r = self.server.request("POST", "/v1/refunds", harness.dumps(
            {"refund_request_no": rno, "payment_id": p["id"], "amount": 100}),
            {"Content-Type": "application/json"})
        self.assertProblem(r, 401, "unauthorized")
        r = self.server.request("POST", "/v1/transfers", harness.dumps(
            {"transfer_no": tno, "to_merchant": b.id, "amount": 100, "currency": "CNY"}),
            {"Content-Type": "application/json", "Authorization": "Bearer sk_bad"})
        self.assertProblem(r, 401, "unauthorized")
        self.assertEqual(m.balance("CNY"), 1000)
        self.assertEqual(b.balance("CNY"), 0)
        self.assertEqual(m.payment(p["id"])["refunded_amount"], 0)
        self.assertNoRecord(m, "refund", rno)
        self.assertNoRecord(m, "transfer", tno)

    def test_auth_checked_before_body(self):
        # api-notes order: route and method, auth, size, Content-Type, JSON
        r = self.server.request("POST", "/v1/payments", b"{not json",
                                {"Content-Type": "application/json"})
        self.assertProblem(r, 401, "unauthorized")
        r = self.server.request("POST", "/v1/payments", b"x", {"Content-Type": "text/plain"})
        self.assertProblem(r, 401, "unauthorized")

    def test_other_merchant_same_key_and_order_gets_own_record(self):
        a, b = self.merchant(), self.merchant()
        key = uid("K")
        order = uid("ORD")
        ra = a.post("/v1/payments", a.payment_body(1111, "CNY", self.ch.name, order=order),
                    key=key)
        self.assertFirst(ra)
        # B: same key, same order number, other amount: its own first request
        rb = b.post("/v1/payments", b.payment_body(2222, "CNY", self.ch.name, order=order),
                    key=key)
        self.assertFirst(rb, 201)
        self.assertNotEqual(rb.body, ra.body)
        self.assertNotEqual(rb.json()["id"], ra.json()["id"])
        self.assertEqual(rb.json()["amount"], 2222)
        # B: identical body to A's, own key space too: first, never A's bytes
        key2, order2 = uid("K"), uid("ORD")
        body = a.payment_body(3333, "CNY", self.ch.name, order=order2)
        ra2 = a.post("/v1/payments", body, key=key2)
        rb2 = b.post("/v1/payments", body, key=key2)
        self.assertFirst(ra2)
        self.assertFirst(rb2)
        self.assertNotEqual(ra2.json()["id"], rb2.json()["id"])
        # natural keys are scoped as well
        order3 = uid("ORD")
        ra3 = a.post("/v1/payments", a.payment_body(10, "CNY", self.ch.name, order=order3))
        rb3 = b.post("/v1/payments", b.payment_body(10, "CNY", self.ch.name, order=order3))
        self.assertFirst(ra3)
        self.assertFirst(rb3)
        self.assertNotEqual(ra3.json()["id"], rb3.json()["id"])
        # each sees its own by order number
        ga = a.get("/v1/payments?merchant_order_no=" + order)
        gb = b.get("/v1/payments?merchant_order_no=" + order)
        self.assertEqual(ga.json()["id"], ra.json()["id"])
        self.assertEqual(gb.json()["id"], rb.json()["id"])
        # each sees its own record
        self.assertEqual(a.record("payment", key).json()["http_status"], 201)
        self.assertEqual(b.record("payment", key).json()["http_status"], 201)
        self.assertNotEqual(a.record("payment", key).json()["fingerprint"],
                            b.record("payment", key).json()["fingerprint"])

    def test_other_merchants_payment_is_404(self):
        a, b = self.merchant(), self.merchant()
        p = a.paid_payment(self.ch, 1000)
        self.assertProblem(b.get("/v1/payments/" + p["id"]), 404, "not_found")
        self.assertProblem(b.get("/v1/payments?merchant_order_no=" + p["merchant_order_no"]),
                           404, "not_found")
        rno = uid("R")
        r = b.post("/v1/refunds", {"refund_request_no": rno, "payment_id": p["id"],
                                   "amount": 100})
        self.assertProblem(r, 404, "not_found")
        # not stored, nothing changed
        self.assertNoRecord(b, "refund", rno)
        self.assertProblem(b.post("/v1/refunds", {"refund_request_no": rno,
                                                  "payment_id": p["id"], "amount": 100}),
                           404, "not_found")
        self.assertEqual(a.payment(p["id"])["refunded_amount"], 0)
        self.assertEqual(a.balance("CNY"), 1000)
        self.assertEqual(b.balance("CNY"), 0)

    def test_records_are_scoped(self):
        a, b = self.merchant(), self.merchant()
        key = uid("K")
        a.create_payment(self.ch.name, key=key)
        self.assertStatus(a.record("payment", key), 200)
        self.assertProblem(b.record("payment", key), 404, "not_found")
        self.assertProblem(self.server.request(
            "GET", "/v1/idempotency-records/payment/" + urllib.parse.quote(key)), 401,
            "unauthorized")

    def test_balances_are_separate(self):
        a, b = self.merchant(), self.merchant()
        a.paid_payment(self.ch, 500)
        self.assertEqual(a.balance("CNY"), 500)
        self.assertTrue(all(v == 0 for v in b.balances().values()), b.balances())

    def test_api_key_never_logged(self):
        m = self.merchant()
        m.create_payment(self.ch.name)
        marker = "pay_" + uid("log").replace("-", "")
        r = self.server.request("GET", "/v1/payments/" + marker,
                                headers={"Authorization": "Bearer " + m.api_key + "x"})
        self.assertProblem(r, 401, "unauthorized")
        rid = r.header("X-Request-Id")
        log = self.server.wait_log(lambda t: rid in t)
        self.assertIn(rid, log, "the request line was never logged")
        self.assertNotIn(marker, log, "a path is logged as its route template")
        self.assertNotIn(m.api_key, log)
        self.assertNotIn(self.ch.secret, log)


if __name__ == "__main__":
    harness.main()
