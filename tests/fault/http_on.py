"""Run one file of the HTTP suite (tests/http/test_*.py) against a fresh
database on a PostgreSQL or MariaDB server:

    python3 tests/fault/http_on.py postgres|mariadb tests/http/test_money.py

Creates idem_h_<random> on the shared server of the test run ($IDEM_TEST_PG_URL
/ $IDEM_TEST_MARIADB_URL, exported by scripts/run-tests.sh), or on a private
throwaway server when that is not set, runs the file with IDEM_TEST_DB_URL
naming that database, drops the database afterwards and exits with the file's
exit code. No server binary: SKIPPED (exit 77), or a failure when CI is set.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbserver  # noqa: E402


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in dbserver.BACKENDS:
        sys.stderr.write("usage: http_on.py postgres|mariadb TEST_FILE [args]\n")
        return 2
    backend, test = sys.argv[1], sys.argv[2]
    dbserver.preflight(backend, private=False)
    with dbserver.server_for(backend) as admin:
        db = dbserver.Database(admin, "h")
        sys.stderr.write("%s on %s database %s\n" % (os.path.basename(test), backend, db.name))
        sys.stderr.flush()
        try:
            env = dict(os.environ, IDEM_TEST_DB_URL=db.url)
            p = subprocess.run([sys.executable, test] + sys.argv[3:], env=env,
                               stdin=subprocess.DEVNULL, timeout=900)
            return p.returncode
        finally:
            db.drop()


if __name__ == "__main__":
    sys.exit(main())
