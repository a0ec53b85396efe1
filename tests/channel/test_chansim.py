#!/usr/bin/env python3
"""Self-test of tools/chansim/chansim.py: start it, drive every channel call,
fault and notification mode directly with urllib (no idemd involved). A small
HTTP receiver in this process stands in for idemd's notification endpoint."""

import hashlib
import hmac
import http.client
import json
import os
import socket
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402

SECRET = "s3cr3t-for-chansim-selftest"


def sign(data):
    return hmac.new(SECRET.encode(), data, hashlib.sha256).hexdigest()


class Receiver:
    """Notification sink: records each POST; answers codes from a list, then 200."""

    def __init__(self):
        self.got = []
        self.answers = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                with outer.lock:
                    code = outer.answers.pop(0) if outer.answers else 200
                    outer.got.append({"path": self.path, "raw": raw,
                                      "sig": self.headers.get("X-Signature"), "answer": code,
                                      "t": time.monotonic()})
                data = b'{"result":"success"}'
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def url(self, name="sim"):
        return "http://127.0.0.1:%d/v1/notifications/%s" % (self.port, name)

    def bodies(self):
        with self.lock:
            return [json.loads(g["raw"]) for g in self.got]

    def wait(self, n, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.got) >= n:
                    return list(self.got)
            time.sleep(0.02)
        with self.lock:
            return list(self.got)

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


class ChansimTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.sim = simharness.Sim()
        cls.sim.start(SECRET, [50, 50, 100])
        cls.rx = Receiver()

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()
        cls.rx.stop()

    def setUp(self):
        self.sim.reset()
        with self.rx.lock:
            self.rx.got.clear()
            self.rx.answers.clear()
        self.n = 0

    # ---- helpers -------------------------------------------------------
    def call(self, method, path, body=None, signature=True, timeout=5.0):
        """(status, json-or-None, headers, raw). Raises on a dropped connection."""
        data = None if body is None else json.dumps(body).encode()
        c = http.client.HTTPConnection("127.0.0.1", self.sim.port, timeout=timeout)
        h = {"Content-Type": "application/json", "X-Request-Id": "rq-1"}
        if signature is True:
            h["X-Signature"] = sign(data if method == "POST" else path.encode())
        elif signature:
            h["X-Signature"] = signature
        try:
            c.request(method, path, headers=h,
                      body=data if data is not None else (b"" if method == "POST" else None))
            r = c.getresponse()
            raw = r.read()
            hdrs = dict(r.getheaders())
        finally:
            c.close()
        try:
            js = json.loads(raw)
        except ValueError:
            js = None
        return r.status, js, hdrs, raw

    def order(self, no=None, amount=1000, currency="CNY"):
        self.n += 1
        return {"out_trade_no": no or "pay_%d_%d" % (os.getpid(), time.monotonic_ns()),
                "amount": amount, "currency": currency, "notify_url": self.rx.url(),
                "expire_at": "2030-01-01T00:00:00Z"}

    def assertSigned(self, hdrs, raw):
        self.assertEqual(hdrs.get("X-Signature"), sign(raw))

    def sim_order(self, no):
        return {o["out_trade_no"]: o for o in self.sim.orders()}.get(no)

    # ---- calls ---------------------------------------------------------
    def test_create_query_idempotent(self):
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(st, 200, raw)
        self.assertSigned(h, raw)
        self.assertEqual(js["code"], "OK")
        self.assertEqual(js["out_trade_no"], o["out_trade_no"])
        self.assertEqual(js["status"], "PENDING")
        txn = js["channel_txn_id"]
        st, js2, h, raw = self.call("POST", "/orders", o)
        self.assertEqual((st, js2["channel_txn_id"], js2["status"]), (200, txn, "PENDING"))
        st, js3, h, raw = self.call("POST", "/orders", dict(o, amount=999))
        self.assertEqual((st, js3["code"]), (409, "OUT_TRADE_NO_USED"))
        st, js3, h, raw = self.call("POST", "/orders", dict(o, currency="USD"))
        self.assertEqual((st, js3["code"]), (409, "OUT_TRADE_NO_USED"))
        st, q, h, raw = self.call("GET", "/orders/" + o["out_trade_no"])
        self.assertEqual(st, 200)
        self.assertSigned(h, raw)
        self.assertEqual((q["status"], q["amount"], q["channel_txn_id"], q["paid_at"]),
                         ("PENDING", 1000, txn, None))
        st, q, h, raw = self.call("GET", "/orders/pay_nope")
        self.assertEqual((st, q["code"]), (404, "ORDER_NOT_EXIST"))
        self.assertSigned(h, raw)
        self.assertEqual(len(self.sim.orders()), 1)

    def test_signatures(self):
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o, signature="00" * 32)
        self.assertEqual((st, js["code"]), (401, "SIGN_ERROR"))
        self.assertSigned(h, raw)
        st, js, h, raw = self.call("POST", "/orders", o, signature=None)
        self.assertEqual((st, js["code"]), (401, "SIGN_ERROR"))
        st, js, h, raw = self.call("GET", "/orders/x", signature=sign(b"/orders/y"))
        self.assertEqual((st, js["code"]), (401, "SIGN_ERROR"))
        self.assertEqual(self.sim.orders(), [])
        # the query string is part of what a GET signs
        st, js, h, raw = self.call("GET", "/orders/x?a=1")
        self.assertEqual(st, 404)
        calls = self.sim.calls()
        self.assertEqual([c["sig_ok"] for c in calls], [False, False, False, True])
        self.assertEqual(calls[-1]["request_id"], "rq-1")

    def test_bad_body(self):
        for bad in ({"amount": 1}, dict(self.order(), amount=0), dict(self.order(), amount="1"),
                    dict(self.order(), amount=True), dict(self.order(), currency="cny"),
                    dict(self.order(), notify_url=5), dict(self.order(), out_trade_no="a b"),
                    dict(self.order(), out_trade_no="x" * 65), [1, 2]):
            st, js, h, raw = self.call("POST", "/orders", bad)
            self.assertEqual((st, js["code"]), (400, "INVALID_FIELD"), bad)
        st, js, h, raw = self.call("POST", "/refunds", {"out_refund_no": "r1"})
        self.assertEqual((st, js["code"]), (400, "INVALID_FIELD"))
        self.assertEqual(self.sim.orders(), [])

    def test_close(self):
        o = self.order()
        self.call("POST", "/orders", o)
        no = o["out_trade_no"]
        st, js, h, raw = self.call("POST", "/orders/%s/close" % no, {})
        self.assertEqual((st, js), (200, {"code": "OK", "status": "CLOSED"}))
        self.assertSigned(h, raw)
        st, js, h, raw = self.call("POST", "/orders/%s/close" % no, {})
        self.assertEqual((st, js["status"]), (200, "CLOSED"))
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual((st, js["code"]), (409, "ORDER_CLOSED"))
        self.assertEqual(self.sim.pay(no, "SUCCESS")[0], 409)
        got = self.rx.wait(1)
        self.assertEqual([json.loads(g["raw"])["status"] for g in got], ["CLOSED"])
        # a number never created: closed for good, so a late create is refused
        st, js, h, raw = self.call("POST", "/orders/pay_never/close", {})
        self.assertEqual((st, js["status"]), (200, "CLOSED"))
        st, js, h, raw = self.call("POST", "/orders", self.order("pay_never"))
        self.assertEqual((st, js["code"]), (409, "ORDER_CLOSED"))
        # a paid order cannot be closed
        o2 = self.order()
        self.call("POST", "/orders", o2)
        self.sim.pay(o2["out_trade_no"], "SUCCESS")
        st, js, h, raw = self.call("POST", "/orders/%s/close" % o2["out_trade_no"], {})
        self.assertEqual((st, js["code"]), (409, "ORDER_PAID"))

    def test_refunds(self):
        o = self.order(amount=1000)
        self.call("POST", "/orders", o)
        no = o["out_trade_no"]
        st, js, h, raw = self.call("POST", "/refunds",
                                   {"out_refund_no": "re_1", "out_trade_no": no, "amount": 100})
        self.assertEqual((st, js["code"]), (409, "ORDER_NOT_PAID"))
        self.sim.pay(no, "SUCCESS")
        r = {"out_refund_no": "re_1", "out_trade_no": no, "amount": 600}
        st, js, h, raw = self.call("POST", "/refunds", r)
        self.assertEqual((st, js["status"], js["out_refund_no"]), (200, "SUCCESS", "re_1"))
        self.assertSigned(h, raw)
        rid = js["channel_refund_id"]
        st, js, h, raw = self.call("POST", "/refunds", r)
        self.assertEqual((st, js["channel_refund_id"]), (200, rid))
        st, js, h, raw = self.call("POST", "/refunds", dict(r, amount=5))
        self.assertEqual((st, js["code"]), (409, "OUT_REFUND_NO_USED"))
        st, js, h, raw = self.call("POST", "/refunds", dict(r, out_refund_no="re_2", amount=401))
        self.assertEqual((st, js["code"]), (409, "REFUND_EXCEEDS"))
        st, js, h, raw = self.call("GET", "/refunds/re_1")
        self.assertEqual((st, js["status"], js["amount"]), (200, "SUCCESS", 600))
        st, js, h, raw = self.call("GET", "/refunds/re_x")
        self.assertEqual((st, js["code"]), (404, "REFUND_NOT_EXIST"))
        st, js, h, raw = self.call("POST", "/refunds", dict(r, out_refund_no="re_3",
                                                           out_trade_no="pay_none"))
        self.assertEqual((st, js["code"]), (404, "ORDER_NOT_EXIST"))
        self.sim.config(refund_mode="processing")
        st, js, h, raw = self.call("POST", "/refunds", dict(r, out_refund_no="re_4", amount=100))
        self.assertEqual((st, js["status"]), (200, "PROCESSING"))
        self.sim.refund_set("re_4", "SUCCESS")
        st, js, h, raw = self.call("GET", "/refunds/re_4")
        self.assertEqual(js["status"], "SUCCESS")
        self.sim.config(refund_mode="decline")
        st, js, h, raw = self.call("POST", "/refunds", dict(r, out_refund_no="re_5", amount=100))
        self.assertEqual((st, js["code"]), (400, "REFUND_DECLINED"))
        st, js, h, raw = self.call("POST", "/refunds", dict(r, out_refund_no="re_5", amount=100))
        self.assertEqual((st, js["code"]), (400, "REFUND_DECLINED"))
        # the declined one does not count against the cap: 1000 - 600 - 100 = 300 left
        self.sim.config(refund_mode="success")
        st, js, h, raw = self.call("POST", "/refunds", dict(r, out_refund_no="re_6", amount=300))
        self.assertEqual((st, js["status"]), (200, "SUCCESS"))

    # ---- payment modes and notifications -------------------------------
    def test_pay_and_notify_retries(self):
        self.rx.answers = [500, 503]
        o = self.order()
        self.call("POST", "/orders", o)
        st, js = self.sim.pay(o["out_trade_no"], "SUCCESS")
        self.assertEqual((st, js["status"]), (200, "SUCCESS"))
        got = self.rx.wait(3)
        self.assertEqual(len(got), 3)
        bodies = [json.loads(g["raw"]) for g in got]
        self.assertEqual(len({b["notify_id"] for b in bodies}), 1)
        b = bodies[0]
        self.assertEqual((b["payment_id"], b["status"], b["amount"]),
                         (o["out_trade_no"], "SUCCESS", 1000))
        self.assertEqual(set(b), {"notify_id", "payment_id", "channel_txn_id", "status", "amount"})
        for g in got:
            self.assertEqual(g["sig"], sign(g["raw"]))
            self.assertEqual(g["path"], "/v1/notifications/sim")
        # the schedule: ~50 ms, then ~50 ms between attempts
        self.assertGreaterEqual(got[1]["t"] - got[0]["t"], 0.04)
        time.sleep(0.3)
        self.assertEqual(len(self.rx.got), 3)  # delivered: no more
        self.assertEqual([d["http_status"] for d in self.sim.notifications()], [500, 503, 200])
        # FAILED: a fresh notify_id
        o2 = self.order()
        self.call("POST", "/orders", o2)
        self.sim.pay(o2["out_trade_no"], "FAILED")
        got = self.rx.wait(4)
        b2 = json.loads(got[3]["raw"])
        self.assertEqual(b2["status"], "FAILED")
        self.assertNotEqual(b2["notify_id"], b["notify_id"])

    def test_gives_up_after_schedule(self):
        self.rx.answers = [500] * 10
        o = self.order()
        self.call("POST", "/orders", o)
        self.sim.pay(o["out_trade_no"], "SUCCESS")
        time.sleep(0.6)
        self.assertEqual(len(self.rx.got), 4)  # first try + 3 in the schedule

    def test_immediate_and_after_ms(self):
        self.sim.config(pay_mode="immediate")
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(js["status"], "SUCCESS")
        self.assertEqual(self.rx.bodies() if self.rx.wait(1) else [], self.rx.bodies())
        self.assertEqual(self.rx.bodies()[0]["status"], "SUCCESS")
        self.sim.config(pay_mode="success_after_ms", pay_delay_ms=100)
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(js["status"], "PENDING")
        self.rx.wait(2)
        self.assertEqual(self.sim_order(o["out_trade_no"])["status"], "SUCCESS")
        self.assertEqual(self.rx.bodies()[1]["payment_id"], o["out_trade_no"])
        self.assertIsNotNone(self.sim_order(o["out_trade_no"])["paid_at"])

    def test_notify_twice(self):
        self.sim.config(notify_mode="twice")
        o = self.order()
        self.call("POST", "/orders", o)
        self.sim.pay(o["out_trade_no"], "SUCCESS")
        got = self.rx.wait(2)
        self.assertEqual(len(got), 2)
        self.assertEqual(got[0]["raw"], got[1]["raw"])
        time.sleep(0.2)
        self.assertEqual(len(self.rx.got), 2)

    def test_notify_out_of_order(self):
        self.sim.config(notify_mode="out_of_order")
        o = self.order()
        self.call("POST", "/orders", o)
        self.sim.pay(o["out_trade_no"], "SUCCESS")
        got = self.rx.wait(2)
        sts = [json.loads(g["raw"])["status"] for g in got]
        self.assertEqual(sts, ["SUCCESS", "FAILED"])
        ids = [json.loads(g["raw"])["notify_id"] for g in got]
        self.assertNotEqual(ids[0], ids[1])
        self.assertEqual([d["stale"] for d in self.sim.notifications()], [False, True])

    def test_notify_before_return(self):
        self.sim.config(notify_mode="before_return")
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        t_answer = time.monotonic()
        self.assertEqual(js["status"], "SUCCESS")
        self.assertEqual(len(self.rx.got), 1)
        self.assertLess(self.rx.got[0]["t"], t_answer)

    def test_notify_none(self):
        self.sim.config(notify_mode="none", pay_mode="immediate")
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(js["status"], "SUCCESS")
        time.sleep(0.2)
        self.assertEqual(self.rx.got, [])

    # ---- faults --------------------------------------------------------
    def dropped(self, o, timeout=5.0):
        with self.assertRaises((ConnectionError, http.client.HTTPException, socket.timeout, OSError)):
            self.call("POST", "/orders", o, timeout=timeout)

    def test_fault_5xx(self):
        self.sim.config(faults=[{"call": "create", "mode": "5xx_before"}])
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(st, 500)
        self.assertSigned(h, raw)
        self.assertIsNone(self.sim_order(o["out_trade_no"]))
        st, js, h, raw = self.call("POST", "/orders", o)  # count 1: the next is normal
        self.assertEqual(st, 200)
        self.sim.config(faults=[{"call": "create", "mode": "5xx_after"}])
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(st, 500)
        self.assertIsNotNone(self.sim_order(o["out_trade_no"]))
        self.assertEqual([c["fault"] for c in self.sim.calls()], ["5xx_before", None, "5xx_after"])

    def test_fault_reset(self):
        self.sim.config(faults=[{"call": "create", "mode": "reset"}])
        o = self.order()
        self.dropped(o)
        self.assertIsNone(self.sim_order(o["out_trade_no"]))
        self.sim.config(faults=[{"call": "create", "mode": "reset", "after": True}])
        self.dropped(o)
        self.assertIsNotNone(self.sim_order(o["out_trade_no"]))
        self.assertEqual([c["status"] for c in self.sim.calls()], ["reset", "reset"])

    def test_fault_timeout_after_create(self):
        self.sim.config(faults=[{"call": "create", "mode": "timeout_after_create", "hold_ms": 300}])
        o = self.order()
        t0 = time.monotonic()
        self.dropped(o, timeout=0.2)  # the client gives up first
        self.assertIsNotNone(self.sim_order(o["out_trade_no"]))
        self.sim.config(faults=[{"call": "create", "mode": "timeout_after_create", "hold_ms": 200}])
        o = self.order()
        t0 = time.monotonic()
        self.dropped(o)  # the channel drops after holding
        self.assertGreaterEqual(time.monotonic() - t0, 0.19)
        self.sim.config(faults=[{"call": "create", "mode": "timeout_after_create", "hold_ms": 100,
                                 "then": "answer"}])
        st, js, h, raw = self.call("POST", "/orders", self.order())
        self.assertEqual(st, 200)

    def test_fault_slow(self):
        self.sim.config(faults=[{"call": "query", "mode": "slow", "delay_ms": 200}])
        t0 = time.monotonic()
        st, js, h, raw = self.call("GET", "/orders/nope")
        self.assertEqual(st, 404)
        self.assertGreaterEqual(time.monotonic() - t0, 0.19)

    def test_fault_bad_signature_garbage_decline(self):
        self.sim.config(faults=[{"call": "create", "mode": "bad_signature"},
                                {"call": "create", "mode": "garbage"},
                                {"call": "create", "mode": "decline", "status": 403,
                                 "code": "ACCOUNT_BLOCKED"}])
        o = self.order()
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(st, 200)
        self.assertNotEqual(h.get("X-Signature"), sign(raw))
        st, js, h, raw = self.call("POST", "/orders", o)
        self.assertEqual(st, 200)
        self.assertIsNone(js)
        o2 = self.order()
        st, js, h, raw = self.call("POST", "/orders", o2)
        self.assertEqual((st, js["code"]), (403, "ACCOUNT_BLOCKED"))
        self.assertIsNone(self.sim_order(o2["out_trade_no"]))
        self.assertIsNotNone(self.sim_order(o["out_trade_no"]))

    def test_fault_variants(self):
        self.sim.config(faults=[{"call": "create", "mode": "garbage", "status": 404},
                                {"call": "create", "mode": "decline", "status": 400, "code": None}])
        st, js, h, raw = self.call("POST", "/orders", self.order())
        self.assertEqual((st, js), (404, None))
        st, js, h, raw = self.call("POST", "/orders", self.order())
        self.assertEqual(st, 400)
        self.assertNotIn("code", js)
        self.sim.config(pay_mode="immediate_fail")
        st, js, h, raw = self.call("POST", "/orders", self.order())
        self.assertEqual((st, js["status"]), (200, "FAILED"))
        self.assertEqual(self.rx.wait(1) and self.rx.bodies()[0]["status"], "FAILED")

    def test_fault_count_match_all(self):
        self.sim.config(faults=[{"call": "query", "mode": "5xx_before", "count": -1,
                                 "out_trade_no": "pay_a"}])
        for _ in range(3):
            self.assertEqual(self.call("GET", "/orders/pay_a")[0], 500)
        self.assertEqual(self.call("GET", "/orders/pay_b")[0], 404)
        self.sim.config(faults=[{"call": "close", "mode": "decline", "code": "X", "count": 2}])
        self.assertEqual(self.call("POST", "/orders/pay_c/close", {})[0], 400)
        self.assertEqual(self.call("POST", "/orders/pay_c/close", {})[0], 400)
        self.assertEqual(self.call("POST", "/orders/pay_c/close", {})[0], 200)
        self.sim.config(faults=[{"call": "refund", "mode": "5xx_before"},
                                {"call": "refund_query", "mode": "5xx_before"}])
        self.assertEqual(self.call("POST", "/refunds", {"out_refund_no": "a", "out_trade_no": "b",
                                                        "amount": 1})[0], 500)
        self.assertEqual(self.call("GET", "/refunds/a")[0], 500)

    def test_control_errors(self):
        with self.assertRaises(urllib.error.HTTPError) as cm:
            self.sim.config(pay_mode="sometimes")
        self.assertEqual(cm.exception.code, 400)
        with self.assertRaises(urllib.error.HTTPError):
            self.sim.config(faults=[{"call": "create", "mode": "explode"}])

    def test_keepalive(self):
        c = http.client.HTTPConnection("127.0.0.1", self.sim.port, timeout=5)
        for i in range(3):
            data = json.dumps(self.order()).encode()
            c.request("POST", "/orders", body=data, headers={"X-Signature": sign(data)})
            r = c.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
        c.close()

    def test_concurrent_creates_one_order(self):
        o = self.order()
        res = []

        def go():
            res.append(self.call("POST", "/orders", o)[1]["channel_txn_id"])

        ts = [threading.Thread(target=go) for _ in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(len(set(res)), 1)
        self.assertEqual(self.sim_order(o["out_trade_no"])["creates"], 16)


if __name__ == "__main__":
    unittest.main(verbosity=2)
