"""No plain compare on secrets (issue 13): a source check over src/.

Every memcmp / strcmp / strncmp / bcmp / strcasecmp / strncasecmp call whose
arguments name a digest, secret, signature, HMAC, MAC, tag or API key must
compare against a constant (a string literal or an UPPER_CASE macro: a
public prefix such as "sk_" or "v1:"); anything else has to go through
CRYPTO_memcmp (pay__digest_equal for key digests). The checker runs on
known-bad snippets first, so it cannot pass by matching nothing.
tests/security/test_digest_compare.c shows the same at run time.
"""

import os
import re
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(REPO, "src")

COMPARE = re.compile(r"\b(memcmp|strcmp|strncmp|bcmp|strcasecmp|strncasecmp)\s*\(")
SENSITIVE = re.compile(r"(digest|secret|hmac|signature|\bsig\b|\bmac\b|\btag\b|api_key|"
                       r"\bkey_out\b|sealed)")


def strip(code):
    """Comments and string/char literals out (literals become "")."""
    code = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n") or " ", code,
                  flags=re.S)
    code = re.sub(r"//[^\n]*", " ", code)
    code = re.sub(r'"(\\.|[^"\\])*"', '""', code)
    return re.sub(r"'(\\.|[^'\\])*'", "0", code)


def call_args(code, start):
    depth, i = 1, start
    while i < len(code) and depth:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
    return code[start:i - 1]


def split_args(args):
    out, depth, cur = [], 0, ""
    for ch in args:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        cur += ch
    out.append(cur.strip())
    return out


def violations(code, name="<snippet>"):
    code = strip(code)
    bad = []
    for m in COMPARE.finditer(code):
        args = split_args(call_args(code, m.end()))
        operands = args[:2]
        if not any(SENSITIVE.search(a) for a in operands):
            continue
        if any(a == '""' or re.fullmatch(r"[A-Z][A-Z0-9_]*", a) for a in operands):
            continue  # against a public constant
        line = code.count("\n", 0, m.start()) + 1
        bad.append("%s:%d: %s(%s)" % (name, line, m.group(1), ", ".join(args)))
    return bad


class ConstantTime(unittest.TestCase):
    def test_checker_catches_known_bad_code(self):
        for snippet in ("if (memcmp(digest, row.digest, 64) == 0) ok();",
                        "return strcmp(s->digest, digest) == 0;",
                        "x = strncmp(secret, other_secret, n);",
                        "if (!memcmp(hmac_want, got, 32))",
                        "bcmp(hmac_out, sig, 32)",
                        "strcasecmp(api_key, stored)"):
            self.assertTrue(violations(snippet), snippet)
        for snippet in ('memcmp(api_key, "sk_", 3)',
                        "strncmp(text, IDEM_SECRETBOX_PREFIX, PREFIX_LEN)",
                        "strcmp(argv[i], \"--secret-key-file\")",
                        "strcmp(t.fingerprint, c->fp)",
                        "/* memcmp(digest, x, 64) */ CRYPTO_memcmp(digest, x, 64)"):
            self.assertEqual(violations(snippet), [], snippet)

    def test_no_plain_compare_on_secrets_in_src(self):
        bad, files = [], 0
        for root, _dirs, names in os.walk(SRC):
            for n in names:
                if n.endswith((".c", ".h")):
                    path = os.path.join(root, n)
                    files += 1
                    with open(path, encoding="utf-8", errors="replace") as f:
                        bad += violations(f.read(), os.path.relpath(path, REPO))
        self.assertGreater(files, 30)
        self.assertEqual(bad, [], "plain compares on secret material:\n" + "\n".join(bad))

    def test_digests_and_signatures_go_through_crypto_memcmp(self):
        def read(rel):
            with open(os.path.join(REPO, rel), encoding="utf-8") as f:
                return strip(f.read())
        auth = read("src/pay/authcache.c")
        m = re.search(r"int pay__digest_equal\([^)]*\)\s*\{(.*?)\n\}", auth, re.S)
        self.assertIsNotNone(m, "pay__digest_equal is gone")
        self.assertIn("CRYPTO_memcmp(a, b, 64)", m.group(1))
        self.assertIn("pay__digest_equal(s->digest, digest)", auth)
        merchants = read("src/pay/merchants.c")
        self.assertIn("pay__digest_equal(digest, row.digest)", merchants)
        chanconfig = read("src/pay/chanconfig.c")
        self.assertIn("CRYPTO_memcmp(want, got, 32)", chanconfig)


if __name__ == "__main__":
    unittest.main(verbosity=2)
