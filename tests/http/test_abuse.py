"""An HTTP abuse suite over raw sockets (issue 13): malformed request lines,
headers, Content-Length / Transfer-Encoding conflicts, bad chunking, NUL
bytes, huge heads, hostile JSON, pipelining, non-HTTP bytes. Every case must
be answered with a 4xx (or 501/505 where HTTP says so) or have its
connection closed: never a 2xx, a 500 or a hang; idemd must not crash, and
/healthz answers 200 afterwards. The server runs with --request-timeout 3,
so a case that leaves a request unfinished is closed within seconds."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402
from test_framing import exchange  # noqa: E402

BOUND = 10.0
ALLOWED = set(range(400, 500)) | {501, 505}


def statuses(port, data, timeout=BOUND):
    """Every status line the server sent back for data, and whether it closed."""
    import socket
    s = socket.create_connection((harness.HOST, port), timeout=timeout)
    got, closed = b"", False
    deadline = time.monotonic() + timeout
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        while time.monotonic() < deadline:
            s.settimeout(max(0.05, min(0.5, deadline - time.monotonic())))
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                if got:
                    break
                continue
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += chunk
    finally:
        s.close()
    out = []
    while got.startswith(b"HTTP/1."):
        head, sep, rest = got.partition(b"\r\n\r\n")
        if not sep:
            break
        out.append(int(head.split(b" ", 2)[1]))
        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        got = rest[int(m.group(1)) if m else 0:]
    return out, closed


class Abuse(harness.TestCase):
    SERVER_ARGS = ("--request-timeout", "3", "--connection-timeout", "60")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()
        cls.m = cls.server.new_merchant()

    def post(self, body, extra=b"", key=True):
        k = (b"Idempotency-Key: " + uid("ab").encode() + b"\r\n") if key else b""
        return (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + self.m.api_key.encode() + b"\r\nContent-Type: application/json\r\n" + k
                + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def chunked(self, chunks):
        return (b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + self.m.api_key.encode() + b"\r\nContent-Type: application/json\r\n"
                b"Idempotency-Key: " + uid("ab").encode()
                + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)

    def get(self, line=b"GET /healthz HTTP/1.1", headers=b"Host: x\r\n"):
        return line + b"\r\n" + headers + b"\r\n"

    def cases(self):
        good = harness.dumps(self.m.payment_body(100, "CNY", self.ch.name))
        order = uid("ORD")
        big_num = good.replace(b'"amount":100', b'"amount":1e400')
        auth = b"Authorization: Bearer " + self.m.api_key.encode() + b"\r\n"
        return {
            # request line
            "empty lines only": b"\r\n\r\n",
            "method only": b"GET\r\n\r\n",
            "no version": b"GET /healthz\r\nHost: x\r\n\r\n",
            "trailing junk after version": self.get(b"GET /healthz HTTP/1.1 extra"),
            "leading space": self.get(b" GET /healthz HTTP/1.1"),
            "tabs as separators": self.get(b"GET\t/healthz\tHTTP/1.1"),
            "two spaces": self.get(b"GET  /healthz HTTP/1.1"),
            "version 9.9": self.get(b"GET /healthz HTTP/9.9"),
            "version 1": self.get(b"GET /healthz HTTP/1"),
            "lower-case version": self.get(b"GET /healthz http/1.1"),
            "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "unknown method": self.get(b"BREW /healthz HTTP/1.1"),
            "method with NUL": self.get(b"GE\x00T /healthz HTTP/1.1"),
            "method with ESC": self.get(b"G\x1bET /healthz HTTP/1.1"),
            "10 KB method": self.get(b"G" * 10240 + b" /healthz HTTP/1.1"),
            "asterisk target": self.get(b"GET * HTTP/1.1"),
            "CONNECT": self.get(b"CONNECT x:443 HTTP/1.1"),
            "space in target": self.get(b"GET /health z HTTP/1.1"),
            "raw NUL in target": self.get(b"GET /healthz\x00 HTTP/1.1"),
            "%00 in target": self.get(b"GET /v1/payments?merchant_order_no=" + order.encode()
                                      + b"%00 HTTP/1.1", b"Host: x\r\n" + auth),
            "8-bit byte in target": self.get(b"GET /healthz\xff HTTP/1.1"),
            "5,000 query parameters": self.get(
                b"GET /v1/balance?" + b"&".join(b"p%d=1" % i for i in range(5000))
                + b" HTTP/1.1", b"Host: x\r\n" + auth),
            "100 KB target": self.get(b"GET /" + b"a" * 100000 + b" HTTP/1.1"),
            # header section
            "header without colon": self.get(headers=b"Host: x\r\nNoColon\r\n"),
            "empty header name": self.get(headers=b"Host: x\r\n: value\r\n"),
            "space before colon": self.get(headers=b"Host: x\r\nX-A : 1\r\n"),
            "obs-fold": self.get(headers=b"Host: x\r\nX-A: 1\r\n 2\r\n"),
            "NUL in header name": self.get(headers=b"Host: x\r\nX-\x00A: 1\r\n"),
            "NUL in header value": self.get(headers=b"Host: x\r\nX-A: 1\x002\r\n"),
            "CR in header value": self.get(headers=b"Host: x\r\nX-A: 1\r2\r\n"),
            "70 KB header": self.get(headers=b"Host: x\r\nX-A: " + b"a" * 70000 + b"\r\n"),
            "300 header fields": self.get(
                headers=b"Host: x\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300))),
            "HTTP/1.1 without Host": self.get(headers=b""),
            "two Host headers": self.get(headers=b"Host: a\r\nHost: b\r\n"),
            "NUL in Host": self.get(headers=b"Host: a\x00b\r\n"),
            "NUL in Authorization": self.get(b"GET /v1/balance HTTP/1.1", b"Host: x\r\n"
                                             + auth[:-2] + b"\x00x\r\n"),
            "two Authorization": self.get(b"GET /v1/balance HTTP/1.1",
                                          b"Host: x\r\n" + auth + auth),
            # Content-Length / Transfer-Encoding
            "negative Content-Length": self.post(good)[:-len(good)].replace(
                b"Content-Length: %d" % len(good), b"Content-Length: -1") + good,
            "Content-Length 1e3": self.post(good).replace(b"Content-Length: %d" % len(good),
                                                         b"Content-Length: 1e3"),
            "Content-Length with junk": self.post(good).replace(
                b"Content-Length: %d" % len(good), b"Content-Length: %dabc" % len(good)),
            "Content-Length 2^70": self.post(good).replace(b"Content-Length: %d" % len(good),
                                                          b"Content-Length: %d" % (1 << 70)),
            "two Content-Length": self.post(good, b"Content-Length: 5\r\n"),
            "Content-Length and chunked": self.post(good, b"Transfer-Encoding: chunked\r\n"),
            "two Transfer-Encoding": self.chunked(b"0\r\n\r\n").replace(
                b"Transfer-Encoding: chunked\r\n",
                b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"),
            "gzip, chunked": self.chunked(b"0\r\n\r\n").replace(b"Encoding: chunked",
                                                                 b"Encoding: gzip, chunked"),
            "chunked, identity": self.chunked(b"0\r\n\r\n").replace(
                b"Encoding: chunked", b"Encoding: chunked, identity"),
            "identity": self.chunked(b"hello").replace(b"Encoding: chunked",
                                                      b"Encoding: identity"),
            "xchunked": self.chunked(b"0\r\n\r\n").replace(b"Encoding: chunked",
                                                            b"Encoding: xchunked"),
            "9 MiB declared": self.post(b"{}").replace(b"Content-Length: 2",
                                                       b"Content-Length: %d" % (9 << 20)),
            "body shorter than Content-Length": self.post(good)[:-10],
            # chunked framing
            "chunk size zz": self.chunked(b"zz\r\nhello\r\n0\r\n\r\n"),
            "chunk size overflow": self.chunked(b"ffffffffffffffffffffff\r\nhello\r\n"),
            "negative chunk size": self.chunked(b"-5\r\nhello\r\n0\r\n\r\n"),
            "chunk without CRLF": self.chunked(b"5\r\nhelloXX0\r\n\r\n"),
            "chunk extension with NUL": self.chunked(b"2;\x00\r\n{}\r\n0\r\n\r\n"),
            "no last chunk": self.chunked(b"2\r\n{}\r\n"),
            "chunked body over 8 MiB": self.chunked(
                b"".join([b"100000\r\n" + b"x" * 0x100000 + b"\r\n"] * 9) + b"0\r\n\r\n"),
            # NUL and bytes
            "NUL in Idempotency-Key": self.post(good, b"Idempotency-Key: a\x00b\r\n", key=False),
            "8-bit Idempotency-Key": self.post(good, b"Idempotency-Key: a\xffb\r\n", key=False),
            "NUL in body": self.post(good[:-1] + b',"description":"a\x00b"}'),
            # hostile JSON
            "deep JSON": self.post(b'{"metadata":' + b"[" * 100000 + b"]" * 100000 + b"}"),
            "duplicate JSON keys": self.post(good[:-1] + b',"amount":1}'),
            "1e400": self.post(big_num),
            "bad UTF-8 in JSON": self.post(good[:-1] + b',"description":"\xff\xfe"}'),
            "lone surrogate": self.post(good[:-1] + b',"description":"\\ud800"}'),
            "JSON array": self.post(b"[" + good + b"]"),
            # not HTTP at all
            "binary without LF": bytes(range(0x80, 0x100)) * 4,
            "binary with LF": bytes(range(1, 256)),
        }

    def test_every_case_is_refused_or_closed(self):
        bad = []
        for name, data in self.cases().items():
            t0 = time.monotonic()
            st, closed = statuses(self.server.port, data)
            took = time.monotonic() - t0
            first = st[0] if st else None
            if self.server.proc.poll() is not None:
                self.fail("idemd died on %r:\n%s" % (name, self.server.log_tail()))
            if first is None and not closed:
                bad.append("%s: neither answered nor closed in %.1f s" % (name, took))
            elif first is not None and first not in ALLOWED:
                bad.append("%s: answered %d" % (name, first))
        self.assertFalse(bad, "\n".join(bad))
        self.assertGreaterEqual(len(self.cases()), 40)
        self.assertStatus(self.server.request("GET", "/healthz"), 200)

    def test_pipelining(self):
        ok = self.get(headers=b"Host: x\r\n")
        st, _ = statuses(self.server.port, ok * 20)
        self.assertEqual(st, [200] * 20)
        # a malformed request after good ones: the good ones are answered,
        # the bad one refused, nothing after it is read
        st, closed = statuses(self.server.port, ok + ok + self.get(headers=b"Host: x\r\nX-A : 1\r\n")
                              + ok)
        self.assertEqual(st[:3], [200, 200, 400], st)
        self.assertEqual(len(st), 3, st)
        self.assertTrue(closed)
        # smuggling attempt: a second request hidden behind a duplicate Content-Length
        smuggled = self.get(b"GET /v1/balance HTTP/1.1", b"Host: x\r\n")
        body = b"x" * 5
        req = (b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: %d\r\n\r\n"
               % (len(body) + len(smuggled)) + body + smuggled)
        st, _ = statuses(self.server.port, req)
        self.assertEqual(st, [400], st)
        self.assertStatus(self.server.request("GET", "/healthz"), 200)


if __name__ == "__main__":
    harness.main()
