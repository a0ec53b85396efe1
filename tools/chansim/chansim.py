#!/usr/bin/env python3
"""chansim: a payment channel simulator, the server side of CHANNEL.md.

Python 3 standard library only. It answers idemd's channel calls

    POST /orders                      create (idempotent on out_trade_no)
    GET  /orders/{out_trade_no}       query
    POST /orders/{out_trade_no}/close close (a never-created number is closed
                                      too: a later create answers ORDER_CLOSED)
    POST /refunds                     refund (idempotent on out_refund_no)
    GET  /refunds/{out_refund_no}     refund query

checks X-Signature (hex HMAC-SHA256 with the channel secret over the raw body
of a POST, over the path and query string of a GET; 401 SIGN_ERROR when
wrong), signs every answer the same way, and sends signed notifications
(API.md's body) to the order's notify_url when an order reaches SUCCESS,
FAILED or CLOSED, repeated on a schedule until a 2xx.

A control API under /_sim/ (unsigned JSON) drives it from tests:

    POST /_sim/config         {"secret", "pay_mode", "pay_delay_ms", "faults",
                               "notify_mode", "refund_mode", "notify_schedule_ms",
                               "notify_timeout_ms", "seed"} (any subset)
    GET  /_sim/config
    POST /_sim/pay/{no}       {"status": "SUCCESS"|"FAILED", "amount": N (optional: the
                               channel reports another amount, a misbehaving channel)}
    POST /_sim/refund/{no}    {"status": "SUCCESS"|"FAILED"}  (a PROCESSING refund)
    GET  /_sim/calls | /_sim/orders | /_sim/refunds | /_sim/notifications
    POST /_sim/reset          forget orders, refunds, calls, faults; modes to defaults
    GET  /_sim/health

pay_mode: "pending" (default; an order waits for /_sim/pay),
"success_after_ms" (SUCCESS after pay_delay_ms), "immediate" (the create
answers SUCCESS), "immediate_fail" (the create answers FAILED: the payer's
attempt failed at once). notify_mode: "once" (default), "twice" (every delivery is
sent twice, concurrently), "out_of_order" (after a SUCCESS notification, a
stale FAILED one with an older notify_id), "before_return" (immediate payment;
the SUCCESS notification is delivered before the create answer is sent),
"none" (no notification is sent: the sweeper's query is the only way to learn).
refund_mode: "success" (default), "processing", "decline".

A fault is {"call": "create|query|close|refund|refund_query", "mode": M,
"count": N (default 1, -1 = every such call), "out_trade_no"/"out_refund_no"
(only that number), "p" (probability, default 1)} with M one of:
  timeout_after_create  do the call, hold the answer hold_ms (30000), then drop
                        the connection ("then": "answer" answers instead)
  5xx_before            500 without doing the call
  5xx_after             do the call, then 500
  reset                 RST the connection without an answer; "after": true
                        does the call first
  slow                  wait delay_ms (1000), then do the call and answer
  bad_signature         do the call, answer with a wrong X-Signature
  garbage               do the call, answer "status" (200) with an unparsable body
  decline               answer "status" (400) with {"code": code} (INVALID_FIELD;
                        "code": null leaves the member out) without doing the call

Usage: chansim.py --port P [--host 127.0.0.1] [--secret S]
                  [--notify-schedule-ms 15000,15000,...] [--log FILE]
With --port 0 a free port is picked; the first stdout line is "listening on PORT".
The secret is never written to the log.
"""

import argparse
import hashlib
import heapq
import hmac
import http.client
import json
import random
import re
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_SCHEDULE_MS = [15000, 15000, 30000, 180000, 600000, 1200000, 1800000, 1800000,
                       1800000, 3600000, 10800000, 10800000, 10800000, 21600000, 21600000]
CALLS = ("create", "query", "close", "refund", "refund_query")
FAULT_MODES = ("timeout_after_create", "5xx_before", "5xx_after", "reset", "slow",
               "bad_signature", "garbage", "decline")
PAY_MODES = ("pending", "success_after_ms", "immediate", "immediate_fail")
NOTIFY_MODES = ("once", "twice", "out_of_order", "before_return", "none")
REFUND_MODES = ("success", "processing", "decline")
NO_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
CURRENCY_RE = re.compile(r"^[A-Z]{3}$")
MAX_BODY = 1 << 20


def now_iso(t=None):
    t = time.time() if t is None else t
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


def sign(secret, data):
    return hmac.new((secret or "").encode(), data, hashlib.sha256).hexdigest()


def dumps(obj):
    return json.dumps(obj, separators=(",", ":")).encode()


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


class BadField(Exception):
    def __init__(self, field, why):
        super().__init__("%s: %s" % (field, why))
        self.field = field


class Answer:
    """What a channel call answers: HTTP status and a JSON body."""

    def __init__(self, status, body):
        self.status = status
        self.body = body


def err(status, code, message=None):
    b = {"code": code}
    if message:
        b["message"] = message
    return Answer(status, b)


class Sim:
    """All the channel's state, behind one lock."""

    def __init__(self, secret, schedule_ms, log=None):
        self.lock = threading.Lock()
        self.secret = secret
        self.default_schedule = list(schedule_ms)
        self.log_file = log
        self.stop_event = threading.Event()
        self.prefix = uuid.uuid4().hex[:6].upper()
        self.counter = 0
        # the notification queue: heap of (due, seq, notification)
        self.heap = []
        self.heap_cv = threading.Condition(self.lock)
        self.reset_locked()

    # ---- state ---------------------------------------------------------
    def reset_locked(self):
        self.orders = {}
        self.refunds = {}
        self.calls = []
        self.deliveries = []
        self.notifications = {}
        self.faults = []
        self.timers = []
        self.pay_mode = "pending"
        self.pay_delay_ms = 100
        self.notify_mode = "once"
        self.refund_mode = "success"
        self.refund_decline_code = "REFUND_DECLINED"
        self.schedule = list(self.default_schedule)
        self.notify_timeout_ms = 5000
        self.rng = random.Random(0)
        self.heap = []
        self.generation = getattr(self, "generation", 0) + 1

    def next_id(self, kind):
        self.counter += 1
        return "%s%s%07d" % (kind, self.prefix, self.counter)

    def log(self, line):
        if self.log_file is None:
            return
        try:
            with open(self.log_file, "a") as f:
                f.write("%s %s\n" % (now_iso(), line))
        except OSError:
            pass

    def config(self, body):
        """Apply a /_sim/config body; raises BadField on a bad member."""
        with self.lock:
            if "secret" in body:
                if not isinstance(body["secret"], str):
                    raise BadField("secret", "must be a string")
                self.secret = body["secret"]
            if "pay_mode" in body:
                if body["pay_mode"] not in PAY_MODES:
                    raise BadField("pay_mode", "one of %s" % ",".join(PAY_MODES))
                self.pay_mode = body["pay_mode"]
            if "pay_delay_ms" in body:
                if not is_int(body["pay_delay_ms"]) or body["pay_delay_ms"] < 0:
                    raise BadField("pay_delay_ms", "a non-negative integer")
                self.pay_delay_ms = body["pay_delay_ms"]
            if "notify_mode" in body:
                if body["notify_mode"] not in NOTIFY_MODES:
                    raise BadField("notify_mode", "one of %s" % ",".join(NOTIFY_MODES))
                self.notify_mode = body["notify_mode"]
            if "refund_mode" in body:
                if body["refund_mode"] not in REFUND_MODES:
                    raise BadField("refund_mode", "one of %s" % ",".join(REFUND_MODES))
                self.refund_mode = body["refund_mode"]
            if "refund_decline_code" in body:
                self.refund_decline_code = str(body["refund_decline_code"])
            if "notify_schedule_ms" in body:
                s = body["notify_schedule_ms"]
                if not isinstance(s, list) or not all(is_int(x) and x >= 0 for x in s):
                    raise BadField("notify_schedule_ms", "a list of non-negative integers")
                self.schedule = list(s)
            if "notify_timeout_ms" in body:
                if not is_int(body["notify_timeout_ms"]) or body["notify_timeout_ms"] <= 0:
                    raise BadField("notify_timeout_ms", "a positive integer")
                self.notify_timeout_ms = body["notify_timeout_ms"]
            if "seed" in body:
                self.rng = random.Random(body["seed"])
            if "faults" in body:
                fl = body["faults"]
                if not isinstance(fl, list):
                    raise BadField("faults", "a list")
                faults = []
                for f in fl:
                    if not isinstance(f, dict) or f.get("call") not in CALLS:
                        raise BadField("faults", "each needs call in %s" % ",".join(CALLS))
                    if f.get("mode") not in FAULT_MODES:
                        raise BadField("faults", "mode one of %s" % ",".join(FAULT_MODES))
                    f = dict(f)
                    f.setdefault("count", 1)
                    if not is_int(f["count"]):
                        raise BadField("faults", "count must be an integer")
                    f["applied"] = 0
                    faults.append(f)
                self.faults = faults
            return self.config_view_locked()

    def config_view_locked(self):
        return {"pay_mode": self.pay_mode, "pay_delay_ms": self.pay_delay_ms,
                "notify_mode": self.notify_mode, "refund_mode": self.refund_mode,
                "notify_schedule_ms": self.schedule, "notify_timeout_ms": self.notify_timeout_ms,
                "faults": self.faults, "secret_set": bool(self.secret)}

    def take_fault_locked(self, call, number):
        for f in self.faults:
            if f["call"] != call or f["count"] == 0:
                continue
            want = f.get("out_trade_no") or f.get("out_refund_no")
            if want is not None and want != number:
                continue
            if "p" in f and self.rng.random() >= float(f["p"]):
                continue
            if f["count"] > 0:
                f["count"] -= 1
            f["applied"] += 1
            return dict(f)
        return None

    # ---- orders --------------------------------------------------------
    def order_view(self, o):
        return {"code": "OK", "out_trade_no": o["out_trade_no"],
                "channel_txn_id": o["channel_txn_id"], "status": o["status"],
                "amount": o["amount"], "currency": o["currency"], "paid_at": o["paid_at"]}

    def create(self, body):
        """POST /orders. Returns (Answer, notification-to-deliver-now-or-None)."""
        no = body.get("out_trade_no")
        if not isinstance(no, str) or not NO_RE.match(no):
            raise BadField("out_trade_no", "1-64 characters of A-Z a-z 0-9 _ - .")
        amount = body.get("amount")
        if not is_int(amount) or amount <= 0:
            raise BadField("amount", "a positive integer")
        cur = body.get("currency")
        if not isinstance(cur, str) or not CURRENCY_RE.match(cur):
            raise BadField("currency", "three upper-case letters")
        url = body.get("notify_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise BadField("notify_url", "an http(s) URL")
        exp = body.get("expire_at")
        if exp is not None and not isinstance(exp, (str, int)):
            raise BadField("expire_at", "a timestamp")
        with self.lock:
            o = self.orders.get(no)
            if o is not None:
                if o["status"] == "CLOSED":
                    return err(409, "ORDER_CLOSED", "order closed"), None
                if o["amount"] != amount or o["currency"] != cur:
                    return err(409, "OUT_TRADE_NO_USED", "another amount or currency"), None
                o["creates"] += 1
                return Answer(200, self.create_view(o)), None
            o = {"out_trade_no": no, "amount": amount, "currency": cur, "notify_url": url,
                 "expire_at": exp, "channel_txn_id": self.next_id("T"), "status": "PENDING",
                 "created_at": now_iso(), "paid_at": None, "creates": 1, "tombstone": False,
                 "history": ["PENDING"]}
            self.orders[no] = o
            deliver_now = None
            mode = self.pay_mode
            if self.notify_mode == "before_return":
                mode = "immediate"
            if mode in ("immediate", "immediate_fail"):
                n = self.set_status_locked(o, "SUCCESS" if mode == "immediate" else "FAILED",
                                           schedule=self.notify_mode != "before_return")
                if self.notify_mode == "before_return":
                    deliver_now = n
            elif mode == "success_after_ms":
                gen = self.generation
                t = threading.Timer(self.pay_delay_ms / 1000.0, self.pay_later, (no, gen))
                t.daemon = True
                t.start()
            return Answer(200, self.create_view(o)), deliver_now

    def create_view(self, o):
        return {"code": "OK", "out_trade_no": o["out_trade_no"],
                "channel_txn_id": o["channel_txn_id"], "status": o["status"]}

    def pay_later(self, no, gen):
        with self.lock:
            o = self.orders.get(no)
            if gen != self.generation or o is None or o["status"] != "PENDING":
                return
            self.set_status_locked(o, "SUCCESS")

    def query(self, no):
        with self.lock:
            o = self.orders.get(no)
            if o is None:
                return err(404, "ORDER_NOT_EXIST", "no such order")
            return Answer(200, self.order_view(o))

    def close(self, no):
        if not NO_RE.match(no):
            raise BadField("out_trade_no", "1-64 characters of A-Z a-z 0-9 _ - .")
        with self.lock:
            o = self.orders.get(no)
            if o is None:
                # never created: remember the number as closed, so a create still
                # in flight can never make it payable
                self.orders[no] = {"out_trade_no": no, "amount": 0, "currency": None,
                                   "notify_url": None, "expire_at": None, "channel_txn_id": "",
                                   "status": "CLOSED", "created_at": now_iso(), "paid_at": None,
                                   "creates": 0, "tombstone": True, "history": ["CLOSED"]}
                return Answer(200, {"code": "OK", "status": "CLOSED"})
            if o["status"] == "SUCCESS":
                return err(409, "ORDER_PAID", "order already paid")
            if o["status"] != "CLOSED":
                self.set_status_locked(o, "CLOSED")
            return Answer(200, {"code": "OK", "status": "CLOSED"})

    def set_status_locked(self, o, status, schedule=True):
        """Move an order and make its notification (scheduled now unless told not)."""
        o["status"] = status
        o["history"].append(status)
        if status == "SUCCESS":
            o["paid_at"] = now_iso()
        if status not in ("SUCCESS", "FAILED", "CLOSED") or not o["notify_url"]:
            return None
        if self.notify_mode == "none":
            return None
        n = self.new_notification_locked(o, status)
        if schedule:
            self.schedule_locked(n, 0)
        if status == "SUCCESS" and self.notify_mode == "out_of_order":
            stale = self.new_notification_locked(o, "FAILED", stale=True)
            n["then"] = stale
        return n

    def new_notification_locked(self, o, status, stale=False):
        nid = self.next_id("N")
        if stale:
            nid = "N" + self.prefix + "0" + nid[1 + len(self.prefix):]
        body = {"notify_id": nid, "payment_id": o["out_trade_no"],
                "channel_txn_id": o["channel_txn_id"], "status": status, "amount": o["amount"]}
        n = {"notify_id": nid, "out_trade_no": o["out_trade_no"], "status": status,
             "url": o["notify_url"], "body": dumps(body), "attempt": 0, "delivered": False,
             "stale": stale, "then": None, "gen": self.generation, "gave_up": False}
        self.notifications[nid] = n
        return n

    def schedule_locked(self, n, delay_ms):
        self.counter += 1
        heapq.heappush(self.heap, (time.monotonic() + delay_ms / 1000.0, self.counter, n))
        self.heap_cv.notify()

    def pay(self, no, status, amount=None):
        if status not in ("SUCCESS", "FAILED"):
            raise BadField("status", "SUCCESS or FAILED")
        if amount is not None and (not is_int(amount) or amount <= 0):
            raise BadField("amount", "a positive integer")
        with self.lock:
            o = self.orders.get(no)
            if o is None:
                return err(404, "ORDER_NOT_EXIST")
            if o["status"] != "PENDING":
                return err(409, "ORDER_NOT_PENDING", "order is " + o["status"])
            if amount is not None:  # a misbehaving channel: paid another amount
                o["amount"] = amount
            self.set_status_locked(o, status)
            return Answer(200, self.order_view(o))

    # ---- refunds -------------------------------------------------------
    def refund_view(self, r):
        return {"code": "OK", "out_refund_no": r["out_refund_no"],
                "channel_refund_id": r["channel_refund_id"], "status": r["status"],
                "out_trade_no": r["out_trade_no"], "amount": r["amount"]}

    def refund(self, body):
        rno = body.get("out_refund_no")
        if not isinstance(rno, str) or not NO_RE.match(rno):
            raise BadField("out_refund_no", "1-64 characters of A-Z a-z 0-9 _ - .")
        no = body.get("out_trade_no")
        if not isinstance(no, str) or not NO_RE.match(no):
            raise BadField("out_trade_no", "1-64 characters of A-Z a-z 0-9 _ - .")
        amount = body.get("amount")
        if not is_int(amount) or amount <= 0:
            raise BadField("amount", "a positive integer")
        with self.lock:
            r = self.refunds.get(rno)
            if r is not None:
                if r["out_trade_no"] != no or r["amount"] != amount:
                    return err(409, "OUT_REFUND_NO_USED", "another order or amount")
                if r.get("declined"):
                    return err(400, r["declined"], "refund declined")
                return Answer(200, self.refund_view(r))
            o = self.orders.get(no)
            if o is None or o["tombstone"]:
                return err(404, "ORDER_NOT_EXIST", "no such order")
            if o["status"] != "SUCCESS":
                return err(409, "ORDER_NOT_PAID", "order is " + o["status"])
            taken = sum(x["amount"] for x in self.refunds.values()
                        if x["out_trade_no"] == no and x["status"] != "FAILED")
            if taken + amount > o["amount"]:
                return err(409, "REFUND_EXCEEDS", "refunds would pass the order amount")
            r = {"out_refund_no": rno, "out_trade_no": no, "amount": amount,
                 "channel_refund_id": self.next_id("R"), "created_at": now_iso(),
                 "status": "SUCCESS", "declined": None}
            if self.refund_mode == "processing":
                r["status"] = "PROCESSING"
            elif self.refund_mode == "decline":
                r["status"] = "FAILED"
                r["declined"] = self.refund_decline_code
            self.refunds[rno] = r
            if r["declined"]:
                return err(400, r["declined"], "refund declined")
            return Answer(200, self.refund_view(r))

    def refund_query(self, rno):
        with self.lock:
            r = self.refunds.get(rno)
            if r is None:
                return err(404, "REFUND_NOT_EXIST", "no such refund")
            return Answer(200, self.refund_view(r))

    def refund_set(self, rno, status):
        if status not in ("SUCCESS", "FAILED"):
            raise BadField("status", "SUCCESS or FAILED")
        with self.lock:
            r = self.refunds.get(rno)
            if r is None:
                return err(404, "REFUND_NOT_EXIST")
            if r["status"] != "PROCESSING":
                return err(409, "REFUND_NOT_PROCESSING", "refund is " + r["status"])
            r["status"] = status
            return Answer(200, self.refund_view(r))

    # ---- notifications -------------------------------------------------
    def notifier(self):
        """One thread: pops due notifications, sends each on a thread of its own."""
        with self.lock:
            while not self.stop_event.is_set():
                if not self.heap:
                    self.heap_cv.wait(0.5)
                    continue
                due, _, n = self.heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self.heap_cv.wait(min(wait, 0.5))
                    continue
                heapq.heappop(self.heap)
                if n["gen"] != self.generation or n["delivered"]:
                    continue
                threading.Thread(target=self.deliver_and_reschedule, args=(n,), daemon=True).start()

    def deliver_and_reschedule(self, n):
        ok = self.deliver(n)
        with self.lock:
            if n["gen"] != self.generation:
                return
            if ok:
                if n["then"] is not None:
                    self.schedule_locked(n["then"], 0)
                    n["then"] = None
                return
            i = n["attempt"] - 1
            if i < len(self.schedule):
                self.schedule_locked(n, self.schedule[i])
            else:
                n["gave_up"] = True

    def deliver(self, n):
        """One delivery (two concurrent sends in "twice" mode); True on a 2xx."""
        with self.lock:
            n["attempt"] += 1
            attempt = n["attempt"]
            twice = self.notify_mode == "twice"
            secret = self.secret
            timeout = self.notify_timeout_ms / 1000.0
        results = []

        def send(dup):
            status, error = None, None
            try:
                u = urllib.parse.urlsplit(n["url"])
                cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
                c = cls(u.hostname, u.port, timeout=timeout)
                path = u.path or "/"
                if u.query:
                    path += "?" + u.query
                c.request("POST", path, body=n["body"],
                          headers={"Content-Type": "application/json",
                                   "X-Signature": sign(secret, n["body"])})
                resp = c.getresponse()
                resp.read()
                status = resp.status
                c.close()
            except (OSError, http.client.HTTPException) as e:
                error = "%s: %s" % (type(e).__name__, e)
            rec = {"time": now_iso(), "notify_id": n["notify_id"], "out_trade_no": n["out_trade_no"],
                   "status": n["status"], "attempt": attempt, "dup": dup, "stale": n["stale"],
                   "http_status": status, "error": error, "body": json.loads(n["body"])}
            with self.lock:
                if n["gen"] == self.generation:
                    self.deliveries.append(rec)
                    if status is not None and 200 <= status < 300:
                        n["delivered"] = True
            self.log("notify %s %s %s attempt=%d -> %s" % (n["notify_id"], n["out_trade_no"],
                                                         n["status"], attempt, status or error))
            results.append(status is not None and 200 <= status < 300)

        if twice:
            ts = [threading.Thread(target=send, args=(d,), daemon=True) for d in (False, True)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        else:
            send(False)
        return any(results)

    def deliver_now(self, n):
        """before_return: deliver synchronously, then keep the schedule if it failed."""
        self.deliver_and_reschedule(n)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "chansim/1"
    sim = None  # set by main

    def log_message(self, fmt, *args):  # no stderr noise; --log has the calls
        pass

    def finish(self):
        try:
            super().finish()
        except (OSError, ValueError):
            pass

    # ---- plumbing ------------------------------------------------------
    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            out = b""
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline(8)
                if len(out) > MAX_BODY:
                    raise ValueError("body too large")
        n = int(self.headers.get("Content-Length") or 0)
        if n < 0 or n > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(n) if n else b""

    def rec_end(self):
        rec = getattr(self, "current", None)
        if rec is not None and "t_end" not in rec:
            rec["t_end"] = time.time()

    def send_raw(self, status, data, signature=None, ctype="application/json"):
        self.rec_end()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        if signature is not None:
            self.send_header("X-Signature", signature)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def send_json(self, status, obj, signed=False):
        data = dumps(obj)
        self.send_raw(status, data, sign(self.sim.secret, data) if signed else None)

    def drop(self, rst):
        """Close the connection without an answer (RST when rst)."""
        self.close_connection = True
        self.rec_end()
        try:
            if rst:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
            self.connection.close()
        except OSError:
            pass

    # ---- dispatch ------------------------------------------------------
    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def dispatch(self, method):
        self.current = None
        try:
            raw = self.read_body()
        except (ValueError, OSError):
            self.close_connection = True
            self.send_json(400, {"code": "INVALID_FIELD", "message": "unreadable body"})
            return
        path = urllib.parse.urlsplit(self.path).path
        if path.startswith("/_sim/"):
            self.control(method, path, raw)
            return
        self.channel_call(method, path, raw)

    def route(self, method, path):
        """(call, number) for a channel route, or (None, None)."""
        parts = path.strip("/").split("/")
        if method == "POST" and parts == ["orders"]:
            return "create", None
        if method == "GET" and len(parts) == 2 and parts[0] == "orders":
            return "query", urllib.parse.unquote(parts[1])
        if method == "POST" and len(parts) == 3 and parts[0] == "orders" and parts[2] == "close":
            return "close", urllib.parse.unquote(parts[1])
        if method == "POST" and parts == ["refunds"]:
            return "refund", None
        if method == "GET" and len(parts) == 2 and parts[0] == "refunds":
            return "refund_query", urllib.parse.unquote(parts[1])
        return None, None

    def channel_call(self, method, path, raw):
        sim = self.sim
        call, number = self.route(method, path)
        rec = {"time": now_iso(), "t": time.time(), "method": method, "path": self.path,
               "peer": "%s:%d" % (self.client_address[0], self.client_address[1]),
               "call": call, "request_id": self.headers.get("X-Request-Id"),
               "sig_ok": None, "status": None, "fault": None, "body": None}
        try:
            rec["body"] = json.loads(raw) if raw else None
        except ValueError:
            rec["body"] = raw.decode("utf-8", "replace")
        self.current = rec
        with sim.lock:
            sim.calls.append(rec)
            secret = sim.secret
        if call is None:
            rec["status"] = 404
            self.send_json(404, {"code": "NOT_FOUND", "message": "no such route"}, signed=True)
            return
        signed_over = raw if method == "POST" else self.path.encode()
        got = (self.headers.get("X-Signature") or "").strip().lower()
        rec["sig_ok"] = bool(secret) and hmac.compare_digest(got, sign(secret, signed_over))
        if not rec["sig_ok"]:
            rec["status"] = 401
            sim.log("%s %s -> 401 SIGN_ERROR" % (method, self.path))
            self.send_json(401, {"code": "SIGN_ERROR", "message": "bad or missing X-Signature"},
                           signed=True)
            return
        body = rec["body"] if isinstance(rec["body"], dict) else {}
        if number is None:
            number = body.get("out_trade_no") if call == "create" else body.get("out_refund_no")
        rec["number"] = number
        with sim.lock:
            fault = sim.take_fault_locked(call, number)
        mode = fault["mode"] if fault else None
        rec["fault"] = mode
        if mode == "5xx_before":
            return self.finish_call(rec, Answer(500, {"code": "SYSTEM_ERROR"}))
        if mode == "decline":
            code = fault.get("code", "INVALID_FIELD")
            ans = err(int(fault.get("status", 400)), code, "declined")
            if code is None:  # a 4xx with no code member
                ans = Answer(ans.status, {"message": "declined"})
            return self.finish_call(rec, ans)
        if mode == "reset" and not fault.get("after"):
            rec["status"] = "reset"
            sim.log("%s %s -> reset (before)" % (method, self.path))
            return self.drop(True)
        if mode == "slow":
            sim.stop_event.wait(fault.get("delay_ms", 1000) / 1000.0)
        # do the call
        deliver_first = None
        try:
            if call == "create":
                if not isinstance(rec["body"], dict):
                    raise BadField("body", "a JSON object")
                ans, deliver_first = sim.create(body)
            elif call == "query":
                ans = sim.query(number)
            elif call == "close":
                ans = sim.close(number)
            elif call == "refund":
                if not isinstance(rec["body"], dict):
                    raise BadField("body", "a JSON object")
                ans = sim.refund(body)
            else:
                ans = sim.refund_query(number)
        except BadField as e:
            ans = Answer(400, {"code": "INVALID_FIELD", "field": e.field, "message": str(e)})
        rec["result"] = ans.body
        if deliver_first is not None:
            sim.deliver_now(deliver_first)
        if mode == "5xx_after":
            return self.finish_call(rec, Answer(500, {"code": "SYSTEM_ERROR"}))
        if mode == "reset":
            rec["status"] = "reset"
            sim.log("%s %s -> reset (after)" % (method, self.path))
            return self.drop(True)
        if mode == "timeout_after_create":
            sim.stop_event.wait(fault.get("hold_ms", 30000) / 1000.0)
            if fault.get("then") != "answer":
                rec["status"] = "dropped"
                sim.log("%s %s -> held, dropped" % (method, self.path))
                return self.drop(False)
        if mode == "garbage":
            data = b"<html><body>502 Bad Gateway</body></html"
            status = int(fault.get("status", 200))
            rec["status"] = status
            sim.log("%s %s -> %d garbage" % (method, self.path, status))
            return self.send_raw(status, data, sign(sim.secret, data), ctype="text/html")
        if mode == "bad_signature":
            data = dumps(ans.body)
            rec["status"] = ans.status
            sim.log("%s %s -> %d bad signature" % (method, self.path, ans.status))
            return self.send_raw(ans.status, data, "0" * 64)
        self.finish_call(rec, ans)

    def finish_call(self, rec, ans):
        rec["status"] = ans.status
        rec["t_end"] = time.time()
        self.sim.log("%s %s -> %d %s%s" % (rec["method"], rec["path"], ans.status,
                                           ans.body.get("code"),
                                           " (fault %s)" % rec["fault"] if rec["fault"] else ""))
        self.send_json(ans.status, ans.body, signed=True)

    # ---- control API ---------------------------------------------------
    def control(self, method, path, raw):
        sim = self.sim
        try:
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise ValueError
        except ValueError:
            return self.send_json(400, {"code": "INVALID_FIELD", "message": "body: a JSON object"})
        parts = path.strip("/").split("/")[1:]
        try:
            if method == "GET" and parts == ["health"]:
                return self.send_json(200, {"code": "OK"})
            if parts == ["config"]:
                if method == "POST":
                    return self.send_json(200, sim.config(body))
                with sim.lock:
                    return self.send_json(200, sim.config_view_locked())
            if method == "POST" and len(parts) == 2 and parts[0] == "pay":
                ans = sim.pay(urllib.parse.unquote(parts[1]), body.get("status", "SUCCESS"),
                              body.get("amount"))
                return self.send_json(ans.status, ans.body)
            if method == "POST" and len(parts) == 2 and parts[0] == "refund":
                ans = sim.refund_set(urllib.parse.unquote(parts[1]), body.get("status", "SUCCESS"))
                return self.send_json(ans.status, ans.body)
            if method == "POST" and parts == ["reset"]:
                with sim.lock:
                    sim.reset_locked()
                return self.send_json(200, {"code": "OK"})
            if method == "GET" and parts == ["calls"]:
                with sim.lock:
                    out = [dict(c) for c in sim.calls]
                return self.send_json(200, out)
            if method == "GET" and parts == ["orders"]:
                with sim.lock:
                    out = [dict(o, history=list(o["history"])) for o in sim.orders.values()]
                return self.send_json(200, out)
            if method == "GET" and parts == ["refunds"]:
                with sim.lock:
                    out = [dict(r) for r in sim.refunds.values()]
                return self.send_json(200, out)
            if method == "GET" and parts == ["notifications"]:
                with sim.lock:
                    out = [dict(d) for d in sim.deliveries]
                return self.send_json(200, out)
            if method == "GET" and parts == ["pending"]:
                with sim.lock:
                    out = [{"notify_id": n["notify_id"], "out_trade_no": n["out_trade_no"],
                            "status": n["status"], "attempt": n["attempt"],
                            "delivered": n["delivered"], "gave_up": n["gave_up"],
                            "stale": n["stale"]} for n in sim.notifications.values()]
                return self.send_json(200, out)
        except BadField as e:
            return self.send_json(400, {"code": "INVALID_FIELD", "field": e.field, "message": str(e)})
        return self.send_json(404, {"code": "NOT_FOUND"})


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def parse_schedule(s):
    try:
        out = [int(x) for x in s.split(",") if x.strip() != ""]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of milliseconds")
    if any(x < 0 for x in out):
        raise argparse.ArgumentTypeError("milliseconds must not be negative")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="payment channel simulator (CHANNEL.md)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--secret", default="")
    ap.add_argument("--notify-schedule-ms", type=parse_schedule, default=DEFAULT_SCHEDULE_MS)
    ap.add_argument("--log")
    a = ap.parse_args(argv)
    sim = Sim(a.secret, a.notify_schedule_ms, a.log)
    Handler.sim = sim
    try:
        srv = Server((a.host, a.port), Handler)
    except OSError as e:
        print("chansim: cannot listen on %s:%d: %s" % (a.host, a.port, e), file=sys.stderr)
        return 2
    print("listening on %d" % srv.server_address[1], flush=True)
    sim.log("listening on %s:%d" % (a.host, srv.server_address[1]))
    threading.Thread(target=sim.notifier, daemon=True).start()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        sim.stop_event.set()
        srv.server_close()
    return 0


def _on_sigterm(_signum, _frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(main())
