"""Money movements: channel notifications and the payment state machine,
signatures, refunds, transfers, balances and their ledger."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402


class Notifications(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()
        cls.other_ch = cls.server.new_channel()

    def assertAck(self, r, replay=None):
        self.assertStatus(r, 200)
        self.assertEqual(r.json(), {"result": "success"})
        if replay is True:
            self.assertEqual(r.header("Idempotent-Replayed"), "true", r)
        elif replay is False:
            self.assertIsNone(r.header("Idempotent-Replayed"), r)

    def test_success_credits_once(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 1500)
        body = self.ch.body(p["id"], 1500)
        first = self.ch.post(body)
        self.assertAck(first, replay=False)
        got = m.payment(p["id"])
        self.assertEqual(got["status"], "succeeded")
        self.assertGreaterEqual(harness.parse_time(got["updated_at"]),
                                harness.parse_time(got["created_at"]))
        self.assertEqual(m.balance("CNY"), 1500)
        # the same delivery repeated: a replay, no second credit
        for _ in range(3):
            self.assertReplayOf(self.ch.post(body), first)
        # re-encoded (other field order): same canonical body, still a replay
        raw = harness.dumps(dict(reversed(list(body.items()))))
        self.assertReplayOf(self.ch.post(raw), first)
        # a late delivery under a new notify id: acknowledged, nothing changes
        self.assertAck(self.ch.notify(p["id"], 1500), replay=False)
        self.assertAck(self.ch.notify(p["id"], 1500, "FAILED"))
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        self.assertEqual(m.balance("CNY"), 1500)
        self.assertLedger()
        rows = self.server.ledger_rows(m.id)
        if rows is not None:
            self.assertEqual(rows, [("CNY", 1500)])

    def test_failed(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 700)
        self.assertAck(self.ch.notify(p["id"], 700, "FAILED"), replay=False)
        self.assertEqual(m.payment(p["id"])["status"], "failed")
        # final: a later SUCCESS is acknowledged and changes nothing
        self.assertAck(self.ch.notify(p["id"], 700, "SUCCESS"))
        self.assertEqual(m.payment(p["id"])["status"], "failed")
        self.assertEqual(m.balance("CNY"), 0)
        # a failed payment cannot be refunded (stored 409)
        body = {"refund_request_no": uid("R"), "payment_id": p["id"], "amount": 100}
        r = m.post("/v1/refunds", body)
        self.assertProblem(r, 409, "payment_not_refundable")
        self.assertReplayOf(m.post("/v1/refunds", body), r)
        self.assertLedger()

    def test_amount_mismatch_422_stored(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 1000)
        body = self.ch.body(p["id"], 999)
        r = self.ch.post(body)
        self.assertProblem(r, 422, "amount_mismatch")
        self.assertIsNone(r.header("Idempotent-Replayed"))
        self.assertReplayOf(self.ch.post(body), r, 422)
        self.assertEqual(m.payment(p["id"])["status"], "processing")
        self.assertEqual(m.balance("CNY"), 0)
        # a correct delivery afterwards still works, once
        self.assertAck(self.ch.notify(p["id"], 1000), replay=False)
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        self.assertEqual(m.balance("CNY"), 1000)
        # and the mismatching one still replays its 422, changing nothing
        self.assertReplayOf(self.ch.post(body), r, 422)
        self.assertEqual(m.balance("CNY"), 1000)

    def test_signatures(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 1200)
        nid = uid("N")
        body = harness.dumps(self.ch.body(p["id"], 1200, notify_id=nid))
        good = harness.sign(self.ch.secret, body)
        bad = {
            "missing": None,
            "empty": "",
            "garbage": "nothex",
            "flipped": good[:-1] + ("0" if good[-1] != "0" else "1"),
            "truncated": good[:32],
            "other secret": harness.sign(self.other_ch.secret, body),
            "of another body": harness.sign(self.ch.secret, body + b" "),
            "sha1 length": "0" * 40,
            "with prefix": "sha256=" + good,
        }
        for name, sig in bad.items():
            with self.subTest(name):
                self.assertProblem(self.ch.post(body, signature=sig), 401, "invalid_signature")
        # body changed after signing (white space only)
        self.assertProblem(self.ch.post(body + b"\n", signature=good), 401, "invalid_signature")
        self.assertEqual(m.payment(p["id"])["status"], "processing")
        self.assertEqual(m.balance("CNY"), 0)
        # nothing stored under the notify id: the signed delivery is a first one
        self.assertAck(self.ch.post(body, signature=good), replay=False)
        self.assertEqual(m.balance("CNY"), 1200)

    def test_signature_checked_before_body(self):
        self.assertProblem(self.ch.post(b"{broken", signature="00" * 32), 401,
                           "invalid_signature")

    def test_wrong_channel_or_unknown_payment_404(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 400)
        body = self.other_ch.body(p["id"], 400)
        r = self.other_ch.post(body)
        self.assertProblem(r, 404, "not_found")
        self.assertProblem(self.other_ch.post(body), 404, "not_found")   # not stored
        r = self.ch.post(self.ch.body("pay_" + "0" * 24, 400))
        self.assertProblem(r, 404, "not_found")
        self.assertEqual(m.payment(p["id"])["status"], "processing")
        self.assertEqual(m.balance("CNY"), 0)

    def test_unknown_channel(self):
        # an unregistered channel has no secret: nothing can verify the delivery
        m = self.merchant()
        p = m.create_payment(self.ch.name, 400)
        body = harness.dumps(self.ch.body(p["id"], 400))
        r = self.ch.post(body, channel="nosuch" + uid("").replace("-", ""))
        self.assertIn(r.status, (401, 404), r)
        self.assertProblem(r, r.status, codes=("invalid_signature", "not_found"))
        self.assertEqual(m.balance("CNY"), 0)

    def test_notification_ids_scoped_by_channel(self):
        # (channel, notify_id): the same notify id on two channels is two records
        m = self.merchant()
        pa = m.create_payment(self.ch.name, 100)
        pb = m.create_payment(self.other_ch.name, 200)
        nid = uid("N")
        self.assertAck(self.ch.notify(pa["id"], 100, notify_id=nid), replay=False)
        self.assertAck(self.other_ch.notify(pb["id"], 200, notify_id=nid), replay=False)
        self.assertEqual(m.balance("CNY"), 300)

    def test_same_notify_id_other_body_422(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name, 100)
        nid = uid("N")
        self.assertAck(self.ch.notify(p["id"], 100, notify_id=nid))
        r = self.ch.notify(p["id"], 100, "FAILED", notify_id=nid)
        self.assertProblem(r, 422, "idempotency_key_reused")
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")


class Refunds(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()

    def refund(self, m, pid, amount, rno=None, key=None, **extra):
        body = {"refund_request_no": rno or uid("R"), "payment_id": pid, "amount": amount}
        body.update(extra)
        return m.post("/v1/refunds", body, key=key), body

    def test_partial_then_full(self):
        m = self.merchant()
        p = m.paid_payment(self.ch, 1000)
        r, body = self.refund(m, p["id"], 300, reason="customer asked")
        self.assertFirst(r, 201)
        re_ = r.json()
        self.assertRegex(re_["id"], r"^re_[A-Za-z0-9_]{8,}$")
        self.assertEqual(re_["object"], "refund")
        self.assertEqual(re_["refund_request_no"], body["refund_request_no"])
        self.assertEqual(re_["payment_id"], p["id"])
        self.assertEqual(re_["amount"], 300)
        self.assertEqual(re_["status"], "succeeded")
        harness.parse_time(re_["created_at"])
        got = m.payment(p["id"])
        self.assertEqual(got["refunded_amount"], 300)
        self.assertEqual(got["status"], "partially_refunded")
        self.assertEqual(m.balance("CNY"), 700)
        # replay: same bytes, no second debit
        self.assertReplayOf(m.post("/v1/refunds", body), r)
        self.assertEqual(m.balance("CNY"), 700)
        # the rest
        r2, _ = self.refund(m, p["id"], 700)
        self.assertFirst(r2, 201)
        got = m.payment(p["id"])
        self.assertEqual(got["refunded_amount"], 1000)
        self.assertEqual(got["status"], "refunded")
        self.assertEqual(m.balance("CNY"), 0)
        # refunded is final
        r3, b3 = self.refund(m, p["id"], 1)
        self.assertProblem(r3, 409, "payment_not_refundable")
        self.assertReplayOf(m.post("/v1/refunds", b3), r3)
        self.assertLedger()
        rows = self.server.ledger_rows(m.id)
        if rows is not None:
            self.assertEqual(sorted(a for _c, a in rows), [-700, -300, 1000])

    def test_refund_exceeds_payment(self):
        m = self.merchant()
        # give the merchant plenty of balance, so only the payment bound matters
        m.paid_payment(self.ch, 100000)
        p = m.paid_payment(self.ch, 1000)
        r, body = self.refund(m, p["id"], 1001)
        self.assertProblem(r, 409, "refund_exceeds_payment")
        self.assertReplayOf(m.post("/v1/refunds", body), r, 409)
        self.assertFirst(self.refund(m, p["id"], 600)[0], 201)
        r, body = self.refund(m, p["id"], 401)
        self.assertProblem(r, 409, "refund_exceeds_payment")
        rec = m.record("refund", body["refund_request_no"])
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["http_status"], 409)
        got = m.payment(p["id"])
        self.assertEqual(got["refunded_amount"], 600)
        self.assertEqual(got["status"], "partially_refunded")
        self.assertEqual(m.balance("CNY"), 101000 - 600)
        self.assertFirst(self.refund(m, p["id"], 400)[0], 201)
        self.assertEqual(m.payment(p["id"])["status"], "refunded")
        self.assertLedger()

    def test_not_refundable_while_processing(self):
        m = self.merchant()
        m.paid_payment(self.ch, 5000)
        p = m.create_payment(self.ch.name, 1000)
        r, body = self.refund(m, p["id"], 100)
        self.assertProblem(r, 409, "payment_not_refundable")
        self.assertReplayOf(m.post("/v1/refunds", body), r, 409)
        # stored: even after the payment succeeds, this request keeps its answer
        self.assertStatus(self.ch.notify(p["id"], 1000), 200)
        self.assertReplayOf(m.post("/v1/refunds", body), r, 409)
        self.assertEqual(m.balance("CNY"), 6000)

    def test_insufficient_balance(self):
        a, b = self.merchant(), self.merchant()
        p = a.paid_payment(self.ch, 1000)
        t = a.post("/v1/transfers", {"transfer_no": uid("T"), "to_merchant": b.id,
                                     "amount": 800, "currency": "CNY"})
        self.assertFirst(t, 201)
        r, body = self.refund(a, p["id"], 500)
        self.assertProblem(r, 409, "insufficient_balance")
        self.assertReplayOf(a.post("/v1/refunds", body), r, 409)
        self.assertEqual(a.balance("CNY"), 200)
        got = a.payment(p["id"])
        self.assertEqual(got["refunded_amount"], 0)
        self.assertEqual(got["status"], "succeeded")
        self.assertFirst(self.refund(a, p["id"], 200)[0], 201)
        self.assertEqual(a.balance("CNY"), 0)
        self.assertLedger()

    def test_unknown_payment_404_not_stored(self):
        m = self.merchant()
        r, body = self.refund(m, "pay_" + "f" * 24, 100)
        self.assertProblem(r, 404, "not_found")
        self.assertNoRecord(m, "refund", body["refund_request_no"])

    def test_refund_backstop(self):
        m = self.merchant()
        p = m.paid_payment(self.ch, 1000)
        r, body = self.refund(m, p["id"], 100, key=uid("K"))
        self.assertFirst(r)
        back = m.post("/v1/refunds", body, key=uid("K"))
        self.assertStatus(back, 200)
        self.assertEqual(back.header("Idempotent-Replayed"), "true")
        self.assertEqual(back.json()["id"], r.json()["id"])
        conflict = m.post("/v1/refunds", dict(body, amount=101), key=uid("K"))
        pr = self.assertProblem(conflict, 409, "business_key_conflict")
        self.assertEqual(pr.get("existing_id"), r.json()["id"])
        self.assertEqual(m.payment(p["id"])["refunded_amount"], 100)
        self.assertEqual(m.balance("CNY"), 900)


class Transfers(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()

    def transfer(self, frm, to_id, amount, currency="CNY", tno=None, key=None):
        body = {"transfer_no": tno or uid("T"), "to_merchant": to_id, "amount": amount,
                "currency": currency}
        return frm.post("/v1/transfers", body, key=key), body

    def test_transfer(self):
        a, b = self.merchant(), self.merchant()
        a.paid_payment(self.ch, 1000)
        r, body = self.transfer(a, b.id, 400)
        self.assertFirst(r, 201)
        t = r.json()
        self.assertRegex(t["id"], r"^tr_[A-Za-z0-9_]{8,}$")
        self.assertEqual(t["object"], "transfer")
        self.assertEqual(t["transfer_no"], body["transfer_no"])
        self.assertEqual(t["from_merchant"], a.id)
        self.assertEqual(t["to_merchant"], b.id)
        self.assertEqual(t["amount"], 400)
        self.assertEqual(t["currency"], "CNY")
        self.assertEqual(t["status"], "succeeded")
        harness.parse_time(t["created_at"])
        self.assertEqual(a.balance("CNY"), 600)
        self.assertEqual(b.balance("CNY"), 400)
        self.assertReplayOf(a.post("/v1/transfers", body), r)
        self.assertEqual(a.balance("CNY"), 600)
        self.assertEqual(b.balance("CNY"), 400)
        # B can spend what it received
        r2, _ = self.transfer(b, a.id, 150)
        self.assertFirst(r2, 201)
        self.assertEqual(a.balance("CNY"), 750)
        self.assertEqual(b.balance("CNY"), 250)
        self.assertLedger()
        ra, rb = self.server.ledger_rows(a.id), self.server.ledger_rows(b.id)
        if ra is not None:
            # each transfer: one entry per side, the two summing to zero
            self.assertEqual(sorted(x for _c, x in ra), [-400, 150, 1000])
            self.assertEqual(sorted(x for _c, x in rb), [-150, 400])

    def test_insufficient_balance_stored(self):
        a, b = self.merchant(), self.merchant()
        a.paid_payment(self.ch, 1000)
        r, body = self.transfer(a, b.id, 1001)
        self.assertProblem(r, 409, "insufficient_balance")
        self.assertReplayOf(a.post("/v1/transfers", body), r, 409)
        # stored: even once the balance would allow it, this request keeps its answer
        a.paid_payment(self.ch, 5000)
        self.assertReplayOf(a.post("/v1/transfers", body), r, 409)
        # other currency: nothing there
        r, _ = self.transfer(a, b.id, 1, "USD")
        self.assertProblem(r, 409, "insufficient_balance")
        # the whole balance may go
        self.assertFirst(self.transfer(a, b.id, 6000)[0], 201)
        self.assertEqual(a.balance("CNY"), 0)
        self.assertEqual(b.balance("CNY"), 6000)
        self.assertLedger()

    def test_unknown_merchant_404_not_stored(self):
        a = self.merchant()
        a.paid_payment(self.ch, 1000)
        key = uid("K")
        r, body = self.transfer(a, "m_" + "0" * 24, 100, key=key)
        self.assertProblem(r, 404, "unknown_merchant")
        self.assertProblem(a.post("/v1/transfers", body, key=key), 404, "unknown_merchant")
        self.assertNoRecord(a, "transfer", key)
        self.assertNoRecord(a, "transfer", body["transfer_no"])
        self.assertEqual(a.balance("CNY"), 1000)

    def test_transfer_backstop(self):
        a, b = self.merchant(), self.merchant()
        a.paid_payment(self.ch, 1000)
        r, body = self.transfer(a, b.id, 100, key=uid("K"))
        self.assertFirst(r)
        back = a.post("/v1/transfers", body, key=uid("K"))
        self.assertStatus(back, 200)
        self.assertEqual(back.header("Idempotent-Replayed"), "true")
        self.assertEqual(back.json()["id"], r.json()["id"])
        c = a.post("/v1/transfers", dict(body, amount=99), key=uid("K"))
        pr = self.assertProblem(c, 409, "business_key_conflict")
        self.assertEqual(pr.get("existing_id"), r.json()["id"])
        self.assertEqual(b.balance("CNY"), 100)

    def test_balance_lists_currencies(self):
        m = self.merchant()
        self.assertTrue(all(v == 0 for v in m.balances().values()))
        m.paid_payment(self.ch, 700, "CNY")
        m.paid_payment(self.ch, 250, "USD")
        self.assertEqual({k: v for k, v in m.balances().items() if v}, {"CNY": 700, "USD": 250})
        r = m.get("/v1/balance")
        self.assertEqual((r.header("Content-Type") or "").split(";")[0].strip(),
                         "application/json")
        self.assertLedger()


if __name__ == "__main__":
    harness.main()
