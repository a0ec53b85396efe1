"""HTTP hardening (issues 9 and 16): an oversized body sent whole is drained
before the 413; HEAD on GET routes; duplicate Authorization / Content-Type;
logs that cannot be forged and never show a key; a per-address connection
cap and a deadline for the whole request, so slow clients cannot starve a
normal one."""

import http.client
import json
import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402
from test_framing import exchange  # noqa: E402

MIB = 1024 * 1024


class Hardening(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()
        cls.m = cls.server.new_merchant()

    # -- issue 9: the whole oversized body, then the 413
    def test_http_client_reads_413_after_sending_the_whole_body(self):
        for size in (MIB + 1, 2 * MIB, 6 * MIB):
            with self.subTest(size=size):
                conn = http.client.HTTPConnection(harness.HOST, self.server.port, timeout=30)
                try:
                    body = b'{"merchant_order_no":"' + b"x" * size + b'"}'
                    # no try/except: a broken pipe here is the bug
                    conn.request("POST", "/v1/payments", body=body,
                                 headers=self.m.headers(uid("big")))
                    r = conn.getresponse()
                    data = r.read()
                finally:
                    conn.close()
                self.assertEqual(r.status, 413, data)
                self.assertEqual(json.loads(data)["code"], "payload_too_large")

    def test_keep_alive_survives_a_drained_413(self):
        conn = http.client.HTTPConnection(harness.HOST, self.server.port, timeout=30)
        try:
            conn.request("POST", "/v1/payments", body=b"x" * (2 * MIB),
                         headers=self.m.headers(uid("big")))
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 413)
            conn.request("GET", "/healthz")
            r = conn.getresponse()
            r.read()
            self.assertEqual(r.status, 200)
        finally:
            conn.close()

    # -- issue 16: HEAD, WWW-Authenticate, duplicates
    def test_head_on_get_routes(self):
        p = self.m.create_payment(self.ch.name)
        for path in ("/healthz", "/v1/payments/" + p["id"], "/v1/balance", "/metrics"):
            with self.subTest(path=path):
                g = self.server.request("GET", path, headers=self.m.headers())
                h = self.server.request("HEAD", path, headers=self.m.headers())
                self.assertEqual(h.status, g.status, h)
                self.assertEqual(h.body, b"")
                self.assertEqual(h.header("Content-Type"), g.header("Content-Type"))
        r = self.server.request("PUT", "/v1/balance", headers=self.m.headers())
        self.assertProblem(r, 405, "method_not_allowed")
        self.assertIn("HEAD", r.header("Allow"))

    def test_www_authenticate_on_401(self):
        r = self.server.request("GET", "/v1/balance")
        self.assertProblem(r, 401, "unauthorized")
        self.assertTrue((r.header("WWW-Authenticate") or "").startswith("Bearer"), r)
        r = self.server.request("GET", "/v1/balance", headers={"Authorization": "Bearer nope"})
        self.assertProblem(r, 401, "unauthorized")
        self.assertTrue((r.header("WWW-Authenticate") or "").startswith("Bearer"), r)
        r = self.ch.post(self.ch.body("pay_x", 1), signature="00")
        self.assertProblem(r, 401, "invalid_signature")
        self.assertIsNotNone(r.header("WWW-Authenticate"), r)

    def test_duplicate_authorization_and_content_type(self):
        other = self.merchant()
        body = harness.dumps(self.m.payment_body(1000, "CNY", self.ch.name))
        for extra in (b"Authorization: Bearer " + other.api_key.encode() + b"\r\n",
                      b"Authorization: Bearer " + self.m.api_key.encode() + b"\r\n",
                      b"Content-Type: text/plain\r\n",
                      b"Content-Type: application/json\r\n"):
            with self.subTest(extra=extra):
                k = uid("dup")
                req = (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                       + self.m.api_key.encode() + b"\r\nContent-Type: application/json\r\n"
                       + extra + b"Idempotency-Key: " + k.encode()
                       + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
                st, head, data, _ = exchange(self.server.port, req)
                self.assertEqual(st, 400, data)
                self.assertIn(b'"code":"invalid_request"', data)
                self.assertNoRecord(self.m, "payment", k)


class Logs:
    """Mixed into a TestCase with a server whose log is checked."""

    def hostile_requests(self):
        m = self.server.new_merchant()
        ch = self.server.new_channel()
        key = uid("SECRETKEY")
        self.assertFirst(m.post("/v1/payments", m.payment_body(100, "CNY", ch.name), key=key))
        self.assertStatus(m.record("payment", key), 200)
        port = self.server.port
        for method in (b"G\x1b[2J\x1b[31mET", b"GE\rT", b"P\xffO\xfeST", b"GET\x00X"):
            exchange(port, method + b" /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        exchange(port, b"GET /v1/payments/%1b[2J%0d%0aFAKE HTTP/1.1\r\nHost: x\r\n"
                       b"Connection: close\r\n\r\n")
        marker = self.server.request("GET", "/healthz").header("X-Request-Id")
        log = self.server.wait_log(lambda t: marker in t)
        time.sleep(0.2)
        with open(self.server.log_path, "rb") as f:
            raw = f.read()
        self.assertNotIn(b"\x1b", raw)
        self.assertNotIn(b"\r", raw)
        self.assertNotIn(b"\xff", raw)
        self.assertNotIn(key, log, "an idempotency key reached the log")
        self.assertNotIn(b"FAKE", raw)
        raw.decode("ascii")  # every byte printable ASCII
        return raw


class TextLogs(harness.TestCase, Logs):

    def test_text_log_cannot_be_forged(self):
        raw = self.hostile_requests()
        self.assertIn(b"G\\x1b[2J", raw)  # escaped, still readable
        for ln in raw.splitlines():
            self.assertRegex(ln, rb"^\d{4}-\d\d-\d\dT", "a line that is not idemd's: %r" % ln)


class JsonLogs(harness.TestCase, Logs):
    SERVER_ARGS = ("--log-format", "json")

    def test_json_log_lines_stay_json(self):
        raw = self.hostile_requests()
        methods = []
        for ln in raw.splitlines():
            d = json.loads(ln)  # every line
            methods.append(d.get("method"))
        self.assertIn("P\\xffO\\xfeST", methods)


def drip(socks, stop, every=0.5):
    """Send one more byte of a header line on every socket, every `every`
    seconds, until stop is set (one thread for all of them)."""
    while not stop.wait(every):
        for s in socks:
            try:
                s.send(b"x")
            except OSError:
                pass


def is_closed(s, wait):
    """True when the server closed s within wait seconds."""
    s.settimeout(wait)
    try:
        return s.recv(4096) == b"" or True  # an answer (408/400) or EOF
    except socket.timeout:
        return False
    except OSError:
        return True


class Slowloris(harness.TestCase):
    """500 connections from 127.0.0.1 dripping a header byte by byte, on a
    server that takes 300: a normal client from another address is served."""
    SERVER_ARGS = ("--max-connections", "300", "--max-connections-per-ip", "50",
                   "--request-timeout", "20", "--connection-timeout", "30")
    SLOW = 500

    def test_normal_client_is_served_while_500_drip(self):
        socks, stop = [], threading.Event()
        try:
            for _ in range(self.SLOW):
                try:
                    s = socket.create_connection((harness.HOST, self.server.port), timeout=5)
                    s.send(b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    socks.append(s)
                except OSError:
                    pass  # refused at once: fine
            t = threading.Thread(target=drip, args=(socks, stop), daemon=True)
            t.start()
            time.sleep(1.0)  # let the server settle on them
            conn = http.client.HTTPConnection(harness.HOST, self.server.port, timeout=5,
                                              source_address=("127.0.0.2", 0))
            try:
                conn.request("GET", "/healthz")
                r = conn.getresponse()
                r.read()
            finally:
                conn.close()
            self.assertEqual(r.status, 200)
        finally:
            stop.set()
            for s in socks:
                s.close()


class Deadline(harness.TestCase):
    """A request dripping in a byte every 0.3 s is cut at --request-timeout,
    although every byte resets --connection-timeout."""
    SERVER_ARGS = ("--request-timeout", "2", "--connection-timeout", "60")

    def test_dripping_head_is_cut(self):
        s = socket.create_connection((harness.HOST, self.server.port), timeout=5)
        stop = threading.Event()
        t = threading.Thread(target=drip, args=([s], stop, 0.3), daemon=True)
        try:
            s.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            t.start()
            self.assertTrue(is_closed(s, 15), "still open 15 s into a 2 s request deadline")
        finally:
            stop.set()
            s.close()
        self.assertStatus(self.server.request("GET", "/healthz"), 200)

    def test_dripping_body_is_cut(self):
        m = self.server.new_merchant()
        s = socket.create_connection((harness.HOST, self.server.port), timeout=5)
        stop = threading.Event()
        t = threading.Thread(target=drip, args=([s], stop, 0.3), daemon=True)
        try:
            s.send(b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                   + m.api_key.encode() + b"\r\nContent-Length: 100000\r\n\r\n{")
            t.start()
            self.assertTrue(is_closed(s, 15), "still open 15 s into a 2 s request deadline")
        finally:
            stop.set()
            s.close()

    def test_a_quick_request_on_an_old_connection_is_not_cut(self):
        conn = http.client.HTTPConnection(harness.HOST, self.server.port, timeout=10)
        try:
            for _ in range(3):
                conn.request("GET", "/healthz")
                r = conn.getresponse()
                r.read()
                self.assertEqual(r.status, 200)
                time.sleep(1.0)  # under the deadline between requests
        finally:
            conn.close()


class ResumeRace(harness.TestCase):
    """Issue 16: a client gone while its write waits for the writer must not
    make anything free r under the writer. The writer resumes the suspended
    connection after the COMMIT (http_write_done -> req_resume) and touches
    r no more; libmicrohttpd may then answer, see the reset and free r on its
    event thread at once. IDEMD_TEST_RESUME_DELAY_US holds the writer 100 ms
    just after MHD_resume_connection, inside that window, while the clients
    reset right after sending. Run it on a ThreadSanitizer build (cmake -B
    build-tsan -DCMAKE_C_FLAGS=-fsanitize=thread
    -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread) or the ASan build to see a
    touch of r inside the window."""

    @classmethod
    def setUpClass(cls):
        os.environ["IDEMD_TEST_RESUME_DELAY_US"] = "100000"
        try:
            super().setUpClass()
        finally:
            del os.environ["IDEMD_TEST_RESUME_DELAY_US"]

    def test_client_gone_while_the_writer_resumes(self):
        m = self.server.new_merchant()
        ch = self.server.new_channel()
        for i in range(20):
            body = harness.dumps(m.payment_body(100, "CNY", ch.name))
            req = (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                   + m.api_key.encode() + b"\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
            s = socket.create_connection((harness.HOST, self.server.port), timeout=5)
            s.sendall(req)
            # RST at once: libmicrohttpd sees ECONNRESET when it resumes
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        time.sleep(0.5)
        self.assertEqual(self.server.proc.poll(), None, "idemd died:\n" + self.server.log_tail())
        self.assertStatus(self.server.request("GET", "/healthz"), 200)
        self.assertNotIn("Sanitizer", self.server.log_text())


if __name__ == "__main__":
    harness.main()
