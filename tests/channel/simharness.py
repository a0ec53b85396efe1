"""Test glue for the channel simulator (tools/chansim/chansim.py).

Sim starts chansim as a subprocess on a free port and drives its /_sim/
control API. check_invariants() checks CHANNEL.md's five invariants from the
simulator's records and idemd's state (tests/http/harness.py's Server and
Merchant)."""

import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHANSIM = os.path.join(ROOT, "tools", "chansim", "chansim.py")
FAST_SCHEDULE_MS = [50, 50, 100, 200, 400, 800]


class Sim:
    """One simulated channel. start() returns self; url is the --base-url."""

    def __init__(self):
        self.proc = None
        self.port = None
        self.log_path = None
        self._tmp = None

    def start(self, secret="", schedule=None, host="127.0.0.1"):
        self._tmp = tempfile.mkdtemp(prefix="chansim-")
        self.log_path = os.path.join(self._tmp, "chansim.log")
        args = [sys.executable, CHANSIM, "--port", "0", "--host", host, "--secret", secret or "",
                "--log", self.log_path]
        if schedule is not None:
            args += ["--notify-schedule-ms", ",".join(str(int(x)) for x in schedule)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("listening on "):
            err = self.proc.stderr.read().decode() if self.proc.poll() is not None else ""
            raise RuntimeError("chansim did not start: %r %s" % (line, err))
        self.port = int(line.split()[-1])
        self.host = host
        end = time.monotonic() + 5
        while True:
            try:
                self._get("/_sim/health")
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
        return self

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None:
            for f in (self.proc.stdout, self.proc.stderr):
                if f:
                    f.close()
        self.proc = None

    def log_text(self):
        try:
            with open(self.log_path) as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    # ---- control API ---------------------------------------------------
    def _req(self, method, path, body=None, timeout=10):
        data = None if body is None else json.dumps(body).encode()
        rq = urllib.request.Request(self.url + path, data=data, method=method,
                                    headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(rq, timeout=timeout) as r:
            return json.loads(r.read())

    def _get(self, path):
        return self._req("GET", path)

    def config(self, **kw):
        """POST /_sim/config; raises urllib.error.HTTPError on a 400."""
        return self._req("POST", "/_sim/config", kw)

    def set_secret(self, secret):
        return self.config(secret=secret)

    def faults(self, *faults):
        return self.config(faults=list(faults))

    def reset(self):
        return self._req("POST", "/_sim/reset", {})

    def calls(self):
        return self._get("/_sim/calls")

    def orders(self):
        return self._get("/_sim/orders")

    def refunds(self):
        return self._get("/_sim/refunds")

    def notifications(self):
        return self._get("/_sim/notifications")

    def pending_notifications(self):
        return self._get("/_sim/pending")

    def _answer(self, method, path, body):
        try:
            r = self._req(method, path, body)
            return 200, r
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def pay(self, out_trade_no, status="SUCCESS", amount=None):
        """(http status, body): moves a PENDING order and notifies."""
        body = {"status": status}
        if amount is not None:
            body["amount"] = amount
        return self._answer("POST", "/_sim/pay/" + out_trade_no, body)

    def refund_set(self, out_refund_no, status="SUCCESS"):
        return self._answer("POST", "/_sim/refund/" + out_refund_no, {"status": status})

    def order_map(self):
        return {o["out_trade_no"]: o for o in self.orders()}

    def wait_notifications_settled(self, timeout=10.0):
        """Wait until every notification is delivered or given up."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            p = self.pending_notifications()
            if all(n["delivered"] or n["gave_up"] for n in p):
                return p
            time.sleep(0.05)
        return self.pending_notifications()


# ---- idemd side ----------------------------------------------------------------

sys.path.insert(0, os.path.join(ROOT, "tests", "http"))
import harness  # noqa: E402

SKIP = 77
FINAL_OK = ("succeeded", "partially_refunded", "refunded")


def in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_channel_support():
    """Exit 77 (a failure when CI is set) when this idemd has no channel
    connectors yet (no --channel-workers in its --help)."""
    try:
        p = subprocess.run([harness.idemd_path(), "--help"], capture_output=True, timeout=10)
        text = (p.stdout + p.stderr).decode(errors="replace")
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
        text = str(e)
    if "--channel-workers" in text:
        return
    msg = "idemd has no channel connectors (--channel-workers missing from --help)"
    if in_ci():
        sys.stderr.write("FAILED: %s\n" % msg)
        sys.exit(1)
    sys.stderr.write("SKIPPED: %s\n" % msg)
    sys.exit(SKIP)


def server_args(sweep_interval_ms=200, sweep_age_ms=1500, workers=None, queue=None,
                public_url=None, extra=()):
    a = ["--sweep-interval-ms", str(sweep_interval_ms), "--sweep-age-ms", str(sweep_age_ms)]
    if workers is not None:
        a += ["--channel-workers", str(workers)]
    if queue is not None:
        a += ["--channel-queue", str(queue)]
    if public_url is not None:
        a += ["--public-url", public_url]
    return a + list(extra)


def add_channel(server, sim, name=None, timeout_ms=1000):
    """idemctl channel add NAME --base-url SIM; the secret goes to the sim too."""
    name = name or "ch" + uuid_hex()
    args = ["--json", "channel", "add", name, "--base-url", sim.url]
    if timeout_ms is not None:
        args += ["--timeout-ms", str(timeout_ms)]
    d = json.loads(server.idemctl(*args))
    assert d["channel"] == name, d
    sim.set_secret(d["secret"])
    return harness.Channel(server, name, d["secret"])


def uuid_hex(n=10):
    import secrets
    return secrets.token_hex(n // 2)


def sign(secret, data):
    return harness.sign(secret, data)


def channel_call(sim, secret, method, path, body=None, timeout=10):
    """A signed call to the simulator as idemd would make it: (status, json)."""
    import http.client
    data = None if body is None else harness.dumps(body)
    h = {"Content-Type": "application/json",
         "X-Signature": sign(secret, data if method == "POST" else path.encode())}
    c = http.client.HTTPConnection(sim.host, sim.port, timeout=timeout)
    try:
        c.request(method, path, body=data, headers=h)
        r = c.getresponse()
        raw = r.read()
    finally:
        c.close()
    try:
        return r.status, json.loads(raw)
    except ValueError:
        return r.status, None


def find_payment(merchants, payment_id):
    """(merchant, payment) of the merchant that owns payment_id, or (None, None)."""
    for m in merchants:
        r = m.get("/v1/payments/" + payment_id)
        if r.status == 200:
            return m, r.json()
    return None, None


def payment_by_order(m, merchant_order_no):
    r = m.get("/v1/payments?merchant_order_no=" + merchant_order_no)
    return r.json() if r.status == 200 else None


def invariant_violations(sim, server, merchants, orders=(), got201=(), keys=(),
                         extra_balance=None, currency="CNY", channels=None):
    """CHANNEL.md's five invariants; a list of what is violated (empty: all hold).

    merchants  every Merchant (on the current server) that made channel payments
    orders     (merchant, merchant_order_no) the test attempted
    got201     payment ids some client got 201 for
    keys       (merchant, idempotency key) of the payments the test sent
    extra_balance  {merchant_id: amount} credited outside the channel's orders
    channels   channel names the sim serves (payments on them must be backed)
    """
    bad = []
    sorders = sim.order_map()
    calls = sim.calls()
    refunded = {}
    for rf in sim.refunds():
        if rf["status"] in ("SUCCESS", "PROCESSING"):
            refunded[rf["out_trade_no"]] = refunded.get(rf["out_trade_no"], 0) + rf["amount"]
    create_nos = [c["number"] for c in calls if c.get("call") == "create" and c.get("number")]
    # a number closed but never created since the simulator's last reset: the
    # sweeper closing a payment of an earlier test (the sim forgot its order)
    for no in [n for n, o in sorders.items() if o["tombstone"] and n not in create_nos]:
        if find_payment(merchants, no)[1] is None:
            del sorders[no]
    numbers = set(create_nos) | set(sorders)
    owner = {}
    for no in sorted(numbers):
        m, p = find_payment(merchants, no)
        if p is None:
            if no in sorders:
                bad.append("2: channel order %s (%s) maps to no payment idemd knows"
                           % (no, sorders[no]["status"]))
            else:
                bad.append("1: a create carried out_trade_no %s, no payment of idemd" % no)
            continue
        owner[no] = (m, p)
    # 1. one out_trade_no per payment
    groups = {}
    for no, (m, p) in owner.items():
        groups.setdefault((m.id, p["merchant_order_no"]), set()).add(no)
    for (mid, mon), nos in groups.items():
        if len(nos) != 1:
            bad.append("1: payment %s/%s went to the channel under %d numbers: %s"
                       % (mid, mon, len(nos), sorted(nos)))
    tracked = {}
    for m, mon in orders:
        p = payment_by_order(m, mon)
        if p is None:
            continue
        tracked[p["id"]] = (m, p)
        nos = groups.get((m.id, mon), set())
        if nos and nos != {p["id"]}:
            bad.append("1: payment %s (%s) but the channel saw %s" % (p["id"], mon, sorted(nos)))
    allp = dict(tracked)
    allp.update(owner)
    # 3. SUCCESS at the channel <=> credited once at idemd
    expected = {m.id: 0 for m in merchants}
    success_amounts = {m.id: [] for m in merchants}
    for pid, (m, p) in sorted(allp.items()):
        o = sorders.get(pid)
        ost = o["status"] if o and not o["tombstone"] else None
        if channels is not None and p.get("channel") not in channels:
            continue
        if ost == "SUCCESS":
            if p["status"] not in FINAL_OK:
                bad.append("3: order %s is SUCCESS at the channel, payment is %s"
                           % (pid, p["status"]))
            else:
                expected[m.id] += p["amount"] - p.get("refunded_amount", 0)
                success_amounts[m.id].append(p["amount"])
        elif p["status"] in FINAL_OK:
            bad.append("3: payment %s is %s but the channel order is %s"
                       % (pid, p["status"], ost or "absent"))
        if p.get("refunded_amount", 0) != refunded.get(pid, 0):
            bad.append("3: payment %s refunded_amount %d, the channel's refunds of it %d"
                       % (pid, p.get("refunded_amount", 0), refunded.get(pid, 0)))
        if p["status"] == "processing" and ost != "PENDING":
            bad.append("3: payment %s is processing but the channel order is %s"
                       % (pid, ost or "absent"))
        if p["status"] == "failed" and ost in ("PENDING",):
            bad.append("3: payment %s is failed but the channel order is still PENDING" % pid)
        # 4. nothing left creating
        if p["status"] == "creating":
            bad.append("4: payment %s is still creating (channel: %s)" % (pid, ost or "absent"))
    for m in merchants:
        want = expected[m.id] + (extra_balance or {}).get(m.id, 0)
        got = m.balance(currency)
        if got != want:
            bad.append("3: merchant %s balance %d, channel SUCCESS orders say %d"
                       % (m.id, got, want))
        rows = server.ledger_rows(m.id)
        if rows is not None and not extra_balance:
            credits = sorted(a for c, a in rows if c == currency and a > 0)
            if credits != sorted(success_amounts[m.id]):
                bad.append("3: merchant %s ledger credits %s, SUCCESS orders %s"
                           % (m.id, credits, sorted(success_amounts[m.id])))
    # 4. no record left PROCESSING
    for m, key in keys:
        r = m.record("payment", key)
        if r.status == 200 and str(r.json().get("status", "")).lower() == "processing":
            bad.append("4: record payment/%s is still PROCESSING" % key)
    # 5. no 201 for an order the channel does not have
    for pid in got201:
        o = sorders.get(pid)
        if o is None or o["tombstone"]:
            bad.append("5: a client got 201 for %s, the channel has no such order" % pid)
    return bad


def check_invariants(sim, server, merchants, within=0.0, **kw):
    """Raise AssertionError unless the five invariants hold (retrying for up to
    `within` seconds while the sweeper and notifications settle)."""
    end = time.monotonic() + within
    while True:
        bad = invariant_violations(sim, server, merchants, **kw)
        if not bad or time.monotonic() >= end:
            break
        time.sleep(0.25)
    if bad:
        raise AssertionError("CHANNEL.md invariants violated:\n  " + "\n  ".join(bad[:40]))
    return True



def retry_storm(work, send, definite, clients=32, seconds=35.0, pause=(0.02, 0.15)):
    """clients threads retry the items of work (dicts with "done": None) that
    have no definite answer yet, picked at random, until every item has one
    or seconds have passed. send(w, rng) sends w once and returns the
    response; an OSError is counted and retried 50 ms later. definite(r,
    code) says whether r (code: its problem code or None) settles w; every
    answer is appended to w["answers"] and the first definite one becomes
    w["done"]. A client pauses a random time in pause after an answer that
    is not definite. Returns (elapsed seconds, {"status code": count},
    {"status code": first such response})."""
    lock = threading.Lock()
    stop = threading.Event()
    stats = {}
    samples = {}

    def client(seed):
        rng = random.Random(seed)
        while not stop.is_set():
            with lock:
                open_ = [w for w in work if w["done"] is None]
            if not open_:
                return
            w = rng.choice(open_)
            try:
                r = send(w, rng)
            except OSError:
                with lock:
                    stats["oserror"] = stats.get("oserror", 0) + 1
                time.sleep(0.05)
                continue
            code = (r.json() or {}).get("code") if r.status >= 400 else None
            settled = definite(r, code)
            with lock:
                k = "%d %s" % (r.status, code or "")
                stats[k] = stats.get(k, 0) + 1
                samples.setdefault(k, r)
                w.setdefault("answers", []).append(r)
                if settled and w["done"] is None:
                    w["done"] = r
            if not settled:
                time.sleep(rng.uniform(*pause))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while time.monotonic() - t0 < seconds:
        with lock:
            if all(w["done"] is not None for w in work):
                break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(30)
    return time.monotonic() - t0, stats, samples

def metric(server, name, **labels):
    """Sum of the /metrics samples named name whose labels include labels."""
    r = server.request("GET", "/metrics")
    total = 0.0
    found = False
    for line in r.body.decode(errors="replace").splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, val = line.rpartition(" ")
        mname, _, lab = head.partition("{")
        if mname != name:
            continue
        lab = lab.rstrip("}")
        have = dict(kv.split("=", 1) for kv in _split_labels(lab))
        if all(have.get(k) == '"%s"' % v for k, v in labels.items()):
            total += float(val)
            found = True
    return total if found else None


def _split_labels(s):
    out, cur, q = [], "", False
    for ch in s:
        if ch == '"':
            q = not q
        if ch == "," and not q:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return [x for x in out if "=" in x]


# ---- a test class: one idemd, one simulated channel ------------------------------

import unittest  # noqa: E402

uid = harness.uid


class ChannelCase(unittest.TestCase):
    """One idemd (SERVER_KW for server_args) and one chansim per class; the
    simulator's state is reset before every test."""

    SERVER_KW = {}
    TIMEOUT_MS = 1000
    SCHEDULE_MS = FAST_SCHEDULE_MS
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.sim = Sim().start("", cls.SCHEDULE_MS)
        cls.server = harness.Server(server_args(**cls.SERVER_KW))
        try:
            cls.server.start()
            cls.ch = add_channel(cls.server, cls.sim, timeout_ms=cls.TIMEOUT_MS)
        except Exception:
            cls.server.cleanup()
            cls.sim.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.server.stop_checked()
        finally:
            cls.server.cleanup()
            cls.sim.stop()

    def setUp(self):
        self.sim.reset()

    def fail_with_logs(self, msg):
        self.fail("%s\n--- idemd log ---\n%s\n--- chansim log ---\n%s"
                  % (msg, self.server.log_tail(40), "\n".join(self.sim.log_text().splitlines()[-40:])))

    def check(self, merchants, within=8.0, **kw):
        try:
            check_invariants(self.sim, self.server, merchants, within=within, **kw)
        except AssertionError as e:
            self.fail_with_logs(str(e))

    def wait_for(self, pred, timeout=8.0, what="condition"):
        end = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            if time.monotonic() > end:
                self.fail_with_logs("timed out waiting for " + what)
            time.sleep(0.05)

    def wait_status(self, m, payment_id, statuses, timeout=8.0):
        if isinstance(statuses, str):
            statuses = (statuses,)
        last = {}

        def done():
            last["p"] = m.payment(payment_id)
            return last["p"]["status"] in statuses

        end = time.monotonic() + timeout
        while not done():
            if time.monotonic() > end:
                self.fail_with_logs("payment %s is %s, want %s" % (payment_id, last["p"]["status"],
                                                                  "/".join(statuses)))
            time.sleep(0.05)
        return last["p"]

    # -- payments on the simulated channel
    def body(self, m, amount=1000, order=None, channel=None):
        return m.payment_body(amount, "CNY", channel or self.ch.name, order)

    def creates(self, number=None):
        return [c for c in self.sim.calls() if c.get("call") == "create" and
                (number is None or c.get("number") == number)]

    def assertUnknown(self, r, what=""):
        if r.status != 503:
            self.fail_with_logs("%s: expected 503 channel_unavailable, got %r" % (what, r))
        p = r.json()
        self.assertEqual(p.get("code"), "channel_unavailable", "%s: %r" % (what, r))
        self.assertIsNotNone(r.header("Retry-After"), "%s: no Retry-After: %r" % (what, r))
        self.assertIsNone(r.header("Idempotent-Replayed"), "%s: %r" % (what, r))
        return p

    def assertDeclined(self, r, code, what=""):
        if r.status != 402:
            self.fail_with_logs("%s: expected 402 channel_declined, got %r" % (what, r))
        p = r.json()
        self.assertEqual(p.get("code"), "channel_declined", r)
        self.assertEqual(p.get("channel_code"), code, r)
        return p


def main():
    require_channel_support()
    unittest.main(verbosity=2)


def start_on_port(server, port):
    """server.start() on a given port (a restart that keeps the notify_url the
    channel already holds: the public URL of a real deployment is stable)."""
    saved = harness.free_port
    harness.free_port = lambda: port
    try:
        return server.start()
    finally:
        harness.free_port = saved
