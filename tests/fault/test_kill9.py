"""kill -9 of idemd in the middle of group-committed batches loses no
acknowledged request (issue 6).

Clients keep many payments and notifications in flight so that batches are
full; idemd is killed with SIGKILL (no shutdown of any kind); a new idemd on
the same database must then hold every request that was answered 2xx, the
retry of each must replay the byte-identical answer, and every balance must
equal its ledger sum and the credits that were acknowledged.
"""

import os
import signal
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "http"))
import harness  # noqa: E402
from harness import uid  # noqa: E402


class Kill9(unittest.TestCase):
    def setUp(self):
        self.servers = []

    def tearDown(self):
        for s in self.servers:
            s.cleanup()

    def start(self, **kw):
        s = harness.Server(["--batch-max", "64", "--threads", "4"], **kw)
        self.servers.append(s)
        return s.start()

    def test_kill9_during_batches_loses_no_acknowledged_request(self):
        s1 = self.start()
        ch = s1.new_channel()
        merchants = [s1.new_merchant() for _ in range(3)]
        acked = []          # (merchant, key, body, response) of 2xx payments
        credited = {}       # merchant id -> acknowledged credits
        lock = threading.Lock()
        stop = threading.Event()

        def client(i):
            m = merchants[i % len(merchants)]
            while not stop.is_set():
                body = m.payment_body(100 + i, "CNY", ch.name)
                key = uid("K")
                try:
                    r = m.post("/v1/payments", body, key=key, timeout=5)
                except OSError:
                    return
                if not 200 <= r.status < 300:
                    continue
                with lock:
                    acked.append((m, key, body, r))
                nbody = harness.dumps(ch.body(r.json()["id"], body["amount"]))
                try:
                    n = ch.post(nbody)
                except OSError:
                    return
                if n.status == 200:
                    with lock:
                        credited[m.id] = credited.get(m.id, 0) + body["amount"]

        threads = [threading.Thread(target=client, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with lock:
                if len(acked) >= 150:
                    break
            time.sleep(0.05)
        s1.send_signal(signal.SIGKILL)
        s1.proc.wait(10)
        stop.set()
        for t in threads:
            t.join(30)
        s1.stop()
        self.assertGreater(len(acked), 20, "too little load reached idemd before the kill")

        s2 = self.start(db_url=s1.db_url, tmpdir=s1.tmpdir)
        for m, key, body, first in acked:
            m2 = m.on(s2)
            p = m2.payment(first.json()["id"])
            self.assertEqual(p["amount"], body["amount"])
            again = m2.post("/v1/payments", body, key=key)
            self.assertEqual((again.status, again.body, again.header("Idempotent-Replayed")),
                             (first.status, first.body, "true"))
        ledger = s2.ledger_check()
        for m in merchants:
            # A credit may have committed without its answer arriving before
            # the kill; one that was acknowledged must be there.
            self.assertGreaterEqual(m.on(s2).balance("CNY"), credited.get(m.id, 0))
            if ledger is not None:
                self.assertEqual(ledger.get((m.id, "CNY"), 0), m.on(s2).balance("CNY"))
        s2.stop_checked()


if __name__ == "__main__":
    unittest.main(verbosity=2)
