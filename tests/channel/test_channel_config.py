#!/usr/bin/env python3
"""Channel configuration against a real idemd (issue 11): idemctl channel
add / connect / rotate-secret picked up by a running idemd, --public-url in
the notify_url, bad values refused. Runs on SQLite, or on $IDEM_TEST_DB_URL
(tests/fault/http_on.py)."""

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import simharness  # noqa: E402
from simharness import ChannelCase, uid  # noqa: E402


class Live(ChannelCase):
    SERVER_KW = {"sweep_interval_ms": 300, "sweep_age_ms": 6000}

    def test_secret_rotation(self):
        """idemctl channel rotate-secret: once the channel signs with the new
        secret, idemd follows within its config cache (5 s): calls in between
        are unknown (never refusals), then payments and notifications work."""
        name = "rot" + simharness.uuid_hex()
        ch = simharness.add_channel(self.server, self.sim, name=name, timeout_ms=1000)
        self.addCleanup(self.sim.set_secret, self.ch.secret)  # the class's channel again
        m = self.server.new_merchant()
        self.assertEqual(m.post("/v1/payments", self.body(m, 100, channel=name),
                                key=uid("K")).status, 201)
        d = simharness.json.loads(self.server.idemctl("--json", "channel", "rotate-secret", name))
        self.assertNotEqual(d["secret"], ch.secret)
        self.sim.set_secret(d["secret"])
        end = time.monotonic() + 8
        seen = []
        while True:
            r = m.post("/v1/payments", self.body(m, 100, channel=name), key=uid("K"))
            seen.append(r.status)
            if r.status == 201 or time.monotonic() > end:
                break
            self.assertEqual(r.status, 503, r)
            time.sleep(0.3)
        self.assertEqual(r.status, 201, "no payment 8 s after the rotation: %s" % seen)
        pid = r.json()["id"]
        self.sim.pay(pid, "SUCCESS")
        self.wait_status(m, pid, "succeeded")

    def test_connect_and_disconnect(self):
        """idemctl channel connect: a notify-only channel starts calling the
        channel within 5 s; disconnected, payments stay local again."""
        notify_only = self.server.new_channel()  # v1: no base URL
        self.addCleanup(self.sim.set_secret, self.ch.secret)
        self.sim.set_secret(notify_only.secret)
        m = self.server.new_merchant()
        r = m.post("/v1/payments", self.body(m, 100, channel=notify_only.name), key=uid("K"))
        self.assertEqual((r.status, r.json()["status"]), (201, "processing"), r)
        self.assertEqual(self.creates(), [], "a notify-only channel was called")
        self.server.idemctl("channel", "connect", notify_only.name, "--base-url", self.sim.url,
                            "--timeout-ms", "1000")
        end = time.monotonic() + 8
        while not self.creates() and time.monotonic() < end:
            r = m.post("/v1/payments", self.body(m, 100, channel=notify_only.name), key=uid("K"))
            self.assertEqual(r.status, 201, r)
            time.sleep(0.3)
        self.assertTrue(self.creates(), "channel connect not picked up within 8 s")
        self.assertEqual(self.creates()[-1]["number"], r.json()["id"])
        self.server.idemctl("channel", "connect", notify_only.name)
        time.sleep(5.5)
        n = len(self.creates())
        r = m.post("/v1/payments", self.body(m, 100, channel=notify_only.name), key=uid("K"))
        self.assertEqual(r.status, 201, r)
        self.assertEqual(len(self.creates()), n, "a disconnected channel was still called")


class PublicUrl(ChannelCase):
    SERVER_KW = {"public_url": "http://idem.example.invalid:8443/idem/"}

    def test_notify_url_from_public_url(self):
        m = self.server.new_merchant()
        r = m.post("/v1/payments", self.body(m, 100), key=uid("K"))
        self.assertEqual(r.status, 201, r)
        o = self.sim.order_map()[r.json()["id"]]
        self.assertEqual(o["notify_url"], "http://idem.example.invalid:8443/idem/v1/notifications/"
                         + self.ch.name)


class BadConfig(unittest.TestCase):
    """idemctl channel add and idemd's channel flags refuse bad values clearly."""

    def test_channel_add_bad_values(self):
        s = simharness.harness.Server()
        try:
            s.start()
            for args in (["--base-url", "ftp://127.0.0.1:1"], ["--base-url", ""],
                         ["--base-url", "http://127.0.0.1:1", "--timeout-ms", "0"],
                         ["--base-url", "http://127.0.0.1:1", "--timeout-ms", "x"],
                         ["--timeout-ms", "100", "--base-url"]):
                with self.subTest(args=args):
                    with self.assertRaises(RuntimeError, msg=args):
                        s.idemctl("--json", "channel", "add", "bad" + simharness.uuid_hex(),
                                  *args)
        finally:
            s.stop()
            s.cleanup()

    def test_idemd_bad_flags(self):
        for args in (["--channel-workers", "0"], ["--channel-queue", "0"],
                     ["--sweep-interval-ms", "-1"], ["--public-url", "idem.example:80"]):
            with self.subTest(args=args):
                p = subprocess.run([simharness.harness.idemd_path(), "--listen", "127.0.0.1:1",
                                    "--db", "sqlite::memory:"] + args, capture_output=True,
                                   timeout=20)
                self.assertEqual(p.returncode, 2, (args, p.stderr))
                self.assertIn(args[0].lstrip("-"), p.stderr.decode(), args)


if __name__ == "__main__":
    simharness.main()
