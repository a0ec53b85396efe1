"""Harness for idem's black-box HTTP tests: real idemd processes, real sockets.

Starts idemd on a free loopback port with a fresh database (a temp SQLite file,
or $IDEM_TEST_DB_URL when set), waits until GET /healthz answers 200, and stops
it with SIGTERM, checking that it exits 0. Credentials come from idemctl, the
way an operator would create them. Python 3 standard library only.

Every test creates its own merchants, channels, order numbers and keys (see
uid()), so tests never collide and never assume an empty database.

Environment:
  IDEMD, IDEMCTL       paths of the binaries (ctest sets them; otherwise they
                       are looked up in build-http/ and build/)
  IDEM_TEST_DB_URL     shared database URL instead of a temp SQLite file
  IDEM_TEST_KEEP=1     keep temp directories (server logs) after the run
  IDEM_TEST_VERBOSE=1  echo the server log when a server stops
"""

import contextlib
import datetime
import hashlib
import hmac
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse

HOST = "127.0.0.1"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 20.0
REQUEST_TIMEOUT = 30.0


# ---- binaries ----------------------------------------------------------------

def _find_binary(env, name):
    path = os.environ.get(env)
    if path:
        return path
    for build in ("build-http", "build"):
        root = os.path.join(REPO, build)
        for dirpath, _dirs, files in os.walk(root):
            if name in files and "CMakeFiles" not in dirpath:
                return os.path.join(dirpath, name)
    raise RuntimeError("%s is not set and no %s binary was found under build-http/ or build/"
                       % (env, name))


def idemd_path():
    return _find_binary("IDEMD", "idemd")


def idemctl_path():
    return _find_binary("IDEMCTL", "idemctl")


# ---- small helpers -----------------------------------------------------------

def uid(prefix="T"):
    """A fresh natural key / idempotency key: PREFIX-<12 hex>, [A-Za-z0-9_.-]."""
    return "%s-%s" % (prefix, secrets.token_hex(6))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def dumps(obj):
    """Compact JSON bytes, the default way tests encode bodies."""
    return json.dumps(obj, separators=(",", ":")).encode()


def sign(secret, body):
    """X-Signature: lower-case hex HMAC-SHA256 of the raw body, keyed by the
    channel secret's bytes as printed by idemctl."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def parse_time(s):
    """RFC 3339 UTC timestamp -> aware datetime."""
    if not isinstance(s, str):
        raise AssertionError("timestamp is not a string: %r" % (s,))
    m = re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]00:00)", s)
    if not m:
        raise AssertionError("not an RFC 3339 UTC timestamp: %r" % (s,))
    return datetime.datetime.fromisoformat(s.replace("Z", "+00:00"))


def sqlite_path(db_url):
    """The file behind a sqlite: URL, or None for any other database."""
    if db_url.startswith("sqlite:") and not db_url.startswith("sqlite::memory:"):
        path = db_url[len("sqlite:"):]
        if path.startswith("//"):
            path = path[2:]
        return path
    return None


# ---- HTTP --------------------------------------------------------------------

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers      # http.client.HTTPMessage: case-insensitive
        self.body = body            # raw bytes, exactly as received

    def header(self, name):
        return self.headers.get(name)

    @property
    def replayed(self):
        return self.headers.get("Idempotent-Replayed") is not None

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise AssertionError("response body is not JSON (%s): %r" % (e, self.body[:300]))

    def __repr__(self):
        return "<HTTP %d %r %r>" % (self.status, dict(self.headers.items()), self.body[:400])


def http_request(port, method, path, body=None, headers=None, timeout=REQUEST_TIMEOUT,
                 chunked=False):
    """One request on a fresh connection. headers: dict (values str or bytes);
    a value of None leaves that header out."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        hdrs = {k: v for k, v in (headers or {}).items() if v is not None}
        if chunked:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            try:
                step = 64 * 1024
                for i in range(0, len(body), step):
                    piece = body[i:i + step]
                    conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may answer before reading everything
        else:
            try:
                conn.request(method, path, body=body, headers=hdrs)
            except (BrokenPipeError, ConnectionResetError):
                if conn.sock is None:
                    raise  # reset while connecting: there is no answer to read
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, resp.headers, data)
    finally:
        conn.close()


def storm(calls, timeout=60, sent=None):
    """Run every call, (side, zero-argument function), in its own thread, all
    released together; returns the responses in order, each with .side set
    (exceptions are returned, not raised). sent(side), when given, is called
    after each call, answered or not."""
    barrier = threading.Barrier(len(calls))
    out = [None] * len(calls)

    def run(i):
        side, fn = calls[i]
        try:
            barrier.wait(15)
            out[i] = fn()
            out[i].side = side
        except Exception as e:  # noqa: BLE001
            out[i] = e
        if sent:
            sent(side)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        raise AssertionError("storm did not finish within %ds" % timeout)
    return out


# ---- the server process ------------------------------------------------------

class Server:
    """One idemd process. db_url None: $IDEM_TEST_DB_URL or a fresh temp SQLite
    file. Several Servers may share a db_url (restart tests)."""

    def __init__(self, extra_args=(), db_url=None, tmpdir=None):
        self.extra_args = list(extra_args)
        self._own_tmp = tmpdir is None
        self.tmpdir = tmpdir or tempfile.mkdtemp(prefix="idem-http-")
        self.db_url = db_url or os.environ.get("IDEM_TEST_DB_URL") or \
            "sqlite:" + os.path.join(self.tmpdir, "idem.db")
        self.proc = None
        self.port = None
        self.log_path = None
        self._log = None
        self._nstarts = 0

    # -- lifecycle
    def start(self):
        last = None
        for _attempt in range(3):
            self.port = free_port()
            self._nstarts += 1
            self.log_path = os.path.join(self.tmpdir, "idemd-%d.log" % self._nstarts)
            self._log = open(self.log_path, "wb")
            argv = [idemd_path(), "--listen", "%s:%d" % (HOST, self.port), "--db", self.db_url]
            argv += self.extra_args
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT)
            try:
                self._wait_healthy()
                return self
            except RuntimeError as e:
                last = e
                if self.proc.poll() is None:
                    self.proc.kill()
                    self.proc.wait()
                self._log.close()
                # an early exit may be a port taken in the meantime: retry
                if "exited" not in str(e):
                    break
        raise RuntimeError("idemd did not start: %s\n--- log ---\n%s" % (last, self.log_tail()))

    def _wait_healthy(self):
        deadline = time.monotonic() + STARTUP_TIMEOUT
        last = "no answer"
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise RuntimeError("idemd exited with %d during startup" % rc)
            try:
                r = http_request(self.port, "GET", "/healthz", timeout=2)
                if r.status == 200:
                    return
                last = "healthz %d" % r.status
            except OSError as e:
                last = str(e)
            time.sleep(0.05)
        raise RuntimeError("no 200 from /healthz within %.0fs (%s)" % (STARTUP_TIMEOUT, last))

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        """Send sig, wait, return the exit code (None if it had to be killed)."""
        if self.proc is None:
            return 0
        rc = None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
        else:
            rc = self.proc.returncode
        self._log.close()
        if os.environ.get("IDEM_TEST_VERBOSE"):
            sys.stderr.write("--- idemd log (%s) ---\n%s\n" % (self.log_path, self.log_text()))
        return rc

    def stop_checked(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT):
        rc = self.stop(sig, timeout)
        if rc != 0:
            raise AssertionError("idemd did not exit 0 on %s (rc=%r)\n--- log ---\n%s"
                                 % (signal.Signals(sig).name, rc, self.log_tail()))

    def cleanup(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._own_tmp and not os.environ.get("IDEM_TEST_KEEP"):
            shutil.rmtree(self.tmpdir, ignore_errors=True)

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    def wait_log(self, pred, timeout=3.0):
        """The log once pred(text) holds (request lines are written after the
        response is sent, so a test may read the log before its line is
        there); the last text read if it never does."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log_text()
            if pred(text) or time.monotonic() > deadline:
                return text
            time.sleep(0.02)

    def log_tail(self, n=60):
        return "\n".join(self.log_text().splitlines()[-n:])

    # -- HTTP
    def request(self, method, path, body=None, headers=None, **kw):
        return http_request(self.port, method, path, body, headers, **kw)

    def raw(self, data, timeout=15.0):
        """Send raw bytes (from a second thread, so an early answer is never
        blocked by a full socket buffer) and parse the response."""
        s = socket.create_connection((HOST, self.port), timeout=timeout)

        def send():
            with contextlib.suppress(OSError):
                s.sendall(data)

        t = threading.Thread(target=send, daemon=True)
        t.start()
        try:
            resp = http.client.HTTPResponse(s, method="POST")
            resp.begin()
            body = resp.read()
            return Response(resp.status, resp.headers, body)
        finally:
            t.join(timeout)
            s.close()

    # -- credentials
    def idemctl(self, *args):
        argv = [idemctl_path(), "--db", self.db_url] + list(args)
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if p.returncode != 0:
            raise RuntimeError("%s failed (%d): %s %s" % (" ".join(argv), p.returncode,
                                                          p.stdout.decode(errors="replace"),
                                                          p.stderr.decode(errors="replace")))
        return p.stdout.decode()

    def new_merchant(self, name=None):
        out = self.idemctl("merchant", "add", name or uid("merchant"), "--json")
        d = json.loads(out)
        assert d["merchant_id"].startswith("m_"), d
        assert d["api_key"].startswith("sk_"), d
        return Merchant(self, d["merchant_id"], d["api_key"])

    def new_channel(self, name=None):
        name = name or "c" + secrets.token_hex(6)
        d = json.loads(self.idemctl("channel", "add", name, "--json"))
        assert d["channel"] == name, d
        assert isinstance(d["secret"], str) and d["secret"], d
        return Channel(self, name, d["secret"])

    def ensure_channel(self, name):
        """Register channel name if it is not there yet (shared databases may
        have it already); returns the Channel or None when it existed."""
        try:
            return self.new_channel(name)
        except RuntimeError:
            return None

    # -- database invariants
    def ledger_check(self):
        """Check balances == SUM(ledger_entries) for every merchant and
        currency. Returns {(merchant_id, currency): amount} from the ledger,
        or None when the database is not SQLite (the check is skipped)."""
        return ledger_check(self.db_url)

    def count_payments(self, merchant_id, merchant_order_no):
        path = sqlite_path(self.db_url)
        if path is None:
            return None
        with contextlib.closing(_ro(path)) as db:
            return db.execute("SELECT count(*) FROM payments WHERE merchant_id = ? AND "
                              "merchant_order_no = ?", (merchant_id, merchant_order_no)
                              ).fetchone()[0]

    def ledger_rows(self, merchant_id):
        path = sqlite_path(self.db_url)
        if path is None:
            return None
        with contextlib.closing(_ro(path)) as db:
            return db.execute("SELECT currency, amount FROM ledger_entries WHERE merchant_id = ?"
                              " ORDER BY rowid", (merchant_id,)).fetchall()


def _ro(path):
    return sqlite3.connect("file:%s?mode=ro" % urllib.parse.quote(path), uri=True, timeout=10)


def ledger_check(db_url):
    """The one place that reads the database behind the API (read-only,
    SQLite only). Raises AssertionError on any balance that differs from its
    ledger sum; returns the ledger sums."""
    path = sqlite_path(db_url)
    if path is None:
        return None
    with contextlib.closing(_ro(path)) as db:
        db.execute("BEGIN")  # one snapshot for both reads
        ledger = {(m, c): s for m, c, s in db.execute(
            "SELECT merchant_id, currency, SUM(amount) FROM ledger_entries "
            "GROUP BY merchant_id, currency")}
        bal = {(m, c): a for m, c, a in db.execute(
            "SELECT merchant_id, currency, amount FROM balances")}
        db.execute("COMMIT")
    bad = []
    for k in set(ledger) | set(bal):
        if ledger.get(k, 0) != bal.get(k, 0):
            bad.append("%s %s: balance %r, ledger sum %r" % (k[0], k[1], bal.get(k), ledger.get(k)))
    if bad:
        raise AssertionError("balances differ from ledger sums:\n  " + "\n  ".join(sorted(bad)))
    return ledger


# ---- actors ------------------------------------------------------------------

class Merchant:
    def __init__(self, server, merchant_id, api_key):
        self.server = server
        self.id = merchant_id
        self.api_key = api_key

    def on(self, server):
        """The same merchant, talking to another server (after a restart)."""
        return Merchant(server, self.id, self.api_key)

    def headers(self, key=None, extra=None):
        h = {"Authorization": "Bearer " + self.api_key, "Content-Type": "application/json"}
        if key is not None:
            h["Idempotency-Key"] = key
        if extra:
            h.update(extra)
        return h

    def post(self, path, body, key=None, headers=None, **kw):
        if not isinstance(body, (bytes, bytearray)):
            body = dumps(body)
        return self.server.request("POST", path, body, self.headers(key, headers), **kw)

    def get(self, path, headers=None):
        h = {"Authorization": "Bearer " + self.api_key}
        h.update(headers or {})
        return self.server.request("GET", path, None, h)

    # -- conveniences (each checks its happy path)
    def payment_body(self, amount=1000, currency="CNY", channel="mock", order=None, **extra):
        b = {"merchant_order_no": order or uid("ORD"), "amount": amount, "currency": currency,
             "channel": channel}
        b.update(extra)
        return b

    def create_payment(self, channel, amount=1000, currency="CNY", order=None, key=None):
        body = self.payment_body(amount, currency, channel, order)
        r = self.post("/v1/payments", body, key=key)
        if r.status != 201:
            raise AssertionError("payment not created: %r" % r)
        return r.json()

    def payment(self, payment_id):
        r = self.get("/v1/payments/" + payment_id)
        if r.status != 200:
            raise AssertionError("GET payment %s: %r" % (payment_id, r))
        return r.json()

    def balances(self):
        r = self.get("/v1/balance")
        if r.status != 200:
            raise AssertionError("GET /v1/balance: %r" % r)
        d = r.json()
        assert d.get("object") == "balance", d
        out = {}
        for e in d["available"]:
            assert e["currency"] not in out, "currency listed twice: %r" % d
            out[e["currency"]] = e["amount"]
        return out

    def balance(self, currency="CNY"):
        return self.balances().get(currency, 0)

    def record(self, business_type, key):
        return self.get("/v1/idempotency-records/%s/%s"
                        % (business_type, urllib.parse.quote(key, safe="")))

    def paid_payment(self, channel, amount=1000, currency="CNY"):
        """A payment moved to succeeded by a SUCCESS notification."""
        p = self.create_payment(channel.name, amount, currency)
        r = channel.notify(p["id"], amount)
        if r.status != 200:
            raise AssertionError("notification failed: %r" % r)
        return self.payment(p["id"])


class Channel:
    def __init__(self, server, name, secret):
        self.server = server
        self.name = name
        self.secret = secret

    def body(self, payment_id, amount, status="SUCCESS", notify_id=None, txn=None):
        return {"notify_id": notify_id or uid("N"), "payment_id": payment_id,
                "channel_txn_id": txn or uid("TXN"), "status": status, "amount": amount}

    def post(self, body, signature=True, headers=None, channel=None):
        """signature: True = correct, None = header left out, str = sent as is."""
        if not isinstance(body, (bytes, bytearray)):
            body = dumps(body)
        h = {"Content-Type": "application/json"}
        if signature is True:
            h["X-Signature"] = sign(self.secret, body)
        elif signature is not None:
            h["X-Signature"] = signature
        h.update(headers or {})
        return self.server.request("POST", "/v1/notifications/" + (channel or self.name), body, h)

    def notify(self, payment_id, amount, status="SUCCESS", notify_id=None):
        return self.post(self.body(payment_id, amount, status, notify_id))


# ---- assertions --------------------------------------------------------------

class TestCase(unittest.TestCase):
    """Base class: one idemd per test class (SERVER_ARGS), stopped with SIGTERM
    at the end, which must exit 0."""

    SERVER_ARGS = ()
    server = None
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.server = Server(cls.SERVER_ARGS)
        try:
            cls.server.start()
        except Exception:
            cls.server.cleanup()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.server.stop_checked()
        finally:
            cls.server.cleanup()

    # -- fixtures
    def merchant(self):
        return self.server.new_merchant()

    def channel(self):
        return self.server.new_channel()

    # -- checks
    def assertStatus(self, r, status, msg=None):
        if r.status != status:
            self.fail("expected HTTP %d, got %r%s" % (status, r, (": " + msg) if msg else ""))

    def assertProblem(self, r, status, code=None, codes=None):
        """An RFC 9457 problem with every member API.md promises."""
        if r.status != status:
            self.fail("expected HTTP %d %s, got %r" % (status, code or codes, r))
        ctype = (r.header("Content-Type") or "").split(";")[0].strip().lower()
        self.assertEqual(ctype, "application/problem+json", "Content-Type of %r" % r)
        p = r.json()
        self.assertIsInstance(p, dict, r)
        for member in ("type", "title", "status", "code", "detail"):
            self.assertIn(member, p, "problem member %r missing in %r" % (member, r))
        self.assertIsInstance(p["type"], str)
        self.assertIsInstance(p["title"], str)
        self.assertIsInstance(p["detail"], str)
        self.assertEqual(p["status"], status, "problem status member: %r" % r)
        if code is not None:
            self.assertEqual(p["code"], code, "problem code: %r" % r)
        if codes is not None:
            self.assertIn(p["code"], codes, "problem code: %r" % r)
        if p["code"] in NOT_STORED:
            self.assertIsNone(r.header("Idempotent-Replayed"),
                              "an error that is never stored was marked as a replay: %r" % r)
        return p

    def assertFirst(self, r, status=201):
        self.assertStatus(r, status)
        self.assertIsNone(r.header("Idempotent-Replayed"),
                          "Idempotent-Replayed on a first request: %r" % r)

    def assertReplayOf(self, r, first, status=None):
        """r replays first: same status, byte-identical body, the header."""
        self.assertStatus(r, status or first.status)
        self.assertEqual(r.header("Idempotent-Replayed"), "true", "not marked replayed: %r" % r)
        self.assertEqual(r.body, first.body, "replayed body differs from the first answer")

    def assertNoRecord(self, merchant, business_type, key):
        r = merchant.record(business_type, key)
        self.assertProblem(r, 404, "not_found")

    def assertLedger(self):
        self.server.ledger_check()


NOT_STORED = {"invalid_json", "invalid_request", "missing_idempotency_key",
              "invalid_idempotency_key", "unauthorized", "invalid_signature",
              "unknown_merchant", "method_not_allowed", "request_in_progress",
              "payload_too_large", "unsupported_media_type", "idempotency_key_reused",
              "store_unavailable"}


def main():
    """unittest.main with verbose output; exits non-zero on any failure."""
    unittest.main(verbosity=2)
