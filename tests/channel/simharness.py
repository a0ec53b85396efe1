"""Test glue for the channel simulator (tools/chansim/chansim.py).

Sim starts chansim as a subprocess on a free port and drives its /_sim/
control API. check_invariants() checks CHANNEL.md's five invariants from the
simulator's records and idemd's state (tests/http/harness.py's Server and
Merchant)."""

import json
import os
import subprocess
import sys
import tempfile
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

    def pay(self, out_trade_no, status="SUCCESS"):
        """(http status, body): moves a PENDING order and notifies."""
        return self._answer("POST", "/_sim/pay/" + out_trade_no, {"status": status})

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
