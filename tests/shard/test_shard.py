"""Sharding by merchant (docs/scaling.md, "Sharding"): one idemd over three
stores given as three --db, black box over HTTP and idemctl.

    python3 tests/shard/test_shard.py sqlite|postgres|mixed

sqlite: three SQLite files; postgres: three databases created on the test
server ($IDEM_TEST_PG_URL, else a private one); mixed: SQLite + PostgreSQL +
MariaDB. A fourth store (same kind as shard 0) is added for the "shards can be
added" check. Python 3 standard library only.
"""

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "http"))
sys.path.insert(0, os.path.join(HERE, "..", "fault"))
import harness  # noqa: E402
from harness import uid  # noqa: E402

SET = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "sqlite"
if len(sys.argv) > 1 and sys.argv[1] == SET:
    del sys.argv[1]


def shard_of(merchant_id, n):
    """The documented function: SHA-256(id), first 8 bytes big-endian, mod n."""
    return int.from_bytes(hashlib.sha256(merchant_id.encode()).digest()[:8], "big") % n


def id_shard(an_id):
    """The shard an id names: "<prefix>_s<3 digits>..." or shard 0."""
    rest = an_id.split("_", 1)[1]
    if rest[0] == "s" and rest[1:4].isdigit():
        return int(rest[1:4])
    return 0


class Stores:
    """Four store URLs of the set (the fourth added later), cleaned up at exit."""

    def __init__(self, kind):
        self.stack = contextlib.ExitStack()
        self.tmp = tempfile.mkdtemp(prefix="idem-shard-")
        self.urls = []
        try:
            self._make(kind)
        except BaseException:
            self.close()
            raise

    def _sqlite(self, i):
        return "sqlite:" + os.path.join(self.tmp, "shard%d.db" % i)

    def _server_db(self, backend):
        import dbserver
        admin = self.stack.enter_context(dbserver.server_for(backend))
        db = dbserver.Database(admin, "s")
        self.stack.callback(db.drop)
        return db.url

    def _make(self, kind):
        if kind == "sqlite":
            self.urls = [self._sqlite(i) for i in range(4)]
        elif kind == "postgres":
            self.urls = [self._server_db("postgres") for _ in range(4)]
        elif kind == "mixed":
            self.urls = [self._sqlite(0), self._server_db("postgres"),
                         self._server_db("mariadb"), self._sqlite(3)]
        else:
            raise SystemExit("unknown shard set %r" % kind)

    def close(self):
        self.stack.close()
        if not os.environ.get("IDEM_TEST_KEEP"):
            import shutil
            shutil.rmtree(self.tmp, ignore_errors=True)


def wait_for(pred, what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def db_args(urls):
    out = []
    for u in urls:
        out += ["--db", u]
    return out


class ShardServer(harness.Server):
    """idemd over several --db; idemctl is given the same list."""

    def __init__(self, urls, extra_args=(), tmpdir=None):
        super().__init__(list(db_args(urls[1:])) + list(extra_args), db_url=urls[0],
                         tmpdir=tmpdir)
        self.urls = list(urls)

    def idemctl(self, *args):
        return idemctl(self.urls, *args)

    def new_merchant(self, name=None):
        d = json.loads(self.idemctl("merchant", "add", name or uid("merchant"), "--json"))
        m = harness.Merchant(self, d["merchant_id"], d["api_key"])
        m.shard = d["shard"]
        return m


def idemctl(urls, *args, check=True):
    argv = [harness.idemctl_path()] + db_args(urls) + list(args)
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    if check and p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s %s" % (" ".join(argv), p.returncode,
                                                      p.stdout.decode(errors="replace"),
                                                      p.stderr.decode(errors="replace")))
    return p.stdout.decode()


class ShardTest(harness.TestCase):
    stores = None

    @classmethod
    def setUpClass(cls):
        cls.stores = Stores(SET)
        cls.urls = cls.stores.urls[:3]
        # idemctl migrates every shard (the stores start empty).
        out = json.loads(idemctl(cls.urls, "migrate", "--json"))
        assert out["up_to_date"], out
        cls.server = ShardServer(cls.urls, ["--sweep-interval-ms", "0"])
        try:
            cls.server.start()
            cls.chan = cls.server.new_channel()
            # Merchants until every shard has two.
            cls.by_shard = {0: [], 1: [], 2: []}
            cls.all = []
            for _ in range(60):
                m = cls.server.new_merchant()
                cls.all.append(m)
                cls.by_shard[m.shard].append(m)
                if all(len(v) >= 2 for v in cls.by_shard.values()):
                    break
        except Exception:
            cls.server.stop()
            cls.server.cleanup()
            cls.stores.close()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            if cls.server.proc and cls.server.proc.poll() is None:
                cls.server.stop_checked()
        finally:
            cls.server.cleanup()
            cls.stores.close()

    # -- helpers
    def pay(self, m, amount=1000, key=None, order=None):
        r = m.post("/v1/payments", m.payment_body(amount, channel=self.chan.name, order=order),
                   key=key)
        self.assertFirst(r)
        return r.json()

    def paid(self, m, amount=1000):
        p = self.pay(m, amount)
        r = self.chan.notify(p["id"], amount)
        self.assertStatus(r, 200)
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        return p

    # -- the tests
    def test_a_spread_by_the_documented_function(self):
        for m in self.all:
            self.assertEqual(m.shard, shard_of(m.id, 3), m.id)
        self.assertTrue(all(len(v) >= 2 for v in self.by_shard.values()), self.by_shard)
        # Key ids name their shard, shard 0's keep the one-store form.
        for m in self.all:
            key_id = m.api_key.split("_")[1]
            self.assertEqual(len(key_id), 16)
            if m.shard:
                self.assertEqual(key_id[:4], "s%03d" % m.shard)
            else:
                self.assertNotEqual(key_id[0], "s")

    def test_b_every_route_on_every_shard(self):
        for shard, ms in self.by_shard.items():
            a, b = ms[0], ms[1]
            a0, b0 = a.balance(), b.balance()
            p = self.paid(a, 5000)
            self.assertEqual(id_shard(p["id"]), shard, p["id"])
            self.assertEqual(len(p["id"]), len("pay_") + 32)
            # reads
            self.assertEqual(a.payment(p["id"])["amount"], 5000)
            r = a.get("/v1/payments?merchant_order_no=" + p["merchant_order_no"])
            self.assertStatus(r, 200)
            self.assertEqual(r.json()["id"], p["id"])
            self.assertEqual(a.balance(), a0 + 5000)
            # refund
            key = uid("RF")
            r = a.post("/v1/refunds", {"refund_request_no": key, "payment_id": p["id"],
                                       "amount": 1000})
            self.assertFirst(r)
            self.assertEqual(id_shard(r.json()["id"]), shard)
            self.assertEqual(a.balance(), a0 + 4000)
            r2 = a.post("/v1/refunds", {"refund_request_no": key, "payment_id": p["id"],
                                        "amount": 1000})
            self.assertReplayOf(r2, r, 201)
            # the stored record
            self.assertStatus(a.record("refund", key), 200)
            # transfer on the same shard
            r = a.post("/v1/transfers", {"transfer_no": uid("TR"), "to_merchant": b.id,
                                         "amount": 1500, "currency": "CNY"})
            self.assertFirst(r)
            self.assertEqual(id_shard(r.json()["id"]), shard)
            self.assertEqual(a.balance(), a0 + 2500)
            self.assertEqual(b.balance(), b0 + 1500)
            # a transfer to another shard: the saga (202 pending, then credited)
            other = self.by_shard[(shard + 1) % 3][0]
            o0 = other.balance()
            body = {"transfer_no": uid("TX"), "to_merchant": other.id, "amount": 100,
                    "currency": "CNY"}
            r = a.post("/v1/transfers", body)
            self.assertFirst(r, 202)
            self.assertEqual(r.json()["status"], "pending")
            self.assertEqual(id_shard(r.json()["id"]), shard)
            self.assertEqual(a.balance(), a0 + 2400)
            wait_for(lambda: other.balance() == o0 + 100, "the credit on shard %d"
                     % ((shard + 1) % 3))
            self.assertReplayOf(a.post("/v1/transfers", body), r, 202)
            time.sleep(0.3)
            self.assertEqual(other.balance(), o0 + 100)
            self.assertEqual(a.balance(), a0 + 2400)
            # an unknown payee is still a 404
            r = a.post("/v1/transfers", {"transfer_no": uid("TU"), "to_merchant": "m_nobody",
                                         "amount": 100, "currency": "CNY"})
            self.assertProblem(r, 404, "unknown_merchant")

    def test_c_duplicate_storm_across_shards(self):
        work = []
        for m in self.all[:9]:
            work.append((m, m.payment_body(700, channel=self.chan.name), uid("K")))
        results = {}
        lock = threading.Lock()

        def fire(m, body, key):
            r = m.post("/v1/payments", body, key=key)
            with lock:
                results.setdefault(key, []).append(r)

        threads = [threading.Thread(target=fire, args=w) for w in work for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        ids = {}
        for m, body, key in work:
            rs = results[key]
            firsts = [r for r in rs if r.status == 201 and not r.replayed]
            self.assertEqual(len(firsts), 1, rs)
            for r in rs:
                self.assertIn(r.status, (201, 409), r)
                if r.status == 201:
                    self.assertEqual(r.json()["id"], firsts[0].json()["id"])
            ids[key] = firsts[0].json()["id"]
            self.assertEqual(id_shard(ids[key]), m.shard)
        # The same notification many times, concurrently: one credit each.
        before = {m.id: m.balance() for m, _, _ in work}
        nthreads = []
        for m, body, key in work:
            nb = self.chan.body(ids[key], 700)
            for _ in range(4):
                nthreads.append(threading.Thread(target=self.chan.post, args=(nb,)))
        for t in nthreads:
            t.start()
        for t in nthreads:
            t.join(60)
        for m, body, key in work:
            self.assertEqual(m.payment(ids[key])["status"], "succeeded")
            self.assertEqual(m.balance() - before[m.id], 700, m.id)

    def test_d_tenant_isolation_across_shards(self):
        a = self.by_shard[0][0]
        for shard in (1, 2):
            b = self.by_shard[shard][0]
            p = self.paid(b, 300)
            self.assertProblem(a.get("/v1/payments/" + p["id"]), 404, "not_found")
            r = a.get("/v1/payments?merchant_order_no=" + p["merchant_order_no"])
            self.assertProblem(r, 404, "not_found")
            r = a.post("/v1/refunds", {"refund_request_no": uid("X"), "payment_id": p["id"],
                                       "amount": 100})
            self.assertEqual(r.status, 404, r)
            self.assertEqual(b.payment(p["id"])["refunded_amount"], 0)
        # a key whose id names a shard that does not exist, or a wrong secret
        r = harness.http_request(self.server.port, "GET", "/v1/balance",
                                 headers={"Authorization": "Bearer sk_s009" + "0" * 12 + "_"
                                          + "0" * 48})
        self.assertProblem(r, 401, "unauthorized")
        m = self.by_shard[2][0]
        bad = m.api_key[:-4] + ("0000" if not m.api_key.endswith("0000") else "1111")
        r = harness.http_request(self.server.port, "GET", "/v1/balance",
                                 headers={"Authorization": "Bearer " + bad})
        self.assertProblem(r, 401, "unauthorized")

    def test_e_notification_reaches_the_right_shard(self):
        for shard in (0, 1, 2):
            m = self.by_shard[shard][1]
            p = self.pay(m, 900)
            before = m.balance()
            r = self.chan.notify(p["id"], 900)
            self.assertStatus(r, 200)
            self.assertEqual(m.balance() - before, 900)
            # an id of this shard that does not exist: 404 from that shard
            r = self.chan.notify(p["id"][:-4] + "ffff", 900)
            self.assertEqual(r.status, 404, r)

    def test_f_rotated_key_keeps_its_shard(self):
        m = self.by_shard[1][0]
        d = json.loads(self.server.idemctl("merchant", "rotate-key", m.id, "--json"))
        self.assertEqual(d["api_key"].split("_")[1][:4], "s001")
        m.api_key = d["api_key"]  # the other tests go on with the new key
        self.assertIsInstance(m.balance(), int)
        # (the old key works on in idemd for its auth cache's 10 s, as on one store)

    def test_g_merchants_stay_put_when_a_shard_is_added(self):
        four = self.stores.urls[:4]
        json.loads(idemctl(four, "migrate", "--json"))
        s4 = ShardServer(four, ["--sweep-interval-ms", "0"])
        s4.start()
        try:
            # Every merchant made with three shards still works, on its shard.
            for m in self.all:
                mm = harness.Merchant(s4, m.id, m.api_key)
                r = mm.post("/v1/payments", mm.payment_body(100, channel=self.chan.name))
                self.assertFirst(r)
                self.assertEqual(id_shard(r.json()["id"]), m.shard)
            listed = json.loads(idemctl(four, "merchant", "list", "--json"))["merchants"]
            self.assertGreaterEqual(len(listed), len(self.all))
            # New ones follow the function over four; the channel reached shard 3.
            ch4 = harness.Channel(s4, self.chan.name, self.chan.secret)
            seen = set()
            for _ in range(40):
                m = s4.new_merchant()
                self.assertEqual(m.shard, shard_of(m.id, 4))
                seen.add(m.shard)
                if m.shard == 3:
                    r = m.post("/v1/payments", m.payment_body(100, channel=self.chan.name))
                    self.assertFirst(r)
                    self.assertEqual(id_shard(r.json()["id"]), 3)
                    self.assertStatus(ch4.notify(r.json()["id"], 100), 200)
                    self.assertEqual(m.balance(), 100)
                    break
            self.assertIn(3, seen)
        finally:
            s4.stop_checked()
            s4.cleanup()

    def test_h_recon_rows_go_to_their_merchants_shard(self):
        # A paid payment per shard, then the channel's file lists them (plus
        # one row the channel has and idem does not).
        rows, want = [], {"matched": 0, "missing_local": 0}
        for shard in (0, 1, 2):
            m = self.by_shard[shard][0]
            p = self.paid(m, 1200)
            rows.append("%s,%s,%s,1200,CNY,SUCCESS,2026-01-01T00:00:00Z"
                        % (uid("RT"), m.id, p["merchant_order_no"]))
            want["matched"] += 1
        rows.append("%s,%s,%s,1200,CNY,SUCCESS,2026-01-01T00:00:00Z"
                    % (uid("RT"), self.by_shard[1][0].id, uid("NOPE")))
        want["missing_local"] += 1
        path = os.path.join(self.server.tmpdir, "recon.csv")
        with open(path, "w") as f:
            f.write("channel_txn_id,merchant_id,merchant_order_no,amount,currency,status,"
                    "paid_at\n" + "\n".join(rows) + "\n")
        d = json.loads(idemctl(self.urls, "recon", "import", self.chan.name, path, "--json"))
        self.assertEqual(d["inserted"], 4, d)
        self.assertEqual(d["matched"], want["matched"], d)
        self.assertEqual(d["missing_local"], want["missing_local"], d)
        d = json.loads(idemctl(self.urls, "recon", "import", self.chan.name, path, "--json"))
        self.assertEqual(d["duplicates"], 4, d)

    def test_z_idemctl_sums_purges_migrates_every_shard(self):
        # The last flush happens at shutdown: stop idemd first.
        self.server.stop_checked()
        total = json.loads(idemctl(self.urls, "stats", "--json", check=False))
        parts = [json.loads(idemctl([u], "stats", "--json", check=False)) for u in self.urls]
        self.assertGreater(total["requests"], 0)
        self.assertEqual(total["requests"], sum(p["requests"] for p in parts))
        self.assertEqual(total["duplicates"], sum(p["duplicates"] for p in parts))
        for t, d in total["by_type"].items():
            self.assertEqual(d["first"], sum(p["by_type"].get(t, {}).get("first", 0)
                                             for p in parts), t)
        self.assertTrue(all(p["requests"] > 0 for p in parts), parts)
        n = json.loads(idemctl(self.urls, "merchant", "list", "--json"))["merchants"]
        self.assertGreaterEqual(len(n), len(self.all))
        d = json.loads(idemctl(self.urls, "purge", "--dry-run", "--json"))
        self.assertEqual(d["would_delete"], 0)
        d = json.loads(idemctl(self.urls, "purge", "--json"))
        self.assertTrue(d["complete"])
        self.assertGreaterEqual(d["batches"], 3)  # one (short) batch per shard at least
        d = json.loads(idemctl(self.urls, "migrate", "--status", "--json"))
        self.assertTrue(d["up_to_date"], d)


class SagaKillTest(unittest.TestCase):
    """Transfers between shards survive kill -9 between the saga's steps:
    every debit and credit exactly once, and the sum of all balances (plus
    what is in flight, on SQLite where the outbox can be read) never
    changes."""

    @classmethod
    def setUpClass(cls):
        cls.stores = Stores(SET)
        cls.urls = cls.stores.urls[:3]
        idemctl(cls.urls, "migrate")
        cls.tmp = tempfile.mkdtemp(prefix="idem-saga-")

    @classmethod
    def tearDownClass(cls):
        cls.stores.close()
        if not os.environ.get("IDEM_TEST_KEEP"):
            import shutil
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def server(self, *args):
        s = ShardServer(self.urls, ["--sweep-interval-ms", "0"] + list(args), tmpdir=self.tmp)
        s.start()
        return s

    def total(self, s, ms):
        return sum(harness.Merchant(s, m.id, m.api_key).balance() for m in ms)

    def in_flight(self):
        """Amount of pending outbox rows over the SQLite shards (None elsewhere)."""
        import sqlite3
        paths = [harness.sqlite_path(u) for u in self.urls]
        if any(p is None for p in paths):
            return None
        n = 0
        for p in paths:
            db = sqlite3.connect("file:%s?mode=ro" % p, uri=True, timeout=10)
            n += db.execute("SELECT coalesce(sum(amount), 0) FROM transfer_outbox"
                            " WHERE status = 'pending'").fetchone()[0]
            db.close()
        return n

    def test_kill9_between_the_steps(self):
        s = self.server("--transfer-drive-ms", "0")  # step 1 only
        ch = s.new_channel()
        ms = []
        while len({m.shard for m in ms}) < 2 or len(ms) < 4:
            ms.append(s.new_merchant())
        payer = ms[0]
        payee = next(m for m in ms if m.shard != payer.shard)
        for m in ms:
            p = m.post("/v1/payments", m.payment_body(10000, channel=ch.name)).json()
            self.assertEqual(ch.notify(p["id"], 10000).status, 200)
        total0 = self.total(s, ms)
        body = {"transfer_no": uid("SG"), "to_merchant": payee.id, "amount": 700,
                "currency": "CNY"}
        # 1. Killed after the debit, before the credit.
        r = payer.post("/v1/transfers", body)
        self.assertEqual(r.status, 202, r)
        first = r
        s.stop(signal.SIGKILL)
        s = self.server()  # the driver on: it finds the pending row
        pay_, pee = payer.on(s), payee.on(s)
        wait_for(lambda: pee.balance() == 10700, "the credit after restart")
        self.assertEqual(pay_.balance(), 9300)
        self.assertEqual(self.total(s, ms), total0)
        r = pay_.post("/v1/transfers", body)
        self.assertEqual(r.status, 202)
        self.assertEqual(r.body, first.body)
        self.assertEqual(r.header("Idempotent-Replayed"), "true")
        s.stop_checked()
        # 2. Killed after the credit, before the outbox row settles.
        s = self.server("--transfer-step-delay-ms", "4000")
        pay_, pee = payer.on(s), payee.on(s)
        body2 = dict(body, transfer_no=uid("SG"))
        self.assertEqual(pay_.post("/v1/transfers", body2).status, 202)
        wait_for(lambda: pee.balance() == 11400, "the second credit")
        s.stop(signal.SIGKILL)
        flying = self.in_flight()
        if flying is not None:
            self.assertEqual(flying, 700)  # credited, but the row is still pending
        s = self.server()
        pay_, pee = payer.on(s), payee.on(s)
        if flying is not None:
            wait_for(lambda: self.in_flight() == 0, "the row to settle")
        else:
            time.sleep(1.5)
        self.assertEqual(pee.balance(), 11400)  # not credited twice
        self.assertEqual(pay_.balance(), 8600)
        self.assertEqual(self.total(s, ms), total0)
        # 3. A storm of the same transfer, killed in the middle, then retried.
        body3 = dict(body, transfer_no=uid("SG"), amount=50)
        answers = []

        def fire():
            try:
                answers.append(pay_.post("/v1/transfers", body3, timeout=5))
            except OSError:
                pass

        threads = [threading.Thread(target=fire) for _ in range(12)]
        for t in threads:
            t.start()
        time.sleep(0.05)
        s.stop(signal.SIGKILL)
        for t in threads:
            t.join(10)
        s = self.server()
        pay_, pee = payer.on(s), payee.on(s)
        r = pay_.post("/v1/transfers", body3)
        self.assertEqual(r.status, 202, r)
        wait_for(lambda: pee.balance() == 11450, "the storm's one credit")
        time.sleep(0.5)
        self.assertEqual(pee.balance(), 11450)
        self.assertEqual(pay_.balance(), 8550)
        self.assertEqual(self.total(s, ms), total0)
        if self.in_flight() is not None:
            self.assertEqual(self.in_flight(), 0)
        s.stop_checked()


@unittest.skipUnless(SET == "sqlite", "the upgrade path is checked on SQLite files")
class UpgradeTest(unittest.TestCase):
    """A store from before the directory (schema 4) that then becomes shard 0
    of three: migration 5 records its merchants on shard 0, and they stay."""

    def test_schema4_store_becomes_shard_0(self):
        import sqlite3
        tmp = tempfile.mkdtemp(prefix="idem-shard-up-")
        urls = ["sqlite:" + os.path.join(tmp, "s%d.db" % i) for i in range(3)]
        one = [urls[0]]
        ids = [json.loads(idemctl(one, "merchant", "add", "old%d" % i, "--json"))
               for i in range(5)]
        # Back to schema 4: no directory table (5), no outbox (6).
        db = sqlite3.connect(urls[0][len("sqlite:"):])
        db.execute("DROP TABLE merchant_shards")
        db.execute("DROP TABLE transfer_outbox")
        db.execute("DELETE FROM idem_schema_version WHERE version >= 5")
        db.commit()
        db.close()
        out = json.loads(idemctl(urls, "migrate", "--json"))
        self.assertTrue(out["up_to_date"], out)
        db = sqlite3.connect(urls[0][len("sqlite:"):])
        rows = dict(db.execute("SELECT merchant_id, shard FROM merchant_shards"))
        db.close()
        for d in ids:
            self.assertEqual(rows.get(d["merchant_id"]), 0)
        s = ShardServer(urls, ["--sweep-interval-ms", "0"])
        s.start()
        try:
            ch = s.new_channel()
            for d in ids:
                m = harness.Merchant(s, d["merchant_id"], d["api_key"])
                r = m.post("/v1/payments", m.payment_body(100, channel=ch.name))
                self.assertEqual(r.status, 201, r)
                self.assertEqual(id_shard(r.json()["id"]), 0)
                self.assertEqual(len(r.json()["id"]), len("pay_") + 32)
        finally:
            s.stop()
            s.cleanup()
            if not os.environ.get("IDEM_TEST_KEEP"):
                import shutil
                shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if SET in ("postgres", "mixed"):
        import dbserver
        dbserver.preflight("postgres", private=False)
        if SET == "mixed":
            dbserver.preflight("mariadb", private=False)
    harness.main()
