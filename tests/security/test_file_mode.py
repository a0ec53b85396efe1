"""SQLite database files are created 0600 (issue 16): the main file, its -wal
and its -shm, whoever creates them (idemd or idemctl) and whatever the umask,
since the file holds channel secrets and key digests. Real binaries, real files.
"""

import os
import stat
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "http"))

import harness  # noqa: E402


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


class FileMode(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="idem-mode-")
        self.old_umask = os.umask(0o022)  # the usual default: files would be 0644

    def tearDown(self):
        os.umask(self.old_umask)

    def check_files(self, db):
        for suffix in ("", "-wal", "-shm"):
            path = db + suffix
            if suffix == "" or os.path.exists(path):
                self.assertEqual(mode(path), 0o600, "%s is %o" % (path, mode(path)))

    def test_idemctl_creates_0600(self):
        db = os.path.join(self.tmp, "ctl.db")
        srv = harness.Server(db_url="sqlite:" + db, tmpdir=self.tmp)
        srv.idemctl("merchant", "add", "Mode Test")
        self.check_files(db)

    def test_idemd_creates_0600_with_wal_and_shm(self):
        db = os.path.join(self.tmp, "d.db")
        srv = harness.Server(db_url="sqlite:" + db, tmpdir=os.path.join(self.tmp))
        srv.start()
        try:
            m = srv.new_merchant()
            ch = srv.new_channel()
            m.paid_payment(ch, 100)
            self.assertTrue(os.path.exists(db + "-wal"), "no -wal while idemd runs")
            self.assertTrue(os.path.exists(db + "-shm"), "no -shm while idemd runs")
            self.check_files(db)
        finally:
            srv.stop_checked()
            srv.cleanup()
        self.check_files(db)

    def test_permissive_umask_still_0600(self):
        os.umask(0)
        db = os.path.join(self.tmp, "u.db")
        harness.Server(db_url="sqlite:" + db, tmpdir=self.tmp).idemctl("migrate")
        self.check_files(db)

    def test_existing_file_keeps_its_mode(self):
        # An operator's choice (say 0640 for a backup group) is left alone.
        db = os.path.join(self.tmp, "e.db")
        harness.Server(db_url="sqlite:" + db, tmpdir=self.tmp).idemctl("migrate")
        os.chmod(db, 0o640)
        harness.Server(db_url="sqlite:" + db, tmpdir=self.tmp).idemctl("merchant", "add", "X")
        self.assertEqual(mode(db), 0o640)


if __name__ == "__main__":
    harness.main()
