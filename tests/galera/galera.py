"""The Galera cluster and the checks the Galera tests share (Python 3 stdlib).

Cluster: the 3-node cluster scripts/run-tests.sh started with
scripts/galera-up.sh ($IDEM_TEST_GALERA_STATE / $IDEM_TEST_GALERA_URLS), or,
run by hand without them, a cluster of the test's own that it stops at the
end. A test may kill -9 a node (its mariadbd.pid) and start it again (its
start.sh); every test leaves the cluster as it found it: all nodes Synced
in one primary component.

Client: one logical request sent to several idemd (one per node) with the
retry discipline API.md asks of a client: a 503 or a transport error is
retried, failing over to the next instance, until an answer that is not 503
comes back. Every answer is recorded with its time and instance, so a test
can say which answers came when.
"""

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "fault"))
import dbserver  # noqa: E402
from dbserver import harness  # noqa: E402

SCRIPTS = os.path.join(REPO, "scripts")


def note(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def preflight():
    """Skip (exit 77) or fail in CI when idemd or the Galera binaries are absent."""
    dbserver.require_idemd()
    if os.environ.get("IDEM_TEST_GALERA_SKIP"):
        dbserver.skip_or_fail(os.environ["IDEM_TEST_GALERA_SKIP"])
    if os.environ.get("IDEM_TEST_GALERA_STATE"):
        return
    for need in ("/usr/sbin/mariadbd", "/usr/lib/galera/libgalera_smm.so"):
        if not os.path.exists(need):
            dbserver.skip_or_fail("no Galera cluster: %s is missing" % need)


class Cluster:
    def __init__(self):
        self.own = False
        state = os.environ.get("IDEM_TEST_GALERA_STATE")
        urls = os.environ.get("IDEM_TEST_GALERA_URLS")
        if not state or not urls:
            note("note: IDEM_TEST_GALERA_STATE not set: starting a cluster of this test's own")
            p = subprocess.run([os.path.join(SCRIPTS, "galera-up.sh"), "3"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
            if p.returncode != 0:
                raise RuntimeError("galera-up.sh failed: %s" % p.stderr.decode(errors="replace"))
            env = dict(part.partition("=")[::2] for part in shlex.split(p.stdout.decode())[1:])
            state, urls = env["IDEM_TEST_GALERA_STATE"], env["IDEM_TEST_GALERA_URLS"]
            self.own = True
        self.state = state
        self.urls = urls.split(",")
        self.n = len(self.urls)

    def close(self):
        if self.own:
            subprocess.run([os.path.join(SCRIPTS, "galera-down.sh"), self.state],
                           stdin=subprocess.DEVNULL, timeout=120)

    # -- one node (0-based)
    def dir(self, i):
        return os.path.join(self.state, "n%d" % (i + 1))

    def pid(self, i):
        try:
            with open(os.path.join(self.dir(i), "mariadbd.pid")) as f:
                pid = int(f.read().strip())
            os.kill(pid, 0)
            return pid
        except (OSError, ValueError):
            return None

    def kill(self, i):
        """kill -9 node i's mariadbd; returns once the process is gone."""
        pid = self.pid(i)
        assert pid, "node %d is not running" % (i + 1)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except OSError:
                return
            time.sleep(0.02)
        raise AssertionError("node %d survived SIGKILL" % (i + 1))

    def start(self, i):
        subprocess.run([os.path.join(self.dir(i), "start.sh")], check=True,
                       stdin=subprocess.DEVNULL, timeout=120)

    def status(self, i):
        """wsrep status of node i as a dict, {} when it does not answer."""
        sock = os.path.join(self.dir(i), "mysql.sock")
        try:
            p = subprocess.run(["mariadb", "--no-defaults", "-S", sock, "-u", "root", "-N", "-B",
                                "-e", "SHOW GLOBAL STATUS LIKE 'wsrep_%'"],
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            return {}
        if p.returncode != 0:
            return {}
        out = {}
        for line in p.stdout.decode().splitlines():
            k, _, v = line.partition("\t")
            out[k] = v
        return out

    def describe(self, lines=15):
        """Every node's process, wsrep state and the end of its server.log:
        what a failed wait needs to be understood after the cluster is gone."""
        out = []
        for i in range(self.n):
            st = self.status(i)
            out.append("node %d: pid %s, %s" % (
                i + 1, self.pid(i), {k: st.get(k) for k in (
                    "wsrep_local_state_comment", "wsrep_cluster_status",
                    "wsrep_cluster_size", "wsrep_ready")} if st else "not answering"))
            try:
                with open(os.path.join(self.dir(i), "server.log"), errors="replace") as f:
                    tail = f.readlines()[-lines:]
                out.extend("  | " + line.rstrip() for line in tail)
            except OSError as e:
                out.append("  (no server.log: %s)" % e)
        return "\n".join(out)

    def wait(self, i, size, primary=True, timeout=90):
        """Until node i is Synced in a primary component of size nodes (or,
        primary False, non-primary). Returns the seconds it took."""
        t0 = time.monotonic()
        last = {}
        while time.monotonic() - t0 < timeout:
            last = self.status(i)
            if primary and last.get("wsrep_local_state_comment") == "Synced" and \
                    last.get("wsrep_cluster_status") == "Primary" and \
                    last.get("wsrep_cluster_size") == str(size):
                return time.monotonic() - t0
            if not primary and last and last.get("wsrep_cluster_status") != "Primary":
                return time.monotonic() - t0
            time.sleep(0.2)
        raise AssertionError("node %d: not %s with %d nodes within %ds: %r\n%s"
                             % (i + 1, "Synced" if primary else "non-primary", size, timeout,
                                {k: last.get(k) for k in ("wsrep_local_state_comment",
                                                          "wsrep_cluster_status",
                                                          "wsrep_cluster_size")},
                                self.describe()))

    def heal(self, timeout=120):
        """Start every node that is down and wait until all are Synced."""
        for i in range(self.n):
            if self.pid(i) is None:
                self.start(i)
        for i in range(self.n):
            self.wait(i, self.n, timeout=timeout)


class Setup:
    """A fresh database on the cluster and one idemd per node."""

    def __init__(self, cluster, args=("--threads", "8")):
        # IDEM_GALERA_IDEMD_ARGS: more idemd options, e.g. "--batch-max 1".
        args = list(args) + os.environ.get("IDEM_GALERA_IDEMD_ARGS", "").split()
        self.cluster = cluster
        cluster.heal()
        self.db = dbserver.Database(cluster.urls[0], "g")
        self.servers = []
        # The first idemd migrates the schema; the others find it current.
        for url in cluster.urls:
            s = harness.Server(list(args), db_url=dbserver.with_db(url, self.db.name))
            self.servers.append(s)
            s.start()

    def close(self):
        bad = []
        for s in self.servers:
            if os.environ.get("IDEM_TEST_KEEP"):
                note("idemd log kept: %s" % s.log_path)
            rc = s.stop()
            if rc != 0:
                bad.append("idemd did not exit 0 on SIGTERM (rc=%r)\n%s" % (rc, s.log_tail()))
            s.cleanup()
        self.db.drop()
        return bad


class ClusterTest(unittest.TestCase):
    """A test class on the cluster with one idemd per node: cls.cluster,
    cls.setup (its servers, its database). Afterwards every node killed is
    started again and all are Synced, the idemd stopped (each must exit 0),
    the database dropped."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster()
        try:
            cls.setup = Setup(cls.cluster)
        except Exception:
            cls.cluster.close()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.cluster.heal()
            bad = cls.setup.close()
        finally:
            cls.cluster.close()
        if bad:
            raise AssertionError("\n".join(bad))


def main():
    """A test script's entry: skip when there is no cluster, else its tests."""
    preflight()
    unittest.main(module="__main__", verbosity=2)


class NodeDb:
    """SQL on one node's copy of the test database (for ledger_sql)."""

    def __init__(self, cluster, setup, i):
        self.url = dbserver.with_db(cluster.urls[i], setup.db.name)

    def sql(self, query):
        return dbserver.sql(self.url, query)


# ---- a client that retries ----------------------------------------------------

class Answers:
    """Every answer any call got: (t, instance, status, code, replayed)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows = []

    def add(self, t, inst, status, code, replayed):
        with self.lock:
            self.rows.append((t, inst, status, code, replayed))

    def bad(self, allowed=(200, 201, 503)):
        """Answers outside allowed, and 503s that are not store_unavailable."""
        with self.lock:
            return [r for r in self.rows if r[2] not in allowed or
                    (r[2] == 503 and r[3] != "store_unavailable")]


def code_of(r):
    if r.status >= 400:
        try:
            return r.json().get("code")
        except AssertionError:
            return None
    return None


def call(answers, insts, first, fn, deadline, pause=0.1):
    """fn(inst) -> Response. Sent to insts[first]; on a 503 or a transport
    error, sent again to the next instance, until another answer or the
    deadline. Returns the final Response (None at the deadline)."""
    k = first
    while time.monotonic() < deadline:
        inst = k % len(insts)
        try:
            r = fn(inst)
        except OSError:
            answers.add(time.monotonic(), inst, "transport", None, False)
            r = None
        if r is not None:
            answers.add(time.monotonic(), inst, r.status, code_of(r), r.replayed)
            if r.status != 503:
                return r
        k += 1
        time.sleep(pause)
    return None


storm = harness.storm  # the barrier-released burst the suites share


def ledger_sql(db):
    """{merchant: balance} from balances, asserting each equals its ledger sum."""
    bal = {r[0]: int(r[1]) for r in db.sql(
        "SELECT merchant_id, amount FROM balances WHERE currency = 'CNY'")}
    led = {r[0]: int(r[1]) for r in db.sql(
        "SELECT merchant_id, SUM(amount) FROM ledger_entries WHERE currency = 'CNY'"
        " GROUP BY merchant_id")}
    assert bal == led, "balances differ from their ledger sums: %r vs %r" % (bal, led)
    return bal


# ---- steady traffic across the instances ---------------------------------------

class Traffic:
    """workers threads, each running logical operations one after the other
    until stop(): a payment (an Idempotency-Key), then its SUCCESS
    notification, each sent as two copies at once that start on two
    different instances and fail over with call(). Every answer goes to
    self.answers; self.acked holds what the client saw acknowledged:
    (merchant, order, amount, payment id, notified). A logical operation
    whose copies end in different resources, or in anything but 201 / 200,
    is a wrong answer (self.wrong)."""

    def __init__(self, setup, merchants, channel, insts=None, workers=4, per_call=90):
        self.setup = setup
        self.ms = merchants
        self.ch = channel
        self.insts = list(range(len(setup.servers))) if insts is None else insts
        self.workers = workers
        self.per_call = per_call
        self.answers = Answers()
        self.acked = []
        self.wrong = []
        self.unfinished = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = []
        self.on = {s: {m.id: m.on(setup.servers[s]) for m in merchants}
                   for s in range(len(setup.servers))}
        self.chan = {s: harness.Channel(setup.servers[s], channel.name, channel.secret)
                     for s in range(len(setup.servers))}

    def _pair(self, first, fn):
        """Two copies of fn at once, starting on insts[first] and the next."""
        out = [None, None]
        deadline = time.monotonic() + self.per_call

        def one(j):
            out[j] = call(self.answers, self.insts, first + j, fn, deadline)
        ts = [threading.Thread(target=one, args=(j,), daemon=True) for j in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(self.per_call + 30)
        return out

    def _work(self, w):
        n = 0
        while not self._stop.is_set():
            m = self.ms[(w + n) % len(self.ms)]
            amount = 100 + 7 * w + n
            body = m.payment_body(amount, "CNY", self.ch.name)
            key = harness.uid("GK")
            rs = self._pair(w + n, lambda i: self.on[self.insts[i]][m.id].post(
                "/v1/payments", body, key=key))
            n += 1
            if any(r is None for r in rs):
                with self.lock:
                    self.unfinished.append(("payment", body["merchant_order_no"]))
                continue
            ids = {r.json().get("id") if r.status == 201 else None for r in rs}
            if [r.status for r in rs] != [201, 201] or len(ids) != 1:
                with self.lock:
                    self.wrong.append(("payment", [(r.status, r.body[:200]) for r in rs]))
                continue
            pid = ids.pop()
            nb = harness.dumps(self.ch.body(pid, amount, "SUCCESS", harness.uid("N")))
            rs = self._pair(w + n, lambda i: self.chan[self.insts[i]].post(nb))
            notified = all(r is not None for r in rs)
            if notified and [(r.status, r.json()) for r in rs] != \
                    [(200, {"result": "success"})] * 2:
                with self.lock:
                    self.wrong.append(("notification", [(r.status, r.body[:200]) for r in rs]))
                continue
            with self.lock:
                self.acked.append((m, body["merchant_order_no"], amount, pid, notified))
                if not notified:
                    self.unfinished.append(("notification", pid))

    def start(self):
        for w in range(self.workers):
            t = threading.Thread(target=self._work, args=(w,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(self.per_call + 60)
        assert not any(t.is_alive() for t in self._threads), "traffic did not stop"

    def successes(self, insts, since, until=None):
        """Completion times of the 2xx answers from insts in [since, until)."""
        with self.answers.lock:
            return sorted(r[0] for r in self.answers.rows if r[1] in insts and
                          isinstance(r[2], int) and 200 <= r[2] < 300 and r[0] >= since and
                          (until is None or r[0] < until))

    def expected(self):
        out = {m.id: 0 for m in self.ms}
        for m, _order, amount, _pid, notified in self.acked:
            if notified:
                out[m.id] += amount
        return out


def longest_gap(times, start, end):
    """The longest stretch in [start, end] without any of times."""
    last, gap = start, 0.0
    for t in times:
        if t < start or t > end:
            continue
        gap = max(gap, t - last)
        last = t
    return max(gap, end - last)


def check_exactly_once(tc, cluster, setup, traffic):
    """On every node, in SQL: each acknowledged order is one payment, the
    number of payments is the number of logical payments acknowledged, and
    every balance equals its ledger sum and the client's total; the same
    balances through every instance's API."""
    expected = traffic.expected()
    ids = ",".join("'%s'" % m.id for m in traffic.ms)
    for side in range(cluster.n):
        node = NodeDb(cluster, setup, side)
        db = node.url
        rows = dbserver.sql(db, "SELECT merchant_id, merchant_order_no, count(*) FROM payments"
                            " GROUP BY merchant_id, merchant_order_no HAVING count(*) > 1")
        tc.assertEqual(rows, [], "node %d: order numbers with two payments" % (side + 1))
        n = int(dbserver.sql(db, "SELECT count(*) FROM payments WHERE merchant_id IN (%s)"
                             % ids)[0][0])
        tc.assertEqual(n, len(traffic.acked), "node %d: payments in SQL vs acknowledged"
                       % (side + 1))
        credits = int(dbserver.sql(db, "SELECT count(*) FROM ledger_entries WHERE"
                                   " merchant_id IN (%s)" % ids)[0][0])
        tc.assertEqual(credits, sum(1 for a in traffic.acked if a[4]),
                       "node %d: ledger entries vs acknowledged notifications" % (side + 1))
        got = ledger_sql(node)
        tc.assertEqual({k: got.get(k, 0) for k in expected}, expected,
                       "node %d: balances differ from the client's totals" % (side + 1))
    for s in range(len(setup.servers)):
        for m in traffic.ms:
            tc.assertEqual(m.on(setup.servers[s]).balance("CNY"), expected[m.id],
                           "balance of %s through instance %d" % (m.id, s + 1))
