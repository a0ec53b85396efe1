"""Payments and replay: creation, reads, byte-identical replays, the business
backstop, idempotency records (API.md "Payments", "Idempotency")."""

import datetime
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402


class Payments(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()

    def assertPaymentObject(self, p, body):
        self.assertIsInstance(p, dict)
        self.assertRegex(p["id"], r"^pay_[A-Za-z0-9_]{8,}$")
        self.assertEqual(p["object"], "payment")
        for f in ("merchant_order_no", "amount", "currency", "channel"):
            self.assertEqual(p[f], body[f], f)
        self.assertEqual(p["refunded_amount"], 0)
        self.assertEqual(p["status"], "processing")
        harness.parse_time(p["created_at"])
        harness.parse_time(p["updated_at"])

    def test_create_payment_201(self):
        m = self.merchant()
        body = m.payment_body(1234, "CNY", self.ch.name, description="first",
                              metadata={"cart": [1, 2], "note": "x"})
        r = m.post("/v1/payments", body, key=uid("K"))
        self.assertFirst(r, 201)
        self.assertEqual((r.header("Content-Type") or "").split(";")[0].strip(),
                         "application/json")
        self.assertPaymentObject(r.json(), body)

    def test_ids_are_distinct_and_random(self):
        m = self.merchant()
        ids = [m.create_payment(self.ch.name)["id"] for _ in range(5)]
        self.assertEqual(len(set(ids)), 5)
        # opaque and unguessable: not a counter (no two ids share their tail)
        tails = [i[len("pay_"):] for i in ids]
        self.assertGreaterEqual(min(len(t) for t in tails), 12, ids)
        self.assertFalse(all(t.isdigit() for t in tails), ids)

    def test_ids_sort_in_creation_order(self):
        """32 hex digits: 12 of the creation millisecond, then 20 random
        (docs/api-notes.md), so ids made apart in time sort in that order
        and new rows share the last leaf of the id index."""
        m = self.merchant()
        ids = []
        for _ in range(4):
            ids.append(m.create_payment(self.ch.name)["id"])
            time.sleep(0.003)
        for i in ids:
            self.assertRegex(i, r"^pay_[0-9a-f]{32}$")
        self.assertEqual(ids, sorted(ids), "ids out of creation order")
        self.assertEqual(len({i[len("pay_") + 12:] for i in ids}), 4, "random parts repeat")
        made = int(ids[0][len("pay_"):len("pay_") + 12], 16) / 1000.0
        self.assertLess(abs(made - time.time()), 60, "the time part is not the clock")

    def test_replay_is_byte_identical_with_header(self):
        m = self.merchant()
        key = uid("K")
        body = m.payment_body(500, "USD", self.ch.name)
        first = m.post("/v1/payments", body, key=key)
        self.assertFirst(first, 201)
        for _ in range(3):
            again = m.post("/v1/payments", body, key=key)
            self.assertReplayOf(again, first)
            self.assertEqual((again.header("Content-Type") or "").split(";")[0].strip(),
                             "application/json")
        # the payment exists once
        r = m.get("/v1/payments?merchant_order_no=" + body["merchant_order_no"])
        self.assertStatus(r, 200)
        self.assertEqual(r.json()["id"], first.json()["id"])
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)

    def test_replay_after_state_change_keeps_first_bytes(self):
        # the stored answer is the first response, not the payment as it is now
        m = self.merchant()
        key = uid("K")
        body = m.payment_body(800, "CNY", self.ch.name)
        first = m.post("/v1/payments", body, key=key)
        self.assertFirst(first)
        self.assertStatus(self.ch.notify(first.json()["id"], 800), 200)
        self.assertEqual(m.payment(first.json()["id"])["status"], "succeeded")
        again = m.post("/v1/payments", body, key=key)
        self.assertReplayOf(again, first)
        self.assertEqual(again.json()["status"], "processing")

    def test_natural_key_when_no_header(self):
        m = self.merchant()
        body = m.payment_body(700, "CNY", self.ch.name)
        first = m.post("/v1/payments", body)
        self.assertFirst(first, 201)
        again = m.post("/v1/payments", body)
        self.assertReplayOf(again, first)
        # changed body under the same natural key: same key, other fingerprint
        changed = dict(body, amount=701)
        self.assertProblem(m.post("/v1/payments", changed), 422, "idempotency_key_reused")
        self.assertEqual(m.payment(first.json()["id"])["amount"], 700)

    def test_get_by_id_and_by_order_no(self):
        m = self.merchant()
        body = m.payment_body(4321, "CNY", self.ch.name)
        r = m.post("/v1/payments", body)
        self.assertFirst(r, 201)
        created = r.json()
        r = m.get("/v1/payments/" + created["id"])
        self.assertStatus(r, 200)
        self.assertIsNone(r.header("Idempotent-Replayed"))
        got = r.json()
        self.assertEqual(got["id"], created["id"])
        self.assertPaymentObject(got, body)
        r = m.get("/v1/payments?merchant_order_no=" + body["merchant_order_no"])
        self.assertStatus(r, 200)
        one = r.json()
        self.assertIsInstance(one, dict, "api-notes: the one payment object, not a list")
        self.assertEqual(one["id"], created["id"])
        self.assertEqual(one["object"], "payment")

    def test_get_unknown_is_404(self):
        m = self.merchant()
        self.assertProblem(m.get("/v1/payments/pay_" + "0" * 24), 404, "not_found")
        self.assertProblem(m.get("/v1/payments?merchant_order_no=" + uid("NONE")), 404,
                           "not_found")

    def test_backstop_same_body_new_key_replays_200(self):
        m = self.merchant()
        body = m.payment_body(900, "CNY", self.ch.name)
        k1, k2 = uid("K1"), uid("K2")
        first = m.post("/v1/payments", body, key=k1)
        self.assertFirst(first, 201)
        pid = first.json()["id"]
        back = m.post("/v1/payments", body, key=k2)
        self.assertStatus(back, 200)
        self.assertEqual(back.header("Idempotent-Replayed"), "true", back)
        self.assertEqual(back.json()["id"], pid)
        self.assertEqual(back.json()["amount"], 900)
        # stored under the new key: its retries replay those bytes
        self.assertReplayOf(m.post("/v1/payments", body, key=k2), back, 200)
        # both records exist, same fingerprint (same method, path, body)
        r1, r2 = m.record("payment", k1), m.record("payment", k2)
        self.assertStatus(r1, 200)
        self.assertStatus(r2, 200)
        self.assertEqual(r1.json()["http_status"], 201)
        self.assertEqual(r2.json()["http_status"], 200)
        self.assertEqual(r1.json()["fingerprint"], r2.json()["fingerprint"])
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)

    def test_backstop_carries_resource_as_it_is_now(self):
        m = self.merchant()
        body = m.payment_body(600, "CNY", self.ch.name)
        first = m.post("/v1/payments", body, key=uid("K"))
        self.assertFirst(first, 201)
        pid = first.json()["id"]
        self.assertStatus(self.ch.notify(pid, 600), 200)
        k2 = uid("K2")
        back = m.post("/v1/payments", body, key=k2)
        self.assertStatus(back, 200)
        self.assertEqual(back.header("Idempotent-Replayed"), "true")
        self.assertEqual(back.json()["status"], "succeeded", "api-notes: resource as it is now")
        # later changes do not alter what k2 replays
        rr = m.post("/v1/refunds", {"refund_request_no": uid("R"), "payment_id": pid,
                                    "amount": 100})
        self.assertStatus(rr, 201)
        self.assertReplayOf(m.post("/v1/payments", body, key=k2), back, 200)

    def test_backstop_different_body_409_business_key_conflict(self):
        m = self.merchant()
        body = m.payment_body(1000, "CNY", self.ch.name)
        first = m.post("/v1/payments", body, key=uid("K1"))
        self.assertFirst(first)
        pid = first.json()["id"]
        k3 = uid("K3")
        changed = dict(body, amount=1001)
        conflict = m.post("/v1/payments", changed, key=k3)
        p = self.assertProblem(conflict, 409, "business_key_conflict")
        self.assertIsNone(conflict.header("Idempotent-Replayed"))
        self.assertEqual(p.get("existing_id"), pid)
        # stored: the retry replays the 409 byte for byte
        self.assertReplayOf(m.post("/v1/payments", changed, key=k3), conflict, 409)
        rec = m.record("payment", k3)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["http_status"], 409)
        # the payment itself is untouched
        self.assertEqual(m.payment(pid)["amount"], 1000)
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)

    def test_idempotency_record(self):
        m = self.merchant()
        key = uid("K")
        before = datetime.datetime.now(datetime.timezone.utc)
        m.post("/v1/payments", m.payment_body(10, "CNY", self.ch.name), key=key)
        r = m.record("payment", key)
        self.assertStatus(r, 200)
        self.assertIsNone(r.header("Idempotent-Replayed"))
        rec = r.json()
        for f in ("business_type", "key", "status", "http_status", "fingerprint", "created_at",
                  "expires_at"):
            self.assertIn(f, rec)
        self.assertEqual(rec["business_type"], "payment")
        self.assertEqual(rec["key"], key)
        self.assertEqual(rec["http_status"], 201)
        self.assertRegex(rec["fingerprint"], r"^[0-9a-f]{64}$")
        created = harness.parse_time(rec["created_at"])
        expires = harness.parse_time(rec["expires_at"])
        self.assertLess(abs((created - before).total_seconds()), 120)
        ttl = (expires - created).total_seconds()
        self.assertAlmostEqual(ttl, 24 * 3600, delta=5, msg="default payment TTL is 24 h")
        self.assertNotIn("replay", " ".join(rec.keys()).lower(),
                         "API.md: no replay counter")
        # unknown key and unknown type
        self.assertProblem(m.record("payment", uid("NOKEY")), 404, "not_found")
        self.assertProblem(m.record("refund", key), 404, "not_found")

    def test_fingerprint_ignores_order_and_spacing(self):
        m = self.merchant()
        order = uid("ORD")
        a, b = uid("KA"), uid("KB")
        m.post("/v1/payments", ('{"merchant_order_no":"%s","amount":5,"currency":"CNY",'
                                '"channel":"%s"}' % (order, self.ch.name)).encode(), key=a)
        r = m.post("/v1/payments", ('{ "channel" : "%s",\n  "currency":"CNY", "amount": 5 ,'
                                    '"merchant_order_no":"%s" }' % (self.ch.name, order)).encode(),
                   key=b)
        self.assertStatus(r, 200, "backstop with the same canonical body")
        fa = m.record("payment", a).json()["fingerprint"]
        fb = m.record("payment", b).json()["fingerprint"]
        self.assertEqual(fa, fb)

    def test_replay_shortcut_never_hides_a_mismatch(self):
        # idemd answers a retry with the first request's exact bytes from a
        # digest of those bytes (docs/api-notes.md, "Replays"); whatever
        # order the bodies come in, the canonical fingerprint decides.
        m = self.merchant()
        order, key = uid("ORD"), uid("K")
        raw = ('{"merchant_order_no":"%s","amount":5,"currency":"CNY","channel":"%s"}'
               % (order, self.ch.name)).encode()
        spaced = ('{ "channel": "%s", "amount": 5, "currency": "CNY", "merchant_order_no": "%s" }'
                  % (self.ch.name, order)).encode()
        other = raw.replace(b'"amount":5', b'"amount":6')
        first = m.post("/v1/payments", raw, key=key)
        self.assertFirst(first, 201)
        for body in (raw, raw, spaced, raw, spaced, spaced):
            self.assertReplayOf(m.post("/v1/payments", body, key=key), first)
        for _ in range(2):
            self.assertProblem(m.post("/v1/payments", other, key=key), 422,
                               "idempotency_key_reused")
            self.assertReplayOf(m.post("/v1/payments", raw, key=key), first)
        # the same bytes under the same key of another merchant are its own
        m2 = self.merchant()
        self.assertFirst(m2.post("/v1/payments", raw, key=key), 201)
        # the same bytes under another key: the backstop, not the shortcut
        self.assertStatus(m.post("/v1/payments", raw, key=uid("K2")), 200)

    def test_amount_edges_and_currencies(self):
        m = self.merchant()
        for amount, cur in ((1, "CNY"), (10 ** 15, "USD"), (99, "EUR")):
            body = m.payment_body(amount, cur, self.ch.name)
            r = m.post("/v1/payments", body)
            self.assertFirst(r, 201)
            self.assertEqual(r.json()["amount"], amount)
            self.assertEqual(r.json()["currency"], cur)

    def test_sql_metacharacters_stored_verbatim(self):
        m = self.merchant()
        evil = "x'); DROP TABLE payments; -- \" \\ %_ ` ; SELECT * FROM balances"
        body = m.payment_body(77, "CNY", self.ch.name, description=evil,
                              metadata={evil: evil, "k": "' OR '1'='1"})
        key = "k'\";--(SELECT)=1*" + uid("")
        r = m.post("/v1/payments", body, key=key)
        self.assertFirst(r, 201)
        p = r.json()
        if "description" in p:
            self.assertEqual(p["description"], evil)
        if "metadata" in p:
            self.assertEqual(p["metadata"], body["metadata"])
        self.assertReplayOf(m.post("/v1/payments", body, key=key), r)
        rec = m.record("payment", key)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["key"], key)
        # the tables are still there and the server still works
        self.assertEqual(m.payment(p["id"])["amount"], 77)
        self.assertStatus(m.get("/v1/balance"), 200)
        self.assertLedger()

    def test_sql_metacharacters_in_reads(self):
        m = self.merchant()
        m.create_payment(self.ch.name)
        for q in ("' OR '1'='1", "x' UNION SELECT * FROM payments --"):
            from urllib.parse import quote
            r = m.get("/v1/payments?merchant_order_no=" + quote(q, safe=""))
            self.assertIn(r.status, (400, 404), r)
            self.assertProblem(r, r.status, codes=("invalid_request", "not_found"))
            r = m.get("/v1/payments/" + quote("pay_x' OR '1'='1", safe=""))
            self.assertProblem(r, 404, "not_found")


if __name__ == "__main__":
    harness.main()
