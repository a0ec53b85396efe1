"""Idempotency keys: syntax (1..255 bytes of 0x21..0x7E), bare token vs
Structured Fields string, byte-for-byte comparison, canonical fingerprints,
422 on reuse, natural keys, scope by business type, TTL flag."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402


class Keys(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()
        cls.m = cls.server.new_merchant()

    def body(self, amount=1000, **extra):
        return self.m.payment_body(amount, "CNY", self.ch.name, **extra)

    # -- bare token and sf-string
    def test_bare_token_and_sf_string_are_the_same_key(self):
        key = uid("abc")
        body = self.body()
        first = self.m.post("/v1/payments", body, key=key)
        self.assertFirst(first)
        self.assertReplayOf(self.m.post("/v1/payments", body, key='"%s"' % key), first)
        # and the other way round
        key2 = uid("sf")
        body2 = self.body()
        first2 = self.m.post("/v1/payments", body2, key='"%s"' % key2)
        self.assertFirst(first2)
        self.assertReplayOf(self.m.post("/v1/payments", body2, key=key2), first2)
        rec = self.m.record("payment", key2)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["key"], key2, "the record holds the unwrapped key")

    def test_sf_string_escapes(self):
        # RFC 8941 sf-string: \" and \\ stand for " and \
        tail = uid("")
        body = self.body()
        first = self.m.post("/v1/payments", body, key='"q\\"x\\\\y%s"' % tail)
        self.assertFirst(first)
        self.assertReplayOf(self.m.post("/v1/payments", body, key='q"x\\y%s' % tail), first)
        rec = self.m.record("payment", 'q"x\\y%s' % tail)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["key"], 'q"x\\y%s' % tail)

    def test_record_of_key_with_reserved_url_characters(self):
        # any 0x21..0x7E byte may be in a key; in the records path it is
        # percent-encoded
        key = "a/b?c#d%e&f+g" + uid("")
        first = self.m.post("/v1/payments", self.body(), key=key)
        self.assertFirst(first)
        rec = self.m.record("payment", key)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["key"], key)

    def test_empty_sf_string_is_invalid(self):
        body = self.body()
        self.assertProblem(self.m.post("/v1/payments", body, key='""'), 400,
                           "invalid_idempotency_key")
        self.assertProblem(self.m.get("/v1/payments?merchant_order_no="
                                      + body["merchant_order_no"]), 404, "not_found")

    # -- length
    def test_255_bytes_pass(self):
        key = ("L255-" + uid("") + "x" * 300)[:255]
        self.assertEqual(len(key), 255)
        body = self.body()
        first = self.m.post("/v1/payments", body, key=key)
        self.assertFirst(first, 201)
        self.assertReplayOf(self.m.post("/v1/payments", body, key=key), first)
        rec = self.m.record("payment", key)
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["key"], key)

    def test_255_bytes_inside_sf_string_pass(self):
        key = ("S255-" + uid("") + "y" * 300)[:255]
        body = self.body()
        first = self.m.post("/v1/payments", body, key='"%s"' % key)
        self.assertFirst(first, 201)
        self.assertReplayOf(self.m.post("/v1/payments", body, key=key), first)

    def test_256_bytes_rejected(self):
        for key in (("L256-" + uid("") + "x" * 300)[:256], '"%s"' % ("Q256-" + "z" * 300)[:256]):
            body = self.body()
            r = self.m.post("/v1/payments", body, key=key)
            self.assertProblem(r, 400, "invalid_idempotency_key")
            self.assertProblem(self.m.get("/v1/payments?merchant_order_no="
                                          + body["merchant_order_no"]), 404, "not_found")

    def test_bad_bytes_rejected(self):
        bad = {
            "space": b"a b",
            "tab": b"a\tb",
            "ctl-01": b"a\x01b",
            "ctl-1f": b"a\x1fb",
            "del": b"a\x7fb",
            "utf8": "caf\u00e9".encode("utf-8"),
            "latin1": b"caf\xe9",
        }
        for name, raw in bad.items():
            with self.subTest(name):
                body = self.body()
                key = raw + b"-" + uid("").encode()
                try:
                    r = self.m.post("/v1/payments", body, key=key)
                except OSError as e:  # connection dropped: at least nothing executed
                    self.fail("%s: connection error instead of 400: %s" % (name, e))
                self.assertProblem(r, 400, "invalid_idempotency_key")
                self.assertProblem(self.m.get("/v1/payments?merchant_order_no="
                                              + body["merchant_order_no"]), 404, "not_found")

    def test_all_printable_ascii_is_one_valid_key(self):
        printable = "".join(chr(c) for c in range(0x21, 0x7F))
        key = "P" + printable + uid("")   # starts with P: not an sf-string
        body = self.body()
        first = self.m.post("/v1/payments", body, key=key)
        self.assertFirst(first, 201)
        self.assertReplayOf(self.m.post("/v1/payments", body, key=key), first)

    # -- comparison
    def test_case_matters(self):
        base = uid("")
        ra = self.m.post("/v1/payments", self.body(), key="A1" + base)
        rb = self.m.post("/v1/payments", self.body(), key="a1" + base)
        self.assertFirst(ra)
        self.assertFirst(rb)
        self.assertNotEqual(ra.json()["id"], rb.json()["id"])
        self.assertEqual(self.m.record("payment", "A1" + base).json()["key"], "A1" + base)
        self.assertEqual(self.m.record("payment", "a1" + base).json()["key"], "a1" + base)

    def test_natural_keys_case_matters(self):
        order = uid("ORD-A1")
        r1 = self.m.post("/v1/payments", self.body(order=order))
        r2 = self.m.post("/v1/payments", self.body(order=order.lower()))
        self.assertFirst(r1)
        self.assertFirst(r2)
        self.assertNotEqual(r1.json()["id"], r2.json()["id"])

    def test_reordered_fields_and_white_space_replay(self):
        key = uid("K")
        order = uid("ORD")
        a = ('{"merchant_order_no":"%s","amount":250,"currency":"CNY","channel":"%s",'
             '"metadata":{"b":1,"a":{"y":2,"x":[1,2]}}}' % (order, self.ch.name)).encode()
        b = ('{\n  "metadata" : { "a" : {"x" : [ 1 , 2 ], "y":2}, "b" : 1 },\r\n'
             '\t"channel":"%s", "currency" : "CNY",\n "amount":250,  "merchant_order_no":"%s"\n}'
             % (self.ch.name, order)).encode()
        first = self.m.post("/v1/payments", a, key=key)
        self.assertFirst(first)
        self.assertReplayOf(self.m.post("/v1/payments", b, key=key), first)

    def test_changed_amount_422_and_first_record_kept(self):
        key = uid("K")
        body = self.body(1000)
        first = self.m.post("/v1/payments", body, key=key)
        self.assertFirst(first)
        for _ in range(2):  # not stored: the same answer each time, never a replay
            self.assertProblem(self.m.post("/v1/payments", dict(body, amount=1001), key=key),
                               422, "idempotency_key_reused")
        # other changes are just as different: currency, an added field, a metadata value
        for changed in (dict(body, currency="USD"), dict(body, description="d"),
                        dict(body, metadata={"a": 1})):
            self.assertProblem(self.m.post("/v1/payments", changed, key=key), 422,
                               "idempotency_key_reused")
        self.assertReplayOf(self.m.post("/v1/payments", body, key=key), first)
        self.assertEqual(self.m.record("payment", key).json()["http_status"], 201)
        self.assertEqual(self.m.payment(first.json()["id"])["amount"], 1000)

    def test_same_key_other_order_no_is_422(self):
        key = uid("K")
        self.assertFirst(self.m.post("/v1/payments", self.body(), key=key))
        r = self.m.post("/v1/payments", self.body(), key=key)   # new order number
        self.assertProblem(r, 422, "idempotency_key_reused")

    def test_header_key_equal_to_natural_key_is_the_same_record(self):
        # no header: the key is merchant_order_no; a header with that same
        # string names the same (merchant, payment, key) record
        body = self.body()
        first = self.m.post("/v1/payments", body)
        self.assertFirst(first)
        self.assertReplayOf(self.m.post("/v1/payments", body, key=body["merchant_order_no"]),
                            first)

    def test_missing_key_and_natural_key(self):
        body = self.body()
        del body["merchant_order_no"]
        r = self.m.post("/v1/payments", body)
        self.assertProblem(r, 400, "missing_idempotency_key")

    def test_key_scope_includes_business_type(self):
        # the same key on another endpoint is another record, not a 422
        key = uid("K")
        m = self.server.new_merchant()
        pay = m.post("/v1/payments", m.payment_body(1000, "CNY", self.ch.name), key=key)
        self.assertFirst(pay)
        pid = pay.json()["id"]
        self.assertStatus(self.ch.notify(pid, 1000), 200)
        ref = m.post("/v1/refunds", {"refund_request_no": uid("R"), "payment_id": pid,
                                     "amount": 10}, key=key)
        self.assertFirst(ref, 201)
        self.assertEqual(m.record("payment", key).json()["business_type"], "payment")
        self.assertEqual(m.record("refund", key).json()["business_type"], "refund")

    def test_key_never_trimmed(self):
        # HTTP strips surrounding white space from field values; inside an
        # sf-string spaces are content, and a space is not a valid key byte
        body = self.body()
        r = self.m.post("/v1/payments", body, key='" %s"' % uid("sp"))
        self.assertProblem(r, 400, "invalid_idempotency_key")


class KeysTTL(harness.TestCase):
    SERVER_ARGS = ("--idempotency-ttl", "5m")

    def test_ttl_flag(self):
        ch = self.server.new_channel()
        m = self.server.new_merchant()
        key = uid("K")
        self.assertFirst(m.post("/v1/payments", m.payment_body(5, "CNY", ch.name), key=key))
        rec = m.record("payment", key)
        self.assertStatus(rec, 200)
        created = harness.parse_time(rec.json()["created_at"])
        expires = harness.parse_time(rec.json()["expires_at"])
        self.assertAlmostEqual((expires - created).total_seconds(), 300, delta=2)


class KeysExpiry(harness.TestCase):
    SERVER_ARGS = ("--idempotency-ttl", "1s")

    def test_expired_key_is_new_and_meets_the_backstop(self):
        # after the TTL the record no longer answers; the key is new again, so
        # the natural key (business unique index) decides: the same body is a
        # 200 replay of the existing payment, another body a 409 conflict
        ch = self.server.new_channel()
        m = self.server.new_merchant()
        key = uid("K")
        body = m.payment_body(10, "CNY", ch.name)
        first = m.post("/v1/payments", body, key=key)
        self.assertFirst(first, 201)
        rec = m.record("payment", key).json()
        ttl = (harness.parse_time(rec["expires_at"])
               - harness.parse_time(rec["created_at"])).total_seconds()
        self.assertAlmostEqual(ttl, 1, delta=0.5)
        time.sleep(1.6)
        again = m.post("/v1/payments", body, key=key)
        self.assertStatus(again, 200)
        self.assertEqual(again.header("Idempotent-Replayed"), "true")
        self.assertEqual(again.json()["id"], first.json()["id"])
        time.sleep(1.6)
        p = self.assertProblem(m.post("/v1/payments", dict(body, amount=11), key=key), 409,
                               "business_key_conflict")
        self.assertEqual(p.get("existing_id"), first.json()["id"])
        n = self.server.count_payments(m.id, body["merchant_order_no"])
        if n is not None:
            self.assertEqual(n, 1)


if __name__ == "__main__":
    harness.main()
