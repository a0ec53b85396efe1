"""idemctl, black box: every command's happy path and bad input, on the
backend IDEM_TEST_URL names (SQLite by default; postgres / mariadb use the
servers scripts/run-tests.sh starts, and exit 77 = skipped without them).

Each test gets its own empty database from cli_testdb (tests/support's
test_db_url), real idemd processes where traffic is needed (the HTTP tests'
harness), and runs idemctl as an operator would. Python 3 stdlib only.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "http"))

import harness  # noqa: E402  (tests/http/harness.py: idemd processes, actors)
from harness import uid  # noqa: E402

TESTDB = os.environ.get("CLI_TESTDB")


def new_db():
    p = subprocess.run([TESTDB, "create"], capture_output=True, timeout=60)
    if p.returncode == 77:
        # sys.exit() here would be a SystemExit inside setUp, which unittest
        # reports as an ERROR; __main__ probes the backend first instead.
        raise unittest.SkipTest(p.stderr.decode(errors="replace").strip())
    if p.returncode != 0:
        raise RuntimeError("cli_testdb create: %s" % p.stderr.decode(errors="replace"))
    return p.stdout.decode().strip()


def drop_db(url):
    subprocess.run([TESTDB, "drop", url], capture_output=True, timeout=60)


class Result:
    def __init__(self, p):
        self.rc = p.returncode
        self.out = p.stdout.decode(errors="replace")
        self.err = p.stderr.decode(errors="replace")

    def json(self):
        return json.loads(self.out)

    def __repr__(self):
        return "rc=%d\n--- stdout ---\n%s--- stderr ---\n%s" % (self.rc, self.out, self.err)


class CliTest(unittest.TestCase):
    maxDiff = 8000

    def setUp(self):
        self.db = new_db()
        self.tmp = tempfile.mkdtemp(prefix="idem-cli-")
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            if s.proc is not None and s.proc.poll() is None:
                s.stop()
            s.cleanup()
        drop_db(self.db)

    # -- helpers
    def ctl(self, *args, env=None, stdin=None, db=True, timeout=120):
        argv = [harness.idemctl_path()]
        if db:
            argv += ["--db", self.db]
        argv += list(args)
        e = dict(os.environ)
        e.pop("IDEM_DB", None)
        e.update(env or {})
        return Result(subprocess.run(argv, capture_output=True, env=e, timeout=timeout,
                                     input=stdin))

    def ok(self, *args, **kw):
        r = self.ctl(*args, **kw)
        self.assertEqual(r.rc, 0, r)
        return r

    def bad(self, rc, *args, **kw):
        """A failing command: exit code rc and exactly one line on stderr."""
        r = self.ctl(*args, **kw)
        self.assertEqual(r.rc, rc, r)
        lines = r.err.strip().splitlines()
        self.assertEqual(len(lines), 1, r)
        self.assertTrue(lines[0].startswith("idemctl: "), r)
        return r

    def server(self, *args):
        s = harness.Server(list(args), db_url=self.db, tmpdir=tempfile.mkdtemp(dir=self.tmp))
        self.servers.append(s)
        s.start()
        return s

    def merchant(self, srv):
        return srv.new_merchant()


class TestGeneral(CliTest):
    def test_help_lists_every_command_and_exit_codes(self):
        r = self.ok("--help", db=False)
        for cmd in ("migrate", "merchant add", "merchant list", "merchant rotate-key",
                    "channel add", "channel list", "channel rotate-secret", "purge", "stats",
                    "inspect", "recon import"):
            self.assertIn(cmd, r.out)
        self.assertIn("0 success, 1 failure", r.out)
        self.assertIn("2 bad usage, 3 a check failed", r.out)

    def test_every_command_has_help_with_an_example(self):
        for cmd in (["migrate"], ["merchant", "add"], ["merchant", "list"],
                    ["merchant", "rotate-key"], ["channel", "add"], ["channel", "list"],
                    ["channel", "rotate-secret"], ["purge"], ["stats"], ["inspect"],
                    ["recon", "import"], ["demo"]):
            r = self.ok(*cmd, "--help", db=False)
            self.assertTrue(r.out.startswith("usage: idemctl"), r)
            self.assertIn("example:\n  idemctl", r.out)
            self.assertIn("exit codes:", r.out)

    def test_every_command_and_group_answers_help(self):
        # The command list comes from idemctl itself, so a new command or
        # group is covered without editing this test.
        top = self.ok("--help", db=False).out
        names = [l.strip().split("  ")[0] for l in
                 top.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()]
        self.assertIn("merchant add", names)
        groups = sorted({n.split(" ")[0] for n in names if " " in n})
        self.assertEqual(groups, ["channel", "merchant", "recon"])
        for g in groups:
            for argv in ([g, "--help"], [g, "-h"]):
                r = self.ok(*argv, db=False)
                self.assertTrue(r.out.startswith("usage: idemctl"), r)
                self.assertIn("exit codes:", r.out)
                for n in names:
                    if n.startswith(g + " "):
                        self.assertIn(n.split(" ", 1)[1], r.out)
        for n in names:
            r = self.ok(*n.split(" "), "--help", db=False)
            self.assertTrue(r.out.startswith("usage: idemctl"), r)
        self.bad(2, "merchant", "frob", "--help", db=False)
        self.bad(2, "frob", "--help", db=False)

    def test_usage_errors(self):
        self.bad(2, "frobnicate")
        self.bad(2, "merchant")
        self.bad(2, "merchant", "delete", "x")
        self.bad(2, "--bogus", "stats")
        r = self.ctl("stats", db=False)
        self.assertEqual(r.rc, 2, r)
        self.assertIn("IDEM_DB", r.err)

    def test_db_from_environment(self):
        r = self.ctl("migrate", "--json", db=False, env={"IDEM_DB": self.db})
        self.assertEqual(r.rc, 0, r)
        self.assertTrue(r.json()["up_to_date"])

    def test_unreachable_store_is_a_failure(self):
        self.bad(1, "merchant", "list", db=False,
                 env={"IDEM_DB": "sqlite:/nonexistent-dir/x/y.db"})
        self.bad(1, "--db", "nosuch://x", "merchant", "list", db=False)


class TestMigrate(CliTest):
    def test_status_apply_status(self):
        r = self.ctl("migrate", "--status", "--json")
        self.assertEqual(r.rc, 3, r)  # pending: a check failed
        d = r.json()
        self.assertEqual(d["schema_version"], 0)
        latest = d["latest"]
        self.assertGreaterEqual(latest, 3)
        self.assertFalse(d["up_to_date"])
        d = self.ok("migrate", "--json").json()
        self.assertEqual(d, {"backend": d["backend"], "schema_version": latest,
                             "latest": latest, "applied": latest, "up_to_date": True})
        d = self.ok("migrate", "--json").json()
        self.assertEqual(d["applied"], 0)
        r = self.ok("migrate", "--status")
        self.assertIn("schema version %d of %d" % (latest, latest), r.out)
        self.bad(2, "migrate", "--force")


class TestCredentials(CliTest):
    def test_merchant_add_list_rotate(self):
        self.ok("migrate")
        a = self.ok("merchant", "add", "Acme Shop", "--json").json()
        self.assertTrue(a["merchant_id"].startswith("m_"))
        self.assertTrue(a["api_key"].startswith("sk_"))
        r = self.ok("merchant", "add", "Second")
        self.assertIn("api key: sk_", r.out)
        d = self.ok("merchant", "list", "--json").json()
        names = {m["merchant_id"]: m["name"] for m in d["merchants"]}
        self.assertEqual(names[a["merchant_id"]], "Acme Shop")
        self.assertEqual(len(names), 2)
        self.assertNotIn(a["api_key"], json.dumps(d))
        text = self.ok("merchant", "list").out
        self.assertIn(a["merchant_id"], text)
        self.assertIn("2 merchants", text)
        self.assertNotIn("sk_", text)

        before = self.server()
        old = harness.Merchant(before, a["merchant_id"], a["api_key"])
        self.assertEqual(old.get("/v1/balance").status, 200)
        before.stop_checked()  # idemd may cache a verified key for seconds
        n = self.ok("merchant", "rotate-key", a["merchant_id"], "--json").json()
        self.assertEqual(n["merchant_id"], a["merchant_id"])
        self.assertNotEqual(n["api_key"], a["api_key"])
        srv = self.server()
        old = old.on(srv)
        new = harness.Merchant(srv, a["merchant_id"], n["api_key"])
        self.assertEqual(new.get("/v1/balance").status, 200)
        self.assertEqual(old.get("/v1/balance").status, 401)

    def test_merchant_bad_input(self):
        self.bad(2, "merchant", "add")
        self.bad(2, "merchant", "add", "a", "b")
        self.bad(1, "merchant", "add", "")
        self.bad(1, "merchant", "add", "x" * 101)
        self.bad(2, "merchant", "rotate-key")
        self.bad(1, "merchant", "rotate-key", "m_doesnotexist")
        self.bad(2, "merchant", "list", "extra")

    def sql(self, verb, statement, *params):
        """cli_testdb exec|query on this test's database (params: bytes as given)."""
        p = subprocess.run([TESTDB, verb, self.db, statement] + list(params),
                           capture_output=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
        return p.stdout

    def test_merchant_bad_name_is_refused_before_any_write(self):
        # Issue 16: a name jansson could not encode was committed, then
        # "out of memory" hid its one-time key.
        self.ok("migrate")
        for name in (b"bad\xffname", b"a\x1bb", b"a\nb", b"tab\there", b"del\x7f",
                     b"\xc0\xaf", b"\xed\xa0\x80", b"nel\xc2\x85", b"\xf4\x90\x80\x80",
                     b"cut\xe4\xb8", "é".encode() * 51):
            r = self.bad(1, "merchant", "add", name, "--json")
            self.assertIn("UTF-8", r.err, r)
            self.assertEqual(r.out, "", r)
            r = self.bad(1, "merchant", "add", name)
            self.assertNotIn("sk_", r.out + r.err, r)
        self.assertEqual(self.ok("merchant", "list", "--json").json()["merchants"], [])
        self.assertEqual(self.sql("query", "SELECT count(*) FROM merchants").strip(), b"0")
        # Well-formed UTF-8 up to 100 bytes is fine, and round-trips.
        for name in ("Café 北京 🙂", "é" * 50):
            a = self.ok("merchant", "add", name, "--json").json()
            self.assertEqual(a["name"], name)
            self.assertTrue(a["api_key"].startswith("sk_"))
        names = [m["name"] for m in self.ok("merchant", "list", "--json").json()["merchants"]]
        self.assertEqual(sorted(names), sorted(["Café 北京 🙂", "é" * 50]))

    def test_merchant_list_survives_a_bad_stored_name(self):
        # A database written before names were checked may hold any bytes:
        # one such row must not make the whole list fail, nor put raw
        # escapes on the operator's terminal.
        self.ok("migrate")
        good = self.ok("merchant", "add", "Good", "--json").json()
        bad = b"esc\x1b[31m\x07"
        if self.db.startswith("sqlite:"):
            bad += b"\xff\xfe"  # the servers refuse bytes that are not UTF-8
        self.sql("exec", "INSERT INTO merchants (id, name, key_id, key_digest, created_at)"
                 " VALUES ('m_old', ?, 'oldkeyid', 'olddigest', 1)", bad)
        d = self.ok("merchant", "list", "--json").json()
        names = {m["merchant_id"]: m["name"] for m in d["merchants"]}
        self.assertEqual(names[good["merchant_id"]], "Good")
        expect = "esc\\x1B[31m\\x07" + ("\\xFF\\xFE" if self.db.startswith("sqlite:") else "")
        self.assertEqual(names["m_old"], expect)
        r = self.ok("merchant", "list")
        self.assertIn("m_old", r.out)
        self.assertIn(expect, r.out)
        self.assertNotIn("\x1b", r.out)
        self.assertNotIn("\x07", r.out)
        self.assertIn("2 merchants", r.out)

    def test_channel_add_list_rotate(self):
        c = self.ok("channel", "add", "wx", "--json").json()
        self.assertEqual(c["channel"], "wx")
        self.assertEqual(len(c["secret"]), 64)
        d = self.ok("channel", "list", "--json").json()
        self.assertEqual([x["channel"] for x in d["channels"]], ["wx"])
        self.assertNotIn(c["secret"], self.ok("channel", "list").out)

        srv = self.server()
        old = harness.Channel(srv, "wx", c["secret"])
        # A valid signature for an unknown payment is a 404; a wrong one 401.
        self.assertEqual(old.notify("pay_nope", 100).status, 404)
        n = self.ok("channel", "rotate-secret", "wx", "--json").json()
        self.assertNotEqual(n["secret"], c["secret"])
        self.assertEqual(old.notify("pay_nope", 100).status, 401)
        self.assertEqual(harness.Channel(srv, "wx", n["secret"]).notify("pay_nope", 100).status,
                         404)

    def test_channel_secrets_sealed_on_every_backend(self):
        # --secret-key-file on this backend: the stored secret is sealed
        # ("v1:..." in the column, never the secret), idemd opens it, and a
        # plain secret written earlier is sealed by rekey.
        key = os.path.join(self.tmp, "secret.key")
        with open(key, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(key, 0o600)
        plain = self.ok("channel", "add", "old", "--json").json()["secret"]
        new = self.ok("--secret-key-file", key, "channel", "add", "wx", "--json").json()["secret"]
        stored = dict(line.split(" ", 1) for line in self.sql(
            "query", "SELECT name || ' ' || secret FROM channels"
            if not self.db.startswith("mysql") else
            "SELECT CONCAT(name, ' ', secret) FROM channels").decode().splitlines())
        self.assertEqual(stored["old"], plain)
        self.assertTrue(stored["wx"].startswith("v1:"), stored)
        self.assertNotIn(new, stored["wx"])
        srv = self.server("--secret-key-file", key)
        m = self.merchant(srv)
        for name, secret in (("wx", new), ("old", plain)):
            ch = harness.Channel(srv, name, secret)
            p = m.create_payment(name, 100)
            self.assertEqual(ch.notify(p["id"], 100).status, 200)
            self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        srv.stop_checked()
        self.assertEqual(self.ok("--secret-key-file", key, "channel", "rekey", "--json")
                         .json()["sealed"], 2)
        for line in self.sql("query", "SELECT secret FROM channels").decode().splitlines():
            self.assertTrue(line.startswith("v1:"), line)
        self.bad(1, "channel", "rotate-secret", "wx")       # no key: refused
        self.bad(2, "channel", "rekey")
        self.bad(2, "--secret-key-file", key, "channel", "rekey", "--bogus")

    def test_channel_bad_input(self):
        self.ok("channel", "add", "wx")
        self.bad(1, "channel", "add", "wx")          # exists
        self.bad(1, "channel", "add", "Bad Name")
        self.bad(2, "channel", "add")
        self.bad(1, "channel", "rotate-secret", "nosuch")
        self.bad(2, "channel", "rotate-secret")


class TestInspect(CliTest):
    def test_inspect_shows_the_stored_body(self):
        srv = self.server()
        m = self.merchant(srv)
        srv.new_channel("wx")
        key = uid("K")
        r = m.post("/v1/payments", m.payment_body(channel="wx", amount=1234), key=key)
        self.assertEqual(r.status, 201, r)
        d = self.ok("inspect", m.id, "payment", key, "--json").json()
        self.assertEqual(d["status"], "SUCCEEDED")
        self.assertEqual(d["http_status"], 201)
        self.assertEqual(d["body"], r.body.decode())  # byte for byte
        self.assertEqual(len(d["fingerprint"]), 64)
        self.assertIsNone(d["lease_until"])
        harness.parse_time(d["created_at"])
        harness.parse_time(d["expires_at"])
        text = self.ok("inspect", m.id, "payment", key).out
        self.assertIn("SUCCEEDED", text)
        self.assertIn(r.body.decode(), text)

    def test_inspect_bad_input(self):
        self.ok("migrate")
        self.bad(1, "inspect", "m_x", "payment", "nosuch")
        self.bad(2, "inspect", "m_x", "payment")
        self.bad(2, "inspect", "m_x", "payment", "bad key")


def stats_json(test, window="5m"):
    r = test.ctl("stats", "--window", window, "--json")
    test.assertIn(r.rc, (0, 3), r)
    return r, r.json()


class TestStats(CliTest):
    def drive(self, srv, m, firsts, replays):
        """firsts new payments, then replays of the first of them."""
        sent = []
        for _ in range(firsts):
            body = m.payment_body(channel="wx")
            key = uid("K")
            r = m.post("/v1/payments", body, key=key)
            self.assertEqual(r.status, 201, r)
            sent.append((body, key))
        for i in range(replays):
            body, key = sent[i % len(sent)]
            r = m.post("/v1/payments", body, key=key)
            self.assertEqual(r.status, 201, r)
            self.assertTrue(r.replayed, r)

    def wait_requests(self, n, timeout=25):
        deadline = time.monotonic() + timeout
        while True:
            r, d = stats_json(self)
            if d["requests"] >= n or time.monotonic() > deadline:
                return r, d
            time.sleep(0.5)

    def test_ratio_of_a_known_mix_over_two_instances(self):
        a = self.server()
        b = self.server()
        self.ok("channel", "add", "wx")
        ma = self.merchant(a)
        mb = ma.on(b)
        self.drive(a, ma, 30, 4)
        self.drive(b, mb, 10, 6)
        r, d = self.wait_requests(50)
        self.assertEqual(d["requests"], 50, r)
        self.assertEqual(d["duplicates"], 10)
        self.assertAlmostEqual(d["duplicate_ratio"], 0.2, places=9)
        self.assertEqual(d["instances"], 2)
        self.assertEqual(d["window_seconds"], 300)
        p = d["by_type"]["payment"]
        self.assertEqual((p["first"], p["replay"], p["in_progress"], p["mismatch"]),
                         (40, 10, 0, 0))
        self.assertEqual(p["records"]["succeeded"], 40)
        self.assertEqual(r.rc, 3, r)  # above 5 %
        self.assertIn("warning: duplicate ratio 20.00 %", r.err)
        text = self.ctl("stats")
        self.assertEqual(text.rc, 3, text)
        self.assertIn("duplicates 10 (20.00 %)", text.out)

    def test_below_threshold_and_final_flush_on_stop(self):
        a = self.server()
        self.ok("channel", "add", "wx")
        m = self.merchant(a)
        self.drive(a, m, 40, 2)
        a.stop_checked()  # SIGTERM flushes what the last interval had
        r, d = stats_json(self)
        self.assertEqual((d["requests"], d["duplicates"]), (42, 2), r)
        self.assertAlmostEqual(d["duplicate_ratio"], 2 / 42, places=9)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(r.err, "")
        # Outside the window nothing counts.
        time.sleep(1.2)
        r, d = stats_json(self, "1s")
        self.assertEqual(d["requests"], 0, r)

    def test_stats_bad_input(self):
        self.ok("migrate")
        self.bad(2, "stats", "--window", "abc")
        self.bad(2, "stats", "--window")
        self.bad(2, "stats", "--window", "-5m")
        self.bad(2, "stats", "--verbose")


class TestPurge(CliTest):
    def test_purge_under_concurrent_load_loses_no_live_record(self):
        # Expired records: made with a 1 s TTL, then left to expire.
        old = self.server("--idempotency-ttl", "1s")
        old.new_channel("wx")
        m = self.merchant(old)
        expired = []
        for _ in range(120):
            body = m.payment_body(channel="wx")
            key = uid("OLD")
            self.assertEqual(m.post("/v1/payments", body, key=key).status, 201)
            expired.append((body, key))
        old.stop_checked()
        time.sleep(1.5)
        d = self.ok("purge", "--dry-run", "--json").json()
        self.assertEqual(d, {"dry_run": True, "would_delete": 120})

        # Live traffic with the normal TTL while purge runs in small batches.
        srv = self.server()
        m = m.on(srv)
        live, errors = [], []
        lock = threading.Lock()

        def load(n):
            for _ in range(n):
                body = m.payment_body(channel="wx")
                key = uid("LIVE")
                r = m.post("/v1/payments", body, key=key)
                with lock:
                    (live if r.status == 201 else errors).append((body, key, r))

        threads = [threading.Thread(target=load, args=(40,)) for _ in range(6)]
        for t in threads:
            t.start()
        purged = 0
        deadline = time.monotonic() + 120
        while (any(t.is_alive() for t in threads) or purged < 120) and \
                time.monotonic() < deadline:
            d = self.ok("purge", "--batch", "7", "--json").json()
            purged += d["deleted"]
            self.assertLessEqual(purged, 120)
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(purged, 120)
        self.assertEqual(len(live), 240)
        # Every live record is there and replays its first answer.
        for body, key, first in live:
            r = m.post("/v1/payments", body, key=key)
            self.assertEqual((r.status, r.body), (201, first.body))
            self.assertTrue(r.replayed, r)
        # The expired records are gone; their payments (business rows) stay.
        for body, key in expired[:10]:
            self.assertEqual(m.record("payment", key).status, 404)
            self.assertEqual(self.ctl("inspect", m.id, "payment", key).rc, 1)
            r = m.get("/v1/payments?merchant_order_no=" + body["merchant_order_no"])
            self.assertEqual(r.status, 200, r)
        self.assertEqual(self.ok("purge", "--dry-run", "--json").json()["would_delete"], 0)

    def test_purge_spares_processing_records_under_a_live_lease(self):
        # Two-phase payments (slow mock channel) whose records expire (1 s)
        # long before their lease (30 s) and the channel's answer (15 s).
        srv = self.server("--idempotency-ttl", "1s", "--mock-channel-delay-ms", "15000")
        srv.ensure_channel("mock")
        # Two requests, from two merchants: a two-phase request holds an
        # idemd thread (and, on the server stores, a writer) while it waits.
        ms = [self.merchant(srv) for _ in range(2)]
        keys = [uid("P") for _ in ms]
        results = []

        def pay(m, key):
            body = m.payment_body(channel="mock")
            results.append((m, body, m.post("/v1/payments", body, key=key)))

        threads = [threading.Thread(target=pay, args=a) for a in zip(ms, keys)]
        for t in threads:
            t.start()
        # Wait until every record is committed PROCESSING and has expired.
        deadline = time.monotonic() + 10
        while True:
            recs = [self.ctl("inspect", m.id, "payment", k, "--json") for m, k in zip(ms, keys)]
            if all(r.rc == 0 for r in recs) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for r in recs:
            self.assertEqual(r.rc, 0, r)
            self.assertEqual(r.json()["status"], "PROCESSING", r)
        last_expiry = max(harness.parse_time(r.json()["expires_at"]) for r in recs)
        while harness.parse_time(
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())) <= last_expiry:
            time.sleep(0.2)
        time.sleep(1)
        self.assertEqual(self.ok("purge", "--dry-run", "--json").json()["would_delete"], 0)
        d = self.ok("purge", "--batch", "1", "--json").json()
        self.assertEqual(d["deleted"], 0)
        for m, k in zip(ms, keys):
            self.assertEqual(self.ok("inspect", m.id, "payment", k, "--json").json()["status"],
                             "PROCESSING")
        for t in threads:
            t.join()
        self.assertEqual(len(results), 2)
        for m, body, r in results:
            self.assertEqual(r.status, 201, r)
            got = m.get("/v1/payments?merchant_order_no=" + body["merchant_order_no"])
            self.assertEqual(got.status, 200, got)

    def test_purge_max_seconds_and_text(self):
        self.ok("migrate")
        r = self.ok("purge", "--max-seconds", "5")
        self.assertIn("purged 0 expired records", r.out)
        self.assertEqual(r.err, "")  # no progress line without a terminal

    def test_purge_bad_input(self):
        self.ok("migrate")
        self.bad(2, "purge", "--batch", "0")
        self.bad(2, "purge", "--batch", "100001")
        self.bad(2, "purge", "--batch", "12x")
        self.bad(2, "purge", "--batch")
        self.bad(2, "purge", "--max-seconds", "-1")
        self.bad(2, "purge", "now")


HEADER = b"channel_txn_id,merchant_id,merchant_order_no,amount,currency,status,paid_at"


class TestRecon(CliTest):
    def payments(self):
        """Local payments the file is compared with."""
        srv = self.server()
        ch = srv.new_channel("wx")
        m = self.merchant(srv)
        pays = {}
        for order, amount in (("ORD-1", 1000), ("ORD-2", 2000), ("ORD-3", 3000),
                              ("ORD-4", 1500)):
            pays[order] = m.create_payment("wx", amount, order=order)
        self.assertEqual(ch.notify(pays["ORD-1"]["id"], 1000).status, 200)
        self.assertEqual(ch.notify(pays["ORD-2"]["id"], 2000, status="FAILED").status, 200)
        self.assertEqual(ch.notify(pays["ORD-3"]["id"], 3000).status, 200)
        srv.stop_checked()
        return m.id, pays

    def fixture(self, mid):
        t = b"2026-10-01T10:00:00Z"
        lines = [
            b"\xef\xbb\xbf" + HEADER,                                          # 1
            b"T-1,%s,ORD-1,1000,CNY,SUCCESS,%s" % (mid, t),                    # 2 matched
            b'"T-2","%s","ORD-2","2000","CNY","FAILED","2026-10-01T18:01:00+08:00"' % mid,  # 3
            b"T-3,%s,ORD-3,3100,CNY,SUCCESS,%s" % (mid, t),                    # 4 amount
            b'"T-4,x",%s,ORD-4,1500,CNY,SUCCESS,%s' % (mid, t),                # 5 status
            b"T-5,%s,ORD-404,100,CNY,SUCCESS,%s" % (mid, t),                   # 6 missing
            b"T-1,%s,ORD-1,1000,CNY,SUCCESS,%s" % (mid, t),                    # 7 duplicate
            b"",                                                               # 8 blank
            b"T-6,%s,ORD-6,12.50,CNY,SUCCESS,%s" % (mid, t),                   # 9 amount
            b"T-7,%s,ORD-7,-5,CNY,SUCCESS,%s" % (mid, t),                      # 10 amount
            b"T-8,%s,ORD-8,100,cny,SUCCESS,%s" % (mid, t),                     # 11 currency
            b"T-9,%s,ORD-9,100,CNY,SUCCESS" % mid,                             # 12 columns
            b",%s,ORD-10,100,CNY,SUCCESS,%s" % (mid, t),                       # 13 empty id
            b'"T-10","%s","multi' % mid,                                       # 14 order
            b'line",100,CNY,SUCCESS,%s' % t,                                   # 15
            b"T-11,%s,ORD-1,1000,CNY,FAILED,%s" % (mid, t),                    # 16 status
            b"T-1,%s,ORD-1,999,CNY,SUCCESS,%s" % (mid, t),                     # 17 dup (txn)
            b"T-12,%s,ORD-3,3000,CN" % mid,                                    # 18 truncated
        ]
        path = os.path.join(self.tmp, "recon.csv")
        with open(path, "wb") as f:
            f.write(b"\r\n".join(lines))  # CRLF, and no line end after the last
        return path

    INVALID = [{"line": 9, "reason": "bad amount"},
               {"line": 10, "reason": "bad amount"},
               {"line": 11, "reason": "bad currency"},
               {"line": 12, "reason": "wrong column count"},
               {"line": 13, "reason": "empty channel_txn_id"},
               {"line": 14, "reason": "bad merchant_order_no"},
               {"line": 18, "reason": "wrong column count"}]

    def test_exact_report_then_second_import_inserts_nothing(self):
        mid, pays = self.payments()
        path = self.fixture(mid.encode())
        r = self.ok("recon", "import", "wx", path, "--json")
        self.assertEqual(list(r.json().keys()), ["rows", "inserted", "duplicates", "matched",
                                                 "mismatched", "missing_local", "invalid"])
        self.assertEqual(r.json(), {"rows": 15, "inserted": 6, "duplicates": 2, "matched": 2,
                                    "mismatched": 3, "missing_local": 1,
                                    "invalid": self.INVALID})
        self.assertEqual(r.err, "")  # no progress bar without a terminal
        r2 = self.ok("recon", "import", "wx", path, "--json")
        self.assertEqual(r2.json(), {"rows": 15, "inserted": 0, "duplicates": 8, "matched": 0,
                                     "mismatched": 0, "missing_local": 0,
                                     "invalid": self.INVALID})
        # The stored record of a row, through inspect.
        d = self.ok("inspect", "wx", "recon", "T-1", "--json").json()
        self.assertEqual(json.loads(d["body"]),
                         {"result": "matched", "payment_id": pays["ORD-1"]["id"]})
        d = self.ok("inspect", "wx", "recon", "T-4,x", "--json").json()
        self.assertEqual(json.loads(d["body"])["result"], "mismatched")

    def test_people_see_the_mismatches(self):
        mid, pays = self.payments()
        path = self.fixture(mid.encode())
        r = self.ok("recon", "import", "wx", path)
        self.assertIn("rows 15: inserted 6, duplicates 2, invalid 7", r.out)
        self.assertIn("matched 2, mismatched 3, missing_local 1", r.out)
        self.assertIn("line 4: T-3 %s/ORD-3 (%s): amount 3100 != local 3000"
                      % (mid, pays["ORD-3"]["id"]), r.out)
        self.assertIn("line 5: T-4,x %s/ORD-4 (%s): status SUCCESS vs local processing"
                      % (mid, pays["ORD-4"]["id"]), r.out)
        self.assertIn("line 16: T-11 %s/ORD-1 (%s): status FAILED vs local succeeded"
                      % (mid, pays["ORD-1"]["id"]), r.out)
        self.assertIn("line 18: wrong column count", r.out)

    def test_stdin_and_plain_lf_file_without_bom(self):
        self.ok("channel", "add", "wx")
        data = HEADER + b"\nA-1,m_x,O-1,5,USD,SUCCESS,2026-10-01 10:00:00\n" \
            b"A-2,m_x,O-2,6,USD,FAILED,2026-10-01T10:00:00.123Z\n"
        d = self.ok("recon", "import", "wx", "-", "--json", stdin=data).json()
        self.assertEqual((d["rows"], d["inserted"], d["missing_local"], d["invalid"]),
                         (2, 2, 2, []))
        d = self.ok("recon", "import", "wx", "-", "--json", stdin=data).json()
        self.assertEqual((d["inserted"], d["duplicates"]), (0, 2))

    def test_recon_bad_input(self):
        self.ok("channel", "add", "wx")
        good = os.path.join(self.tmp, "good.csv")
        with open(good, "wb") as f:
            f.write(HEADER + b"\n")
        badh = os.path.join(self.tmp, "badh.csv")
        with open(badh, "wb") as f:
            f.write(b"txn,merchant,order,amount,currency,status,paid_at\nT,m,o,1,CNY,SUCCESS,x\n")
        empty = os.path.join(self.tmp, "empty.csv")
        open(empty, "wb").close()
        longl = os.path.join(self.tmp, "long.csv")
        with open(longl, "wb") as f:
            f.write(HEADER + b"\nL-1,m_x," + b"O" * 5000 + b",1,CNY,SUCCESS,x\n"
                    b"L-2,m_x,O-2,7,CNY,SUCCESS,2026-10-01T10:00:00Z\n")
        self.assertEqual(self.ok("recon", "import", "wx", good, "--json").json()["rows"], 0)
        self.bad(1, "recon", "import", "wx", badh)
        self.bad(1, "recon", "import", "wx", empty)
        self.bad(1, "recon", "import", "nosuch", good)
        self.bad(1, "recon", "import", "wx", os.path.join(self.tmp, "missing.csv"))
        self.bad(2, "recon", "import", "wx")
        self.bad(2, "recon", "import")
        d = self.ok("recon", "import", "wx", longl, "--json").json()
        self.assertEqual(d["invalid"], [{"line": 2, "reason": "line too long"}])
        self.assertEqual((d["rows"], d["inserted"]), (2, 1))


if __name__ == "__main__":
    if not TESTDB:
        sys.stderr.write("CLI_TESTDB is not set (ctest sets it)\n")
        sys.exit(2)
    # No server for this backend (cli_testdb exits 77): the whole program is
    # skipped (ctest SKIP_RETURN_CODE 77), not a run of errored tests.
    probe = subprocess.run([TESTDB, "create"], capture_output=True, timeout=60)
    if probe.returncode == 77:
        sys.stderr.write(probe.stderr.decode(errors="replace"))
        sys.exit(77)
    if probe.returncode == 0:
        drop_db(probe.stdout.decode().strip())
    unittest.main(verbosity=2)
