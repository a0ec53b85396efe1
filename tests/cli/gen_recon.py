#!/usr/bin/env python3
"""Write a reconciliation CSV of N rows (default 1,000,000) for the import
benchmark: the header, then rows with unique channel_txn_ids, one in every
50 quoted, one in every 100 a repeat of an earlier row, CRLF line ends.
Deterministic: the same N gives the same bytes.

  tests/cli/gen_recon.py OUT.csv [ROWS] [MERCHANT_ID]
"""
import sys

HEADER = "channel_txn_id,merchant_id,merchant_order_no,amount,currency,status,paid_at"


def main():
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        return 2
    out = sys.argv[1]
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 1000000
    merchant = sys.argv[3] if len(sys.argv) > 3 else "m_bench"
    with open(out, "w", newline="") as f:
        f.write(HEADER + "\r\n")
        buf = []
        for i in range(rows):
            n = i - 37 if i % 100 == 99 else i  # a repeat of an earlier row
            amount = 100 + (n * 7919) % 1000000
            status = "FAILED" if n % 20 == 0 else "SUCCESS"
            ts = "2026-10-01T%02d:%02d:%02dZ" % (n // 3600 % 24, n // 60 % 60, n % 60)
            if n % 50 == 0:
                buf.append('"TXN-%09d","%s","ORD-%09d","%d","CNY","%s","%s"'
                           % (n, merchant, n, amount, status, ts))
            else:
                buf.append("TXN-%09d,%s,ORD-%09d,%d,CNY,%s,%s"
                           % (n, merchant, n, amount, status, ts))
            if len(buf) >= 10000:
                f.write("\r\n".join(buf) + "\r\n")
                buf = []
        if buf:
            f.write("\r\n".join(buf) + "\r\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
