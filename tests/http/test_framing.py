"""HTTP framing and byte-exactness over raw sockets (issue 15): NUL bytes in
keys, the Authorization header, the path and decoded query values; OWS around
an Idempotency-Key; 255-byte keys; duplicate Content-Length, whitespace before
a colon, HTTP/1.1 without Host; inputs that used to hang a connection (a TLS
ClientHello, unknown transfer codings, thousands of query parameters) must be
answered or closed at once.

"At once" is checked against a server whose --connection-timeout is 60 s: a
connection still open after HANG_BOUND seconds was left hanging."""

import os
import socket
import ssl
import sys
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402

HANG_BOUND = 10.0


def exchange(port, data, timeout=HANG_BOUND):
    """Send data on a fresh connection, half-close nothing, read until the
    server closes or timeout. Returns (status or None, head bytes, body bytes,
    closed): status None when no status line came back."""
    s = socket.create_connection((harness.HOST, port), timeout=timeout)
    got = b""
    closed = False
    deadline = time.monotonic() + timeout
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        while time.monotonic() < deadline:
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
            head, sep, body = got.partition(b"\r\n\r\n")
            if sep:
                length = None
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v.strip())
                if length is not None and len(body) >= length:
                    break
    finally:
        s.close()
    status = None
    head, _, body = got.partition(b"\r\n\r\n")
    if got.startswith(b"HTTP/1."):
        status = int(got.split(b" ", 2)[1])
    return status, head, body, closed


class Framing(harness.TestCase):
    SERVER_ARGS = ("--connection-timeout", "60")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()
        cls.m = cls.server.new_merchant()

    # -- helpers
    def body(self, amount=1000, order=None):
        return harness.dumps(self.m.payment_body(amount, "CNY", self.ch.name, order=order))

    def raw_post(self, key=None, body=None, auth=None, extra=b"", path=b"/v1/payments"):
        body = body if body is not None else self.body()
        auth = auth if auth is not None else b"Bearer " + self.m.api_key.encode()
        req = (b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\n"
               b"Authorization: " + auth + b"\r\nContent-Type: application/json\r\n")
        if key is not None:
            req += b"Idempotency-Key: " + key + b"\r\n"
        req += extra
        req += b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body
        return exchange(self.server.port, req)

    def assertRawProblem(self, res, status, code=None):
        st, head, body, _closed = res
        self.assertEqual(st, status, "expected %d, got %r %r" % (status, head, body[:300]))
        self.assertIn(b"application/problem+json", head.lower(), head)
        if code is not None:
            self.assertIn(('"code":"%s"' % code).encode(), body, body)

    def assertAnsweredOrClosed(self, res, statuses):
        st, head, body, closed = res
        if st is None:
            self.assertTrue(closed, "neither answered nor closed within %.0f s" % HANG_BOUND)
        else:
            self.assertIn(st, statuses, "%r %r" % (head, body[:300]))

    # -- NUL and bytes in Idempotency-Key
    def test_nul_in_key_is_invalid_not_a_collision(self):
        k = uid("k").encode()
        st, head, body, _ = self.raw_post(key=k)
        self.assertEqual(st, 201, body)
        for bad in (k + b"\x00x", k + b"\x00", b"\x00" + k, k[:3] + b"\x00" + k[3:]):
            with self.subTest(bad=bad):
                self.assertRawProblem(self.raw_post(key=bad), 400, "invalid_idempotency_key")

    def test_control_and_non_ascii_bytes_in_key(self):
        k = uid("k").encode()
        for bad in (k + b"\x01", k + b"\x7f", k + b"\xff", k + b"\xc3\xa9", k + b"\x0bx"):
            with self.subTest(bad=bad):
                self.assertRawProblem(self.raw_post(key=bad), 400, "invalid_idempotency_key")

    def test_ows_around_key_is_stripped(self):
        k = uid("ows").encode()
        body = self.body()
        st, _h, first, _ = self.raw_post(key=k, body=body)
        self.assertEqual(st, 201, first)
        for spaced in (b"  " + k, k + b"  ", b"\t" + k + b" \t"):
            with self.subTest(spaced=spaced):
                st, head, again, _ = self.raw_post(key=spaced, body=body)
                self.assertEqual(st, 201, again)
                self.assertIn(b"idempotent-replayed: true", head.lower())
                self.assertEqual(again, first)

    def test_255_byte_keys(self):
        base = ("L" + uid("")).encode()
        k1 = (base + b"a" * 255)[:254] + b"1"
        k2 = k1[:254] + b"2"
        self.assertEqual(len(k1), 255)
        b1, b2 = self.body(), self.body()
        st, _h, first, _ = self.raw_post(key=k1, body=b1)
        self.assertEqual(st, 201, first)
        st, _h, second, _ = self.raw_post(key=k2, body=b2)
        self.assertEqual(st, 201, "a different 255-byte key is a new request: %r" % second)
        st, head, again, _ = self.raw_post(key=k1, body=b1)
        self.assertEqual(st, 201, again)
        self.assertEqual(again, first)
        self.assertRawProblem(self.raw_post(key=k1 + b"x"), 400, "invalid_idempotency_key")
        # the same key as an sf-string, and its record
        st, head, again, _ = self.raw_post(key=b'"' + k1 + b'"', body=b1)
        self.assertEqual(st, 201, again)
        self.assertEqual(again, first)
        self.assertIn(b"idempotent-replayed: true", head.lower())
        rec = self.m.record("payment", k1.decode())
        self.assertStatus(rec, 200)
        self.assertEqual(rec.json()["key"], k1.decode())
        self.assertRawProblem(self.raw_post(key=b'"' + k1 + b'x"'), 400,
                              "invalid_idempotency_key")

    # -- Authorization
    def test_nul_in_bearer_key_is_unauthorized(self):
        good = b"Bearer " + self.m.api_key.encode()
        for bad in (good + b"\x00junk", good + b"\x00", good[:-2] + b"\x00" + good[-2:]):
            with self.subTest(bad=bad):
                st, head, body, _ = self.raw_post(key=uid("a").encode(), auth=bad)
                self.assertEqual(st, 401, body)
                self.assertIn(b"www-authenticate: bearer", head.lower())

    # -- query and path
    def test_nul_in_decoded_query_value(self):
        order = uid("SMOKE")
        st, _h, _b, _ = self.raw_post(key=uid("q").encode(), body=self.body(order=order))
        self.assertEqual(st, 201)
        ok = self.m.get("/v1/payments?merchant_order_no=" + order)
        self.assertStatus(ok, 200)
        r = self.m.get("/v1/payments?merchant_order_no=%s%%00x" % order)
        self.assertProblem(r, 400, "invalid_request")
        r = self.m.get("/v1/payments?merchant_order_no=%s%%00" % order)
        self.assertProblem(r, 400, "invalid_request")

    def test_nul_in_path(self):
        p = self.m.create_payment(self.ch.name)
        auth = b"Authorization: Bearer " + self.m.api_key.encode() + b"\r\n"
        for path in (b"/v1/payments/" + p["id"].encode() + b"\x00x",
                     b"/v1/payments/" + p["id"].encode() + b"%00x",
                     b"/healthz\x00", b"/healthz%00"):
            with self.subTest(path=path):
                res = exchange(self.server.port, b"GET " + path + b" HTTP/1.1\r\n"
                               b"Host: x\r\n" + auth + b"Connection: close\r\n\r\n")
                self.assertRawProblem(res, 400)

    # -- header framing
    def test_duplicate_content_length(self):
        body = self.body()
        for cls in ((b"%d" % len(body), b"%d" % (len(body) - 5)),
                    (b"%d" % len(body), b"%d" % len(body))):
            with self.subTest(cls=cls):
                k = uid("cl")
                extra = b"Content-Length: " + cls[1] + b"\r\n"
                res = self.raw_post(key=k.encode(), body=body, extra=extra)
                self.assertRawProblem(res, 400, "invalid_request")
                self.assertNoRecord(self.m, "payment", k)

    def test_content_length_with_transfer_encoding(self):
        body = self.body()
        k = uid("te")
        req = (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
               + self.m.api_key.encode() + b"\r\nIdempotency-Key: " + k.encode()
               + b"\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % len(body)
               + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n")
        self.assertRawProblem(exchange(self.server.port, req), 400, "invalid_request")
        self.assertNoRecord(self.m, "payment", k)

    def test_space_before_colon(self):
        for extra in (b"X-Thing : 1\r\n", b"Idempotency-Key : abc\r\n", b"X-Thing\t: 1\r\n"):
            with self.subTest(extra=extra):
                res = exchange(self.server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
                               + extra + b"Connection: close\r\n\r\n")
                self.assertRawProblem(res, 400, "invalid_request")

    def test_http11_without_host(self):
        res = exchange(self.server.port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
        self.assertRawProblem(res, 400, "invalid_request")
        res = exchange(self.server.port, b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n"
                       b"Connection: close\r\n\r\n")
        self.assertRawProblem(res, 400, "invalid_request")
        # HTTP/1.0 needs none
        st, _h, _b, _ = exchange(self.server.port, b"GET /healthz HTTP/1.0\r\n\r\n")
        self.assertEqual(st, 200)

    # -- inputs that used to hang
    def test_tls_client_hello_is_not_left_hanging(self):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        hello = outgoing.read()
        self.assertTrue(hello.startswith(b"\x16\x03"))
        t0 = time.monotonic()
        res = exchange(self.server.port, hello)
        self.assertAnsweredOrClosed(res, (400,))
        self.assertLess(time.monotonic() - t0, HANG_BOUND)

    def test_unknown_transfer_codings(self):
        for te in (b"gzip, chunked", b"identity", b"chunked, gzip", b"gzip", b"chunked, chunked"):
            with self.subTest(te=te):
                k = uid("te")
                req = (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                       + self.m.api_key.encode() + b"\r\nIdempotency-Key: " + k.encode()
                       + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: " + te
                       + b"\r\n\r\n" + b"5\r\nhello\r\n")
                res = exchange(self.server.port, req)
                self.assertAnsweredOrClosed(res, (400, 501))
                if res[0] is not None:
                    self.assertRawProblem(res, res[0])
                self.assertNoRecord(self.m, "payment", k)

    def test_many_query_parameters(self):
        qs = "&".join("p%d=%d" % (i, i) for i in range(5000))
        req = ("GET /v1/balance?%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
               "Connection: close\r\n\r\n" % (qs, self.m.api_key)).encode()
        t0 = time.monotonic()
        res = exchange(self.server.port, req)
        self.assertAnsweredOrClosed(res, (400, 414, 431))
        if res[0] is not None:
            self.assertRawProblem(res, res[0])
        self.assertLess(time.monotonic() - t0, HANG_BOUND)
        # and the server is fine afterwards
        self.assertStatus(self.server.request("GET", "/healthz"), 200)

    def test_healthz_after_everything(self):
        self.assertStatus(self.server.request("GET", "/healthz"), 200)


if __name__ == "__main__":
    harness.main()
