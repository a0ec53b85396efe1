"""Database servers and databases for the fault tests (Python 3 stdlib only).

Two things live here:

- Database: one fresh database (idem_h_<hex>) on a PostgreSQL or MariaDB
  server, created and dropped through the server's own command-line client
  (psql / mariadb) from an admin URL, with a small sql() helper so tests can
  count rows behind the API.

- PgServer / MyServer: a private throwaway server in a temp dir, started the
  way scripts/db-up.sh starts one (loopback, free port, as the postgres /
  mysql system user when run as root), which a test may stop, kill, SIGSTOP,
  SIGCONT and restart on the same data dir and port without disturbing the
  shared servers other suites use. Unlike db-up.sh's servers these keep every
  acknowledged commit across a crash of the server process: PostgreSQL runs
  with synchronous_commit=on (fsync stays off: the kernel keeps what was
  written), InnoDB with innodb_flush_log_at_trx_commit=2 (the log is written
  to the kernel at every commit). Without that, "nothing acknowledged is
  missing" would test the server's settings, not idemd.

server_for(backend) gives an admin URL: the shared server's
($IDEM_TEST_PG_URL / $IDEM_TEST_MARIADB_URL from scripts/run-tests.sh) when
set, else a private server when the binaries exist, else the test is skipped
with a visible message (exit 77), or fails when CI is set.
"""

import glob
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "http"))
import harness  # noqa: E402,F401  (re-exported for the tests)

BACKENDS = ("postgres", "mariadb")
ENV_URL = {"postgres": "IDEM_TEST_PG_URL", "mariadb": "IDEM_TEST_MARIADB_URL"}
SKIP = 77


def in_ci():
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def skip_or_fail(msg):
    """A missing server binary: skipped (exit 77, visibly), but an error in CI."""
    if in_ci():
        sys.stderr.write("FAILED: %s (CI is set: nothing may be skipped; "
                         "scripts/deps.sh --all installs the servers)\n" % msg)
        sys.stderr.flush()
        sys.exit(1)
    sys.stderr.write("SKIPPED: %s (scripts/deps.sh --all installs it)\n" % msg)
    sys.stderr.flush()
    sys.exit(SKIP)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kind_of(url):
    if url.startswith(("postgresql://", "postgres://")):
        return "postgres"
    if url.startswith(("mysql://", "mariadb://")):
        return "mariadb"
    return None


def with_db(url, db):
    """url with its path (the database name) replaced by db."""
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + db, u.query, ""))


def _run(argv, timeout=60, user=None, **kw):
    if user is not None and os.getuid() == 0:
        argv = ["runuser", "-u", user, "--"] + list(argv)
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=timeout, **kw)


# ---- SQL through the command-line clients ------------------------------------

def sql(url, query, timeout=30):
    """Run query on the database url names; returns rows as lists of strings
    (tab-separated output of psql -At / mariadb -NB)."""
    kind = kind_of(url)
    if kind == "postgres":
        argv = ["psql", "-X", "-q", "-A", "-t", "-F", "\t", "-v", "ON_ERROR_STOP=1",
                "-d", url, "-c", query]
        env = None
    elif kind == "mariadb":
        u = urllib.parse.urlsplit(url)
        argv = ["mariadb", "--no-defaults", "--protocol=TCP", "-h", u.hostname or "127.0.0.1",
                "-P", str(u.port or 3306), "-u", urllib.parse.unquote(u.username or "root"),
                "-N", "-B", "-e", query]
        env = dict(os.environ)
        if u.password is not None:
            env["MYSQL_PWD"] = urllib.parse.unquote(u.password)
        db = u.path.lstrip("/")
        if db:
            argv.append(db)
    else:
        raise ValueError("not a server URL: %r" % url)
    p = _run(argv, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (argv[0], p.returncode,
                                                   p.stderr.decode(errors="replace").strip()))
    out = p.stdout.decode()
    return [line.split("\t") for line in out.splitlines() if line != ""]


def scalar(url, query):
    rows = sql(url, query)
    if len(rows) != 1 or len(rows[0]) != 1:
        raise AssertionError("%s: expected one value, got %r" % (query, rows))
    return rows[0][0]


class Database:
    """A fresh database idem_<prefix>_<hex> on the server of admin_url."""

    def __init__(self, admin_url, prefix="h"):
        self.admin_url = admin_url
        self.kind = kind_of(admin_url)
        self.name = "idem_%s_%s" % (prefix, secrets.token_hex(6))
        assert re.fullmatch(r"[a-z0-9_]+", self.name)
        if self.kind == "postgres":
            sql(admin_url, "CREATE DATABASE %s" % self.name)
        else:
            sql(admin_url, "CREATE DATABASE %s CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                % self.name)
        self.url = with_db(admin_url, self.name)

    def sql(self, query):
        return sql(self.url, query)

    def scalar(self, query):
        return scalar(self.url, query)

    def drop(self):
        if self.kind == "postgres":
            q = "DROP DATABASE IF EXISTS %s WITH (FORCE)" % self.name
        else:
            q = "DROP DATABASE IF EXISTS %s" % self.name
        try:
            sql(self.admin_url, q)
        except Exception as e:  # noqa: BLE001 (a server stopped on purpose)
            sys.stderr.write("note: could not drop %s: %s\n" % (self.name, e))


# ---- private throwaway servers -----------------------------------------------

def _children(pid):
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                s = f.read()
        except OSError:
            continue
        fields = s[s.rfind(")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def _tree(pid):
    todo, out = [pid], []
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


class _Private:
    user = None
    kind = None

    def __init__(self):
        self.dir = None
        self.port = None
        self.stopped = []

    def _mkdir(self):
        self.dir = tempfile.mkdtemp(prefix="idem-fault-%s." % self.kind)
        os.chmod(self.dir, 0o755)
        if os.getuid() == 0:
            shutil.chown(self.dir, self.user, None)

    def freeze(self):
        """SIGSTOP every process of the server (the parent first, so it forks
        no new one meanwhile)."""
        self.stopped = []
        root = self.pid()
        os.kill(root, signal.SIGSTOP)
        self.stopped.append(root)
        for p in _tree(root)[1:]:
            try:
                os.kill(p, signal.SIGSTOP)
                self.stopped.append(p)
            except ProcessLookupError:
                pass

    def thaw(self):
        for p in reversed(self.stopped):
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stopped = []

    def log_tail(self, n=30):
        try:
            with open(self.log, "rb") as f:
                return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def cleanup(self):
        if self.stopped:
            self.thaw()
        try:
            self.stop()
        except Exception:  # noqa: BLE001
            pass
        if self.dir and not os.environ.get("IDEM_TEST_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)


class PgServer(_Private):
    kind = "postgres"
    user = "postgres"

    def __init__(self):
        super().__init__()
        self.bin = os.environ.get("IDEM_PG_BIN")
        if not self.bin:
            dirs = glob.glob("/usr/lib/postgresql/*/bin")
            dirs.sort(key=lambda d: [int(x) if x.isdigit() else x
                                     for x in re.split(r"(\d+)", d)])
            self.bin = dirs[-1] if dirs else None

    def available(self):
        return bool(self.bin) and all(os.access(os.path.join(self.bin, b), os.X_OK)
                                      for b in ("initdb", "pg_ctl")) \
            and shutil.which("psql") is not None

    @property
    def data(self):
        return os.path.join(self.dir, "data")

    @property
    def log(self):
        return os.path.join(self.dir, "server.log")

    def admin_url(self):
        return "postgresql://idem@127.0.0.1:%d/postgres" % self.port

    def init(self):
        self._mkdir()
        p = _run([os.path.join(self.bin, "initdb"), "-D", self.data, "-U", "idem",
                  "--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync"],
                 user=self.user, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("initdb failed: %s" % p.stdout.decode(errors="replace"))
        for _ in range(3):
            self.port = free_port()
            if self.start(check=False):
                return self
        raise RuntimeError("PostgreSQL did not start:\n" + self.log_tail())

    def start(self, check=True):
        opts = ("-c listen_addresses=127.0.0.1 -p %d -c unix_socket_directories=%s"
                " -c max_connections=100 -c fsync=off -c synchronous_commit=on"
                " -c full_page_writes=off -c shared_buffers=16MB" % (self.port, self.dir))
        p = _run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-l", self.log, "-w",
                  "-t", "60", "-o", opts, "start"], user=self.user, timeout=90)
        if p.returncode != 0 and check:
            raise RuntimeError("pg_ctl start failed:\n" + self.log_tail())
        return p.returncode == 0

    def pid(self):
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def crash(self):
        """pg_ctl stop -m immediate: no shutdown checkpoint, crash recovery
        on the next start."""
        p = _run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate", "-w",
                  "stop"], user=self.user, timeout=60)
        if p.returncode != 0:
            raise RuntimeError("pg_ctl stop failed: %s" % p.stderr.decode(errors="replace"))

    def stop(self):
        if self.dir and os.path.exists(os.path.join(self.data, "postmaster.pid")):
            _run([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate", "-w",
                  "stop"], user=self.user, timeout=60)


class MyServer(_Private):
    kind = "mariadb"
    user = "mysql"
    password = "idem-fault"

    def __init__(self):
        super().__init__()
        self.bin = shutil.which("mariadbd") or \
            ("/usr/sbin/mariadbd" if os.access("/usr/sbin/mariadbd", os.X_OK) else None)
        self.proc = None

    def available(self):
        return bool(self.bin) and shutil.which("mariadb-install-db") is not None \
            and shutil.which("mariadb") is not None

    @property
    def log(self):
        return os.path.join(self.dir, "server.log")

    @property
    def sock(self):
        return os.path.join(self.dir, "mysql.sock")

    def admin_url(self):
        return "mysql://idem:%s@127.0.0.1:%d/mysql" % (self.password, self.port)

    def _root(self, query):
        return _run(["mariadb", "--no-defaults", "-S", self.sock, "-u", "root", "-e", query],
                    timeout=20)

    def init(self):
        self._mkdir()
        p = _run(["mariadb-install-db", "--no-defaults", "--datadir=" + os.path.join(
            self.dir, "data"), "--auth-root-authentication-method=normal", "--skip-test-db"],
            user=self.user, timeout=180)
        if p.returncode != 0:
            raise RuntimeError("mariadb-install-db failed: %s" % p.stdout.decode(errors="replace"))
        for _ in range(3):
            self.port = free_port()
            if self.start(check=False):
                q = ("CREATE USER 'idem'@'127.0.0.1' IDENTIFIED BY '%s';"
                     " GRANT ALL PRIVILEGES ON *.* TO 'idem'@'127.0.0.1' WITH GRANT OPTION;"
                     % self.password)
                p = self._root(q)
                if p.returncode != 0:
                    raise RuntimeError("CREATE USER: %s" % p.stderr.decode(errors="replace"))
                return self
            self.stop()
        raise RuntimeError("MariaDB did not start:\n" + self.log_tail())

    def start(self, check=True):
        argv = [self.bin, "--no-defaults", "--datadir=" + os.path.join(self.dir, "data"),
                "--socket=" + self.sock, "--port=%d" % self.port, "--bind-address=127.0.0.1",
                "--skip-networking=0", "--skip-name-resolve",
                "--pid-file=" + os.path.join(self.dir, "mariadbd.pid"),
                "--log-error=" + self.log, "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=2", "--innodb-doublewrite=0",
                "--max-connections=150", "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_bin"]
        # Not through runuser: runuser stops itself when its child is
        # SIGSTOPped and would then never reap it. Popen drops privileges
        # itself, so self.proc is mariadbd.
        kw = {}
        if os.getuid() == 0:
            kw = {"user": self.user, "group": self.user, "extra_groups": []}
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, **kw)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self._root("SELECT 1").returncode == 0:
                return True
            time.sleep(0.2)
        if check:
            raise RuntimeError("mariadbd did not start:\n" + self.log_tail())
        return False

    def pid(self):
        with open(os.path.join(self.dir, "mariadbd.pid")) as f:
            return int(f.read().strip())

    def crash(self):
        """SIGKILL mariadbd: InnoDB crash recovery on the next start."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and os.path.exists("/proc/%d" % pid):
            if self.proc is not None:
                self.proc.poll()
            time.sleep(0.05)
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        with_pid = os.path.join(self.dir, "mariadbd.pid")
        if os.path.exists(with_pid):
            os.unlink(with_pid)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            pid = self.pid()
        except (OSError, ValueError):
            self.proc.kill()
            self.proc.wait()
            return
        os.kill(pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self.proc.wait(10)


def preflight(backend, private):
    """Before unittest runs (a SystemExit inside a test is an error, not a
    skip): skip or fail now when a needed binary is absent. private: the test
    always starts its own server; else only when no shared URL is set."""
    require_idemd()
    if private or not os.environ.get(ENV_URL[backend]):
        s = PgServer() if backend == "postgres" else MyServer()
        if not s.available():
            skip_or_fail("no %s server binaries" % ("PostgreSQL" if backend == "postgres"
                                                    else "MariaDB"))


def private_server(backend):
    """A started private server, or skip (exit 77) when its binaries are absent."""
    s = PgServer() if backend == "postgres" else MyServer()
    if not s.available():
        skip_or_fail("no %s server binaries" % ("PostgreSQL" if backend == "postgres"
                                                else "MariaDB"))
    try:
        return s.init()
    except Exception:
        s.cleanup()
        raise


class server_for:
    """Context manager: an admin URL for backend. The shared server of the
    test run when its URL is exported, else a private one."""

    def __init__(self, backend):
        assert backend in BACKENDS, backend
        self.backend = backend
        self.private = None

    def __enter__(self):
        url = os.environ.get(ENV_URL[self.backend])
        if url:
            return url
        sys.stderr.write("note: %s not set: starting a private %s server\n"
                         % (ENV_URL[self.backend], self.backend))
        self.private = private_server(self.backend)
        return self.private.admin_url()

    def __exit__(self, *exc):
        if self.private is not None:
            self.private.cleanup()
        return False


def backend_arg():
    """The backend named by argv[1] (removed from argv, so unittest does not
    see it) or $IDEM_FAULT_BACKEND."""
    b = None
    if len(sys.argv) > 1 and sys.argv[1] in BACKENDS:
        b = sys.argv.pop(1)
    b = b or os.environ.get("IDEM_FAULT_BACKEND")
    if b not in BACKENDS:
        sys.stderr.write("usage: %s postgres|mariadb [unittest args]\n" % sys.argv[0])
        sys.exit(2)
    return b


def require_idemd():
    """The idemd and idemctl binaries, or skip / fail as for a server."""
    try:
        return harness.idemd_path(), harness.idemctl_path()
    except RuntimeError as e:
        skip_or_fail(str(e))
