"""Channel secrets sealed at rest (issue 16): with --secret-key-file, idemd
and idemctl keep every channel secret as "v1:" + base64(nonce|ct|tag)
(AES-256-GCM, the channel name as associated data). Real idemd, real
idemctl, the real SQLite file read byte for byte.

What each test shows is in docs/security.md.
"""

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "http"))

import harness  # noqa: E402
from harness import uid  # noqa: E402


def write_key(path, mode=0o600, raw=False):
    key = os.urandom(32)
    with open(path, "wb") as f:
        f.write(key if raw else (key.hex() + "\n").encode())
    os.chmod(path, mode)
    return path


class SecretsAtRest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-seal-")
        self.db = os.path.join(self.tmp, "idem.db")
        self.url = "sqlite:" + self.db
        self.key = write_key(os.path.join(self.tmp, "key"))
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.cleanup()

    def ctl(self, *args, key=None):
        argv = [harness.idemctl_path(), "--db", self.url]
        if key:
            argv += ["--secret-key-file", key]
        p = subprocess.run(argv + list(args), capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout.decode(), p.stderr.decode()

    def ok(self, *args, key=None):
        rc, out, err = self.ctl(*args, key=key)
        self.assertEqual(rc, 0, out + err)
        return out

    def add_channel(self, key=None):
        name = "c" + uid("x").split("-")[1]
        d = json.loads(self.ok("channel", "add", name, "--json", key=key))
        return harness.Channel(None, name, d["secret"])

    def server(self, key=None, extra=()):
        args = list(extra)
        if key:
            args += ["--secret-key-file", key]
        s = harness.Server(args, db_url=self.url, tmpdir=tempfile.mkdtemp(dir=self.tmp))
        self.servers.append(s)
        return s

    def start_fails(self, srv, needle):
        """idemd refuses to start: non-zero exit, needle in its log."""
        argv = [harness.idemd_path(), "--listen", "127.0.0.1:%d" % harness.free_port(),
                "--db", self.url] + srv.extra_args
        p = subprocess.run(argv, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn(needle, p.stderr.decode() + p.stdout.decode())

    def stored(self):
        with sqlite3.connect("file:%s?mode=ro" % self.db, uri=True) as db:
            return dict(db.execute("SELECT name, secret FROM channels"))

    def file_bytes(self):
        data = b""
        for suffix in ("", "-wal", "-journal"):
            if os.path.exists(self.db + suffix):
                with open(self.db + suffix, "rb") as f:
                    data += f.read()
        return data

    def assertNotInFile(self, secret):
        data = self.file_bytes()
        self.assertNotIn(secret.encode(), data, "plaintext secret in the SQLite file")
        self.assertNotIn(bytes.fromhex(secret), data, "secret bytes in the SQLite file")

    def pay_once(self, srv, ch):
        m = srv.new_merchant()
        ch.server = srv
        p = m.create_payment(ch.name, 500)
        r = ch.notify(p["id"], 500)
        self.assertEqual(r.status, 200, r)
        self.assertEqual(m.payment(p["id"])["status"], "succeeded")
        # A wrong signature is still refused.
        bad = harness.Channel(srv, ch.name, "0" * 64)
        self.assertEqual(bad.notify(p["id"], 500).status, 401)

    def test_file_never_holds_a_sealed_secret_in_plaintext(self):
        self.ok("migrate")
        chans = [self.add_channel(key=self.key) for _ in range(3)]
        srv = self.server(key=self.key)
        srv.start()
        try:
            for ch in chans:
                self.pay_once(srv, ch)
            rotated = json.loads(self.ok("channel", "rotate-secret", chans[0].name, "--json",
                                         key=self.key))["secret"]
            self.assertNotInFile(rotated)
            chans[0].secret = rotated
            self.pay_once(srv, chans[0])
            for ch in chans:
                self.assertNotInFile(ch.secret)
        finally:
            srv.stop_checked()
        for name, value in self.stored().items():
            self.assertTrue(value.startswith("v1:"), (name, value))
        for ch in chans:
            self.assertNotInFile(ch.secret)
        self.assertIn("sealed at rest", srv.log_text())

    def test_wrong_key_is_a_clear_error(self):
        self.add_channel(key=self.key)
        other = write_key(os.path.join(self.tmp, "other"))
        self.start_fails(self.server(key=other), "does not open with this secret key")
        rc, _out, err = self.ctl("channel", "list", key=other)
        self.assertEqual(rc, 1)
        self.assertIn("does not open with this secret key", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        # Without any key, a database with sealed secrets is refused too.
        self.start_fails(self.server(), "secret key is required")
        rc, _out, err = self.ctl("channel", "add", "plainwouldleak")
        self.assertEqual(rc, 1)
        self.assertIn("secret key is required", err)
        self.assertNotIn("plainwouldleak", self.stored())

    def test_key_file_checks(self):
        self.ok("migrate")
        loose = write_key(os.path.join(self.tmp, "loose"), mode=0o644)
        self.start_fails(self.server(key=loose), "chmod 600")
        short = os.path.join(self.tmp, "short")
        with open(short, "w") as f:
            f.write("abcd\n")
        os.chmod(short, 0o600)
        self.start_fails(self.server(key=short), "32 bytes or 64 hex digits")
        self.start_fails(self.server(key=os.path.join(self.tmp, "absent")), "absent")
        rc, _o, err = self.ctl("channel", "list", key=loose)
        self.assertEqual(rc, 1)
        self.assertIn("chmod 600", err)
        # 32 raw bytes are a key too.
        raw = write_key(os.path.join(self.tmp, "raw"), raw=True)
        ch = self.add_channel(key=raw)
        srv = self.server(key=raw)
        srv.start()
        try:
            self.pay_once(srv, ch)
        finally:
            srv.stop_checked()

    def test_plain_secrets_still_verify_then_rekey_seals_them(self):
        old = self.add_channel()                 # written before any key
        self.assertFalse(self.stored()[old.name].startswith("v1:"))
        srv = self.server(key=self.key)
        srv.start()
        try:
            self.pay_once(srv, old)              # the migration path
        finally:
            srv.stop_checked()
        out = json.loads(self.ok("channel", "rekey", "--json", key=self.key))
        self.assertEqual(out["sealed"], 1)
        self.assertTrue(self.stored()[old.name].startswith("v1:"))
        # A new key: everything re-sealed, the old key no longer opens them.
        new = write_key(os.path.join(self.tmp, "new"))
        out = json.loads(self.ok("channel", "rekey", "--new-secret-key-file", new, "--json",
                                 key=self.key))
        self.assertEqual(out["sealed"], 1)
        rc, _o, err = self.ctl("channel", "list", key=self.key)
        self.assertEqual(rc, 1, err)
        srv = self.server(key=new)
        srv.start()
        try:
            self.pay_once(srv, old)
        finally:
            srv.stop_checked()
        rc, _o, err = self.ctl("channel", "rekey")
        self.assertEqual(rc, 2, err)             # needs the current key

    def test_key_from_the_environment(self):
        # IDEM_SECRET_KEY_FILE for both binaries; --help names the flag.
        env = dict(os.environ, IDEM_SECRET_KEY_FILE=self.key)
        p = subprocess.run([harness.idemctl_path(), "--db", self.url, "channel", "add", "envch",
                            "--json"], capture_output=True, timeout=60, env=env)
        self.assertEqual(p.returncode, 0, p)
        secret = json.loads(p.stdout)["secret"]
        self.assertTrue(self.stored()["envch"].startswith("v1:"))
        self.assertNotInFile(secret)
        for binary in (harness.idemd_path(), harness.idemctl_path()):
            p = subprocess.run([binary, "--help"], capture_output=True, timeout=10)
            self.assertEqual(p.returncode, 0)
            self.assertIn(b"--secret-key-file", p.stdout)
        # idemd takes the same variable (its help names it).
        p = subprocess.run([harness.idemd_path(), "--help"], capture_output=True, timeout=10)
        self.assertIn(b"IDEM_SECRET_KEY_FILE", p.stdout)
        srv = harness.Server([], db_url=self.url, tmpdir=tempfile.mkdtemp(dir=self.tmp))
        self.servers.append(srv)
        old = os.environ.get("IDEM_SECRET_KEY_FILE")
        os.environ["IDEM_SECRET_KEY_FILE"] = self.key
        try:
            srv.start()
        finally:
            if old is None:
                del os.environ["IDEM_SECRET_KEY_FILE"]
            else:
                os.environ["IDEM_SECRET_KEY_FILE"] = old
        try:
            self.pay_once(srv, harness.Channel(srv, "envch", secret))
        finally:
            srv.stop_checked()

    def test_sealed_secret_is_bound_to_its_channel(self):
        # The channel name is the associated data: a sealed value copied to
        # another channel's row does not open there.
        a = self.add_channel(key=self.key)
        b = self.add_channel(key=self.key)
        srv = self.server(key=self.key)
        srv.start()
        try:
            with sqlite3.connect(self.db, timeout=10) as db:
                db.execute("UPDATE channels SET secret = (SELECT secret FROM channels"
                           " WHERE name = ?) WHERE name = ?", (a.name, b.name))
            b.server = srv
            forged = harness.Channel(srv, b.name, a.secret)
            r = forged.notify("pay_nope", 100)
            self.assertNotEqual(r.status, 404, r)  # 404 would mean the signature verified
            self.assertIn(r.status, (401, 503), r)
        finally:
            srv.stop_checked()


if __name__ == "__main__":
    harness.main()
