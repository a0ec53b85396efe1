"""Bad input: malformed JSON, wrong types, unknown fields, huge numbers,
bad currencies and natural keys, SQL metacharacters, bodies over 1 MiB, wrong
Content-Type, and the order of checks. Each rejection must be the right 4xx
problem and must write nothing (no record under its key, no payment, no
balance change; the same key is still free afterwards)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402

MIB = 1024 * 1024


class BadInput(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()
        cls.m = cls.server.new_merchant()

    def payment(self, **over):
        b = {"merchant_order_no": uid("ORD"), "amount": 1000, "currency": "CNY",
             "channel": self.ch.name}
        for k, v in over.items():
            if v is DROP:
                b.pop(k, None)
            else:
                b[k] = v
        return b

    def reject(self, raw, status, code=None, codes=None, path="/v1/payments", key=True,
               headers=None, names=None):
        """POST raw bytes under a fresh key; expect the problem; check that
        the key stayed free."""
        k = uid("K") if key else None
        r = self.m.post(path, raw, key=k, headers=headers)
        p = self.assertProblem(r, status, code, codes)
        if names:
            self.assertIn(names, p["detail"], "detail should name the field: %r" % p)
        if k is not None:
            btype = {"/v1/payments": "payment", "/v1/refunds": "refund",
                     "/v1/transfers": "transfer"}[path]
            self.assertNoRecord(self.m, btype, k)
        return p

    def assertNoPayment(self, order):
        self.assertProblem(self.m.get("/v1/payments?merchant_order_no=" + order), 404,
                           "not_found")

    # -- JSON syntax
    def test_malformed_json(self):
        good = harness.dumps(self.payment())
        cases = {
            "empty": b"",
            "truncated": good[:-1],
            "garbage": b"not json",
            "array": b"[" + good + b"]",
            "string": b'"x"',
            "number": b"1000",
            "null": b"null",
            "trailing": good + b" {}",
            "single quotes": good.replace(b'"', b"'"),
            "trailing comma": good[:-1] + b",}",
            "NaN": harness.dumps(self.payment(amount=0)).replace(b":0", b":NaN"),
            "comment": b"/* c */" + good,
            "bad utf8": harness.dumps(self.payment(description="x")).replace(b'"x"',
                                                                            b'"\xff\xfe"'),
            "lone surrogate": harness.dumps(self.payment(description="x")).replace(
                b'"x"', b'"\\ud800"'),
            "nul in body": good[:-1] + b',"description":"a\x00b"}',
            "deep nesting": (b'{"merchant_order_no":"' + uid("D").encode()
                             + b'","metadata":' + b'[' * 100000 + b']' * 100000 + b'}'),
        }
        for name, raw in cases.items():
            with self.subTest(name):
                self.reject(raw, 400, "invalid_json")
        self.assertNoPayment(self.payment()["merchant_order_no"])
        self.assertStatus(self.server.request("GET", "/healthz"), 200)

    def test_duplicate_member_is_invalid_json(self):
        order = uid("ORD")
        raw = ('{"merchant_order_no":"%s","amount":1,"amount":2,"currency":"CNY",'
               '"channel":"%s"}' % (order, self.ch.name)).encode()
        self.reject(raw, 400, "invalid_json")
        self.assertNoPayment(order)

    def test_huge_numbers(self):
        for name, lit in (("1e400", "1e400"), ("2^63", str(2 ** 63)), ("-2^63-1", str(-2 ** 63 - 1)),
                          ("2^64", str(2 ** 64)), ("long", "9" * 400)):
            with self.subTest(name):
                order = uid("ORD")
                raw = ('{"merchant_order_no":"%s","amount":%s,"currency":"CNY","channel":"%s"}'
                       % (order, lit, self.ch.name)).encode()
                self.reject(raw, 400, codes=("invalid_json", "invalid_request"))
                self.assertNoPayment(order)

    # -- fields
    def test_bad_amounts(self):
        for v in (0, -1, -1000, 10 ** 15 + 1, 2 ** 63 - 1, -2 ** 63, 1000.5, 1e3, "1000", True,
                  None, [1000], {"v": 1000}):
            with self.subTest(amount=v):
                body = self.payment(amount=v)
                self.reject(harness.dumps(body), 400, "invalid_request", names="amount")
                self.assertNoPayment(body["merchant_order_no"])
        # 1000.0 is a real in JSON, not an integer
        order = uid("ORD")
        raw = ('{"merchant_order_no":"%s","amount":1000.0,"currency":"CNY","channel":"%s"}'
               % (order, self.ch.name)).encode()
        self.reject(raw, 400, "invalid_request", names="amount")
        self.assertNoPayment(order)

    def test_bad_currencies(self):
        for v in ("cny", "Cny", "CN", "CNYY", "C1Y", "", " CNY", "CNY ", "\u00c4BC", 156, None,
                  ["CNY"]):
            with self.subTest(currency=v):
                body = self.payment(currency=v)
                self.reject(harness.dumps(body), 400, "invalid_request", names="currency")
                self.assertNoPayment(body["merchant_order_no"])

    def test_bad_natural_keys(self):
        for v in ("", "a b", "x" * 65, "ORD/1", "ORD'1", "ORD;--", "ORD\n1", "\u00d6RD", "ORD%1",
                  123, None):
            with self.subTest(order=v):
                self.reject(harness.dumps(self.payment(merchant_order_no=v)), 400,
                            "invalid_request", names="merchant_order_no")
        # 64 characters of the full alphabet pass
        ok = ("Az09_-." + uid("") + "z" * 64)[:64]
        r = self.m.post("/v1/payments", self.payment(merchant_order_no=ok))
        self.assertFirst(r, 201)
        self.assertEqual(r.json()["merchant_order_no"], ok)

    def test_missing_and_mistyped_fields(self):
        cases = [
            ("amount", self.payment(amount=DROP)),
            ("currency", self.payment(currency=DROP)),
            ("description", self.payment(description=12)),
            ("description", self.payment(description=["x"])),
            ("metadata", self.payment(metadata="x")),
            ("metadata", self.payment(metadata=[1, 2])),
            ("channel", self.payment(channel=7)),
            ("channel", self.payment(channel="")),
            ("channel", self.payment(channel="nosuch" + uid("").replace("-", ""))),
        ]
        for field, body in cases:
            with self.subTest(field=field, body=body):
                self.reject(harness.dumps(body), 400, "invalid_request", names=field)
                self.assertNoPayment(body["merchant_order_no"])

    def test_unknown_fields(self):
        for name in ("amout", "status", "id", "refunded_amount", "a'b; DROP TABLE payments"):
            with self.subTest(field=name):
                body = self.payment()
                body[name] = 1
                self.reject(harness.dumps(body), 400, "invalid_request", names=name)
                self.assertNoPayment(body["merchant_order_no"])

    def test_sql_metacharacters_rejected_or_verbatim(self):
        # fields with a syntax are rejected by validation, never an SQL error
        body = self.payment(channel="mock'; DROP TABLE payments; --")
        self.reject(harness.dumps(body), 400, "invalid_request", names="channel")
        body = self.payment(currency="C'N")
        self.reject(harness.dumps(body), 400, "invalid_request", names="currency")
        self.assertFirst(self.m.post("/v1/payments", self.payment()), 201)
        self.assertLedger()

    # -- sizes
    def padded(self, size, order):
        body = harness.dumps({"merchant_order_no": order, "amount": 1000, "currency": "CNY",
                              "channel": self.ch.name})
        return body[:-1] + b" " * (size - len(body)) + b"}"

    def test_exactly_1_mib_accepted(self):
        order = uid("BIG")
        raw = self.padded(MIB, order)
        self.assertEqual(len(raw), MIB)
        r = self.m.post("/v1/payments", raw)
        self.assertFirst(r, 201)

    def test_over_1_mib_413(self):
        order = uid("BIG")
        raw = self.padded(MIB + 1, order)
        self.reject(raw, 413, "payload_too_large")
        self.assertNoPayment(order)

    def test_2_mib_413_declared_and_chunked(self):
        order = uid("BIG")
        raw = self.padded(2 * MIB, order)
        head = ("POST /v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                "Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % (self.m.api_key, len(raw))).encode()
        r = self.server.raw(head + raw)
        self.assertProblem(r, 413, "payload_too_large")
        key = uid("K")
        r = self.server.request("POST", "/v1/payments", raw, self.m.headers(key), chunked=True)
        self.assertProblem(r, 413, "payload_too_large")
        self.assertNoRecord(self.m, "payment", key)
        self.assertNoPayment(order)
        # a huge declared length is refused as well, without waiting for it
        head = ("POST /v1/payments HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                "Content-Type: application/json\r\nContent-Length: 99999999999\r\n"
                "Connection: close\r\n\r\n{" % self.m.api_key).encode()
        r = self.server.raw(head, timeout=10)
        self.assertProblem(r, 413, "payload_too_large")
        self.assertStatus(self.server.request("GET", "/healthz"), 200)

    def test_oversized_without_auth_is_401(self):
        r = self.server.request("POST", "/v1/payments", self.padded(MIB + 10, uid("BIG")),
                                {"Content-Type": "application/json"})
        self.assertProblem(r, 401, "unauthorized")

    # -- Content-Type and order of checks
    def test_content_type(self):
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "application/xml",
                      "multipart/form-data; boundary=x"):
            with self.subTest(ctype):
                body = self.payment()
                self.reject(harness.dumps(body), 415, "unsupported_media_type",
                            headers={"Content-Type": ctype})
                self.assertNoPayment(body["merchant_order_no"])
        # absent Content-Type and JSON with a charset are fine
        h = self.m.headers()
        del h["Content-Type"]
        r = self.server.request("POST", "/v1/payments", harness.dumps(self.payment()), h)
        self.assertFirst(r, 201)
        r = self.m.post("/v1/payments", self.payment(),
                        headers={"Content-Type": "application/json; charset=utf-8"})
        self.assertFirst(r, 201)

    def test_order_of_checks(self):
        # Content-Type before JSON syntax
        self.reject(b"{bad", 415, "unsupported_media_type", headers={"Content-Type": "text/plain"})
        # size before Content-Type
        self.reject(self.padded(MIB + 1, uid("BIG")), 413, "payload_too_large",
                    headers={"Content-Type": "text/plain"})
        # JSON syntax before the key's syntax
        r = self.m.post("/v1/payments", b"{bad", key="has space")
        self.assertProblem(r, 400, "invalid_json")
        # key syntax before fields
        body = self.payment(amout=1)
        r = self.m.post("/v1/payments", body, key="has space")
        self.assertProblem(r, 400, "invalid_idempotency_key")
        self.assertNoPayment(body["merchant_order_no"])

    # -- refunds, transfers, notifications
    def test_bad_refunds(self):
        m = self.server.new_merchant()
        p = m.paid_payment(self.ch, 1000)
        base = {"refund_request_no": uid("R"), "payment_id": p["id"], "amount": 100}
        cases = [
            ("amount", dict(base, amount=0)), ("amount", dict(base, amount=-5)),
            ("amount", dict(base, amount="100")), ("amount", dict(base, amount=10 ** 15 + 1)),
            ("payment_id", {k: v for k, v in base.items() if k != "payment_id"}),
            ("payment_id", dict(base, payment_id=5)),
            ("refund_request_no", dict(base, refund_request_no="R 1")),
            ("reason", dict(base, reason=5)),
            ("extra", dict(base, extra=1)),
        ]
        for field, body in cases:
            with self.subTest(field=field, body=body):
                k = uid("K")
                r = m.post("/v1/refunds", dict(body, refund_request_no=uid("R"))
                           if field != "refund_request_no" else body, key=k)
                p2 = self.assertProblem(r, 400, "invalid_request")
                self.assertIn(field, p2["detail"])
                self.assertNoRecord(m, "refund", k)
        self.assertProblem(m.post("/v1/refunds", b"[1,", key=uid("K")), 400, "invalid_json")
        got = m.payment(p["id"])
        self.assertEqual(got["refunded_amount"], 0)
        self.assertEqual(got["status"], "succeeded")
        self.assertEqual(m.balance("CNY"), 1000)

    def test_bad_transfers(self):
        a, b = self.server.new_merchant(), self.server.new_merchant()
        a.paid_payment(self.ch, 1000)
        base = {"transfer_no": uid("T"), "to_merchant": b.id, "amount": 100, "currency": "CNY"}
        cases = [
            ("amount", dict(base, amount=0)), ("amount", dict(base, amount=1.5)),
            ("currency", dict(base, currency="cny")),
            ("to_merchant", {k: v for k, v in base.items() if k != "to_merchant"}),
            ("to_merchant", dict(base, to_merchant=12)),
            ("to_merchant", dict(base, to_merchant=a.id)),   # api-notes: to oneself
            ("transfer_no", dict(base, transfer_no="T/1")),
            ("from_merchant", dict(base, from_merchant=b.id)),
        ]
        for field, body in cases:
            with self.subTest(field=field):
                if field != "transfer_no":
                    body = dict(body, transfer_no=uid("T"))
                k = uid("K")
                p2 = self.assertProblem(a.post("/v1/transfers", body, key=k), 400,
                                        "invalid_request")
                self.assertIn(field, p2["detail"])
                self.assertNoRecord(a, "transfer", k)
        self.assertEqual(a.balance("CNY"), 1000)
        self.assertEqual(b.balance("CNY"), 0)

    def test_bad_notifications(self):
        m = self.server.new_merchant()
        p = m.create_payment(self.ch.name, 1000)
        base = self.ch.body(p["id"], 1000)
        cases = [
            ("status", dict(base, status="PAID")), ("status", dict(base, status="success")),
            ("amount", dict(base, amount="1000")), ("amount", dict(base, amount=0)),
            ("notify_id", dict(base, notify_id="N 1")),
            ("payment_id", dict(base, payment_id=None)),
            ("extra", dict(base, extra=True)),
        ]
        for field, body in cases:
            with self.subTest(field=field):
                if field != "notify_id":
                    body = dict(body, notify_id=uid("N"))
                r = self.ch.post(body)
                p2 = self.assertProblem(r, 400, "invalid_request")
                self.assertIn(field, p2["detail"])
        self.assertProblem(self.ch.post(b'{"notify_id":'), 400, "invalid_json")
        got = m.payment(p["id"])
        self.assertEqual(got["status"], "processing")
        self.assertEqual(m.balance("CNY"), 0)
        # the notify id of a rejected (400) delivery is still free
        nid = uid("N")
        self.assertProblem(self.ch.post(dict(base, notify_id=nid, status="PAID")), 400,
                           "invalid_request")
        r = self.ch.post(dict(base, notify_id=nid))
        self.assertStatus(r, 200)
        self.assertIsNone(r.header("Idempotent-Replayed"))
        self.assertEqual(m.balance("CNY"), 1000)

    def test_sql_metacharacters_in_notification(self):
        m = self.server.new_merchant()
        p = m.create_payment(self.ch.name, 300)
        body = self.ch.body(p["id"], 300, txn="T'); DELETE FROM ledger_entries; --")
        r = self.ch.post(body)
        self.assertIn(r.status, (200, 400), r)
        if r.status == 400:
            self.assertProblem(r, 400, "invalid_request")
            self.assertEqual(m.balance("CNY"), 0)
        else:
            self.assertEqual(m.balance("CNY"), 300)
        self.assertLedger()


DROP = object()

if __name__ == "__main__":
    harness.main()
