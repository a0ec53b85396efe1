"""Keys and secrets never reach a log (issue 13), and the SQLite file never
holds an API key: a full HTTP session against a real idemd, once per log
format, with every credential in play (API keys, rotated keys, near-miss
keys, channel secrets, the secret-key file), then a search of everything the
process wrote for each of them, in the forms they could leak in (as sent,
the secret half, the SHA-256 digest, the raw bytes).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "http"))

import harness  # noqa: E402
from harness import uid  # noqa: E402

FORMATS = ("text", "json")


class Session:
    """Every route, good and bad, with the credentials it used."""

    def __init__(self, srv, ctl, key_file):
        self.srv = srv
        self.creds = []    # every secret string that was in play
        a, b = srv.new_merchant(), srv.new_merchant()
        ch = srv.new_channel()
        for cmd in (["channel", "add", "c" + uid("x").split("-")[1], "--json"],):
            d = json.loads(ctl(*cmd))
            self.creds.append(d["secret"])
        self.creds += [a.api_key, b.api_key, ch.secret]
        # Happy paths of every route.
        p = a.create_payment(ch.name, 2000, key=uid("K"))
        a.post("/v1/payments", a.payment_body(2000, channel=ch.name), key=uid("K"))
        r = ch.notify(p["id"], 2000)
        assert r.status == 200, r
        ch.notify(p["id"], 2000)  # a second notify_id for the same payment
        a.payment(p["id"])
        a.get("/v1/payments?merchant_order_no=" + p["merchant_order_no"])
        rk = uid("R")
        a.post("/v1/refunds", {"refund_request_no": rk, "payment_id": p["id"], "amount": 100})
        a.post("/v1/refunds", {"refund_request_no": rk, "payment_id": p["id"], "amount": 100})
        a.post("/v1/transfers", {"transfer_no": uid("T"), "to_merchant": b.id, "amount": 50,
                                 "currency": "CNY"})
        a.balances()
        a.record("refund", rk)
        srv.request("GET", "/healthz")
        srv.request("GET", "/metrics")
        # Wrong and near-miss credentials.
        near = a.api_key[:-1] + ("1" if a.api_key[-1] == "0" else "0")
        for bad in (near, ch.secret, a.api_key + "x", "sk_" + "0" * 16 + "_" + "1" * 48):
            srv.request("GET", "/v1/balance", None, {"Authorization": "Bearer " + bad})
            srv.request("POST", "/v1/payments", b"{}",
                        {"Authorization": "Bearer " + bad, "Content-Type": "application/json"})
            self.creds.append(bad)
        srv.request("GET", "/v1/balance", None, {"Authorization": "Basic " + a.api_key})
        srv.request("GET", "/v1/balance", None, {"Authorization": a.api_key})
        srv.request("GET", "/v1/balance", None, {"X-Api-Key": a.api_key})
        body = harness.dumps(ch.body(p["id"], 2000))
        ch.post(body, signature=harness.sign(a.api_key, body))       # wrong secret
        ch.post(body, signature=ch.secret)                           # the secret as signature
        ch.post(body, signature=None)
        # A key pasted where an id goes (a client bug that happens).
        a.get("/v1/payments/" + uid("pay"))
        # Bad bodies carrying secrets: echoed nowhere.
        a.post("/v1/payments", ('{"note":"%s"' % ch.secret).encode())
        a.post("/v1/payments", {"merchant_order_no": a.api_key, "amount": 1, "currency": "CNY",
                                "channel": ch.name})
        # Rotation: the new key and secret are credentials too.
        nk = json.loads(ctl("merchant", "rotate-key", a.id, "--json"))["api_key"]
        ns = json.loads(ctl("channel", "rotate-secret", ch.name, "--json"))["secret"]
        harness.Merchant(srv, a.id, nk).balances()
        harness.Channel(srv, ch.name, ns).notify(p["id"], 2000)
        harness.Merchant(srv, a.id, a.api_key).get("/v1/balance")  # the revoked one
        self.creds += [nk, ns]
        with open(key_file) as f:
            self.creds.append(f.read().strip())
        self.api_keys = [c for c in self.creds if c.startswith("sk_")]


def forms(secret):
    """The ways a secret could show up in bytes."""
    out = {secret.encode()}
    if secret.startswith("sk_") and secret.count("_") >= 2:
        out.add(secret.rsplit("_", 1)[1].encode())          # the secret half
        out.add(hashlib.sha256(secret.encode()).hexdigest().encode())  # its digest
    try:
        raw = bytes.fromhex(secret)
        if len(raw) >= 16:
            out.add(raw)
    except ValueError:
        pass
    return out


class Logs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One key for every session: with IDEM_TEST_DB_URL they share a database.
        cls.keydir = tempfile.mkdtemp(prefix="idem-logs-key-")
        cls.key_file = os.path.join(cls.keydir, "secret.key")
        with open(cls.key_file, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        os.chmod(cls.key_file, 0o600)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.keydir, ignore_errors=True)

    def run_session(self, fmt):
        tmp = tempfile.mkdtemp(prefix="idem-logs-")
        key_file = self.key_file
        srv = harness.Server(["--log-format", fmt, "--secret-key-file", key_file], tmpdir=tmp)
        # The harness's idemctl has no key: channels go through this one.
        def ctl(*args):
            p = subprocess.run([harness.idemctl_path(), "--db", srv.db_url, "--secret-key-file",
                                key_file] + list(args), capture_output=True, timeout=60,
                               stdin=subprocess.DEVNULL)
            assert p.returncode == 0, p
            return p.stdout.decode()
        srv.idemctl = lambda *a: ctl(*a)
        srv.start()
        try:
            s = Session(srv, ctl, key_file)
        finally:
            srv.stop_checked()
        with open(srv.log_path, "rb") as f:
            log = f.read()
        db = b""
        path = harness.sqlite_path(srv.db_url)
        if path:
            for suffix in ("", "-wal"):
                if os.path.exists(path + suffix):
                    with open(path + suffix, "rb") as f:
                        db += f.read()
        srv.cleanup()
        return s, log, db

    def test_every_log_format(self):
        for fmt in FORMATS:
            with self.subTest(log_format=fmt):
                s, log, db = self.run_session(fmt)
                lines = log.decode("utf-8", "replace").splitlines()
                self.assertGreater(len(lines), 30, "the session was not logged")
                if fmt == "json":
                    for line in lines:
                        json.loads(line)
                for secret in s.creds:
                    for form in forms(secret):
                        if form in log:
                            at = log.index(form)
                            self.fail("a credential in the %s log, line: %r" % (
                                fmt, log[log.rfind(b"\n", 0, at) + 1:log.find(b"\n", at)]))
                # The database holds digests of API keys, never a key or its secret half.
                if db:
                    for key in s.api_keys:
                        self.assertFalse(key.encode() in db, "an API key in the SQLite file")
                        self.assertFalse(key.rsplit("_", 1)[1].encode() in db,
                                         "an API key's secret in the SQLite file")

    def test_forms_finds_what_it_looks_for(self):
        # The search is real: a key's forms are found where they are.
        k = "sk_" + "a1" * 8 + "_" + "b2" * 24
        blob = b"x " + hashlib.sha256(k.encode()).hexdigest().encode() + b" y"
        self.assertTrue(any(f in blob for f in forms(k)))
        self.assertTrue(any(f in b"..." + bytes.fromhex("c3" * 32) for f in forms("c3" * 32)))


if __name__ == "__main__":
    unittest.main(verbosity=2)
