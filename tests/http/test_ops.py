"""Operations: /healthz, /metrics, routing (404, 405 with Allow), request
logs (one line per request, JSON format, never a secret), --help."""

import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import uid  # noqa: E402

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text):
    """Prometheus text format -> {name: [(labels dict, float)]}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise AssertionError("not a Prometheus sample line: %r" % line)
        labels = dict(LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


class Ops(harness.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ch = cls.server.new_channel()

    def metrics(self):
        r = self.server.request("GET", "/metrics")
        self.assertStatus(r, 200)
        self.assertTrue((r.header("Content-Type") or "").startswith("text/plain"), r)
        return r.body.decode(), parse_metrics(r.body.decode())

    def test_healthz(self):
        r = self.server.request("GET", "/healthz")
        self.assertStatus(r, 200)
        d = r.json()
        self.assertEqual(d["status"], "ok")
        if harness.sqlite_path(self.server.db_url):
            self.assertEqual(d["store"], "sqlite")
        else:
            self.assertIn(d["store"], ("postgresql", "postgres", "mariadb", "mysql"))

    def test_metrics_names(self):
        text, ms = self.metrics()
        for name in ("idem_requests_total", "idem_duplicate_ratio",
                     "idem_request_duration_seconds", "idem_store_errors_total",
                     "idem_records_purged_total"):
            self.assertRegex(text, r"(?m)^(# TYPE )?%s" % name, name)
        self.assertIn("idem_duplicate_ratio", ms)
        self.assertIn("idem_records_purged_total", ms)
        self.assertRegex(text, r"(?m)^# TYPE idem_request_duration_seconds histogram$")
        self.assertRegex(text, r"(?m)^# TYPE idem_requests_total counter$")

    def test_metrics_count_first_and_replay(self):
        m = self.merchant()
        _, before = self.metrics()
        body = m.payment_body(10, "CNY", self.ch.name)
        self.assertFirst(m.post("/v1/payments", body))
        self.assertTrue(m.post("/v1/payments", body).replayed)
        _, after = self.metrics()

        def payment_series(ms):
            return {tuple(sorted(lb.items())): v for lb, v in ms.get("idem_requests_total", [])
                    if lb.get("business_type") == "payment"}
        b, a = payment_series(before), payment_series(after)
        self.assertTrue(a, "no idem_requests_total{business_type=\"payment\"} series")
        for lb in a:
            self.assertIn("outcome", dict(lb))
        deltas = {dict(k)["outcome"]: v - b.get(k, 0) for k, v in a.items() if v != b.get(k, 0)}
        self.assertEqual(sum(deltas.values()), 2, deltas)
        self.assertEqual(len(deltas), 2, "first and replay are different outcomes: %r" % deltas)

        ratio = after["idem_duplicate_ratio"]
        for _lb, v in ratio:
            self.assertGreaterEqual(v, 0.0)
            self.assertLessEqual(v, 1.0)
        self.assertGreater(max(v for _lb, v in ratio), 0.0, "a replay just happened")

        def hist(ms, suffix):
            return sum(v for _lb, v in ms.get("idem_request_duration_seconds" + suffix, []))
        self.assertGreaterEqual(hist(after, "_count") - hist(before, "_count"), 2)
        self.assertGreaterEqual(hist(after, "_sum"), hist(before, "_sum"))
        buckets = after.get("idem_request_duration_seconds_bucket", [])
        self.assertTrue(any(lb.get("le") == "+Inf" for lb, _v in buckets), buckets)
        # cumulative buckets: counts never decrease with le (per label set)
        series = {}
        for lb, v in buckets:
            key = tuple(sorted((k, x) for k, x in lb.items() if k != "le"))
            series.setdefault(key, []).append((float(lb["le"]), v))
        for key, pts in series.items():
            vals = [v for _le, v in sorted(pts)]
            self.assertEqual(vals, sorted(vals), key)

    def test_unknown_routes_404(self):
        m = self.merchant()
        for method, path in (("GET", "/v1/nope"), ("POST", "/v1/nope"), ("GET", "/"),
                             ("GET", "/v2/payments"), ("GET", "/v1/payments/x/y"),
                             ("GET", "/v1/idempotency-records/payment")):
            with self.subTest(method=method, path=path):
                r = self.server.request(method, path, b"{}" if method == "POST" else None,
                                        m.headers())
                self.assertProblem(r, 404, "not_found")
        # the route is checked before auth
        self.assertProblem(self.server.request("GET", "/v1/nope"), 404, "not_found")

    def test_405_with_allow(self):
        cases = [
            ("DELETE", "/v1/payments", "POST"),
            ("PUT", "/v1/payments/pay_x", "GET"),
            ("POST", "/v1/payments/pay_x", "GET"),
            ("GET", "/v1/refunds", "POST"),
            ("GET", "/v1/transfers", "POST"),
            ("POST", "/v1/balance", "GET"),
            ("GET", "/v1/notifications/" + self.ch.name, "POST"),
            ("POST", "/healthz", "GET"),
            ("POST", "/metrics", "GET"),
            ("DELETE", "/v1/idempotency-records/payment/k", "GET"),
        ]
        for method, path, allowed in cases:
            with self.subTest(method=method, path=path):
                # no credentials: route and method come first
                r = self.server.request(method, path, b"{}" if method in ("POST", "PUT") else None,
                                        {"Content-Type": "application/json"})
                self.assertProblem(r, 405, "method_not_allowed")
                allow = [x.strip() for x in (r.header("Allow") or "").split(",")]
                self.assertIn(allowed, allow, r)
                self.assertNotIn(method, allow, r)

    def test_one_log_line_per_request_without_secrets(self):
        m = self.merchant()
        p = m.create_payment(self.ch.name)
        ids = [m.get("/v1/payments/" + p["id"]).header("X-Request-Id") for _ in range(3)]
        nid = self.ch.notify(p["id"], p["amount"]).header("X-Request-Id")
        self.server.wait_log(lambda t: all(i in t for i in ids + [nid]))
        time.sleep(0.2)   # a fourth line, if any, would be there by now
        log = self.server.log_text()
        for i in ids:
            lines = [ln for ln in log.splitlines() if i in ln]
            self.assertEqual(len(lines), 1, "one line per request:\n" + "\n".join(lines))
            self.assertIn("GET /v1/payments/{id} 200", lines[0])
        self.assertIn("POST /v1/notifications/{channel} 200", log)
        # the route template, never the path: no id, no channel, no key
        self.assertNotIn(p["id"], log)
        self.assertNotIn(self.ch.name, log)
        self.assertNotIn(m.api_key, log)
        self.assertNotIn(self.ch.secret, log)

    def test_help(self):
        p = subprocess.run([harness.idemd_path(), "--help"], capture_output=True, timeout=10)
        self.assertEqual(p.returncode, 0)
        out = (p.stdout + p.stderr).decode()
        for flag in ("--listen", "--db", "--threads", "--idempotency-ttl", "--log-format"):
            self.assertIn(flag, out)


class DuplicateWarning(harness.TestCase):

    def test_warning_above_5_percent(self):
        # issue 3 / DESIGN.md §8: a logged warning when the duplicate ratio
        # over the sliding window passes 5 % (here: half the claims replay)
        ch = self.server.new_channel()
        m = self.server.new_merchant()
        self.assertNotRegex(self.server.log_text().lower(), r"warn.*duplicate")
        for _ in range(30):
            body = m.payment_body(10, "CNY", ch.name)
            self.assertFirst(m.post("/v1/payments", body))
            self.assertTrue(m.post("/v1/payments", body).replayed)
        log = self.server.wait_log(lambda t: re.search(r"(?i)warn.*duplicate", t) is not None)
        lines = [ln for ln in log.splitlines()
                 if "warn" in ln.lower() and "duplicate" in ln.lower()]
        self.assertTrue(lines, "no duplicate-ratio warning in the log:\n"
                        + self.server.log_tail(5))


class JsonLogs(harness.TestCase):
    SERVER_ARGS = ("--log-format", "json")

    def test_json_log_lines(self):
        ch = self.server.new_channel()
        m = self.server.new_merchant()
        p = m.create_payment(ch.name)
        ids = [m.get("/v1/payments/" + p["id"]).header("X-Request-Id"),
               m.get("/v1/payments/" + p["id"] + "x").header("X-Request-Id")]   # a 404
        self.server.wait_log(lambda t: all(i in t for i in ids))
        time.sleep(0.2)
        log = self.server.log_text()
        mine = [ln for ln in log.splitlines() if any(i in ln for i in ids)]
        self.assertEqual(len(mine), 2, log[-2000:])
        statuses = []
        for ln in mine:
            d = json.loads(ln)
            self.assertIsInstance(d, dict)
            self.assertEqual(d["method"], "GET")
            self.assertEqual(d["path"], "/v1/payments/{id}")
            statuses.append(d["status"])
        self.assertEqual(sorted(statuses), [200, 404], mine)
        self.assertNotIn(p["id"], log)
        self.assertNotIn(m.api_key, log)
        self.assertNotIn(ch.secret, log)

if __name__ == "__main__":
    harness.main()
