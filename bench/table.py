#!/usr/bin/env python3
"""bench/table.py: turns run.sh's results (one JSON object per line) into
the markdown table of docs/benchmarks.md and writes it between the markers
<!-- bench:begin --> and <!-- bench:end -->, keeping everything around them.

    table.py RESULTS MACHINE DURATION CONCURRENCY HAS_GC DURABLE [DOC]
"""
import datetime
import json
import sys

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main():
    results, machine, dur, conc, has_gc, durable = sys.argv[1:7]
    doc = sys.argv[7] if len(sys.argv) > 7 else ""
    r = {}
    with open(results) as f:
        for line in f:
            line = line.strip()
            if line:
                d = json.loads(line)
                r[d["key"]] = d
    gc = has_gc == "yes"

    def rps(k):
        return r.get(k, {}).get("rps") or 0

    def answers_of(d):
        st = d.get("status")
        return sum(st.values()) if st else 0

    def cpu_us(k):
        """The server's CPU time per answered request over the run, in µs."""
        d = r.get(k, {})
        n = answers_of(d)
        if "cpu_ticks" not in d or not n:
            return None
        return d["cpu_ticks"] * 1e6 / d.get("clk_tck", 100) / n

    rows = []

    def row(name, a, b, target, note=""):
        va, vb = rps(a), rps(b)
        if a not in r or b not in r:
            return
        ratio = va / vb if vb else 0
        if target is None:
            verdict = ""
        else:
            verdict = "yes" if ratio >= target else "**no**"
        rows.append("| %s | %s | %.0f | %s | %.0f | %.2fx | %s | %s |" % (
            name, a, va, b, vb, ratio,
            "" if target is None else "≥ %gx" % target, verdict + note))

    gc_on = "group commit on (defaults)" if gc else "no group commit in this build"
    row("replay path, cache warm (100 % duplicates, 1,000 hot keys) vs libmicrohttpd static body",
        "replay", "static", 0.8)
    if gc:
        row("first requests, SQLite synchronous=FULL, group commit off (`--batch-max 1`) "
            "vs raw loop 1/commit", "sqlite_first_nogc", "raw_sqlite_1", None)
    row("first requests, SQLite synchronous=FULL, %s vs raw loop 1/commit" % gc_on,
        "sqlite_first", "raw_sqlite_1", 5)
    row("same idemd run vs raw loop 100/commit (does not depend on the disk's minute)",
        "sqlite_first", "raw_sqlite_100", 0.35)
    for db, base, name in (("pg", "pgbench", "PostgreSQL"), ("my", "raw_mariadb", "MariaDB")):
        if gc:
            row("first requests, %s, group commit off vs %s" % (name, base),
                db + "_first_nogc", base, 1)
            row("first requests, %s, group commit on vs %s" % (name, base),
                db + "_first", base, 2)
        else:
            row("first requests, %s (no group commit in this build) vs %s" % (name, base),
                db + "_first", base, 1, " (≥ 2x needs group commit)")
    row("90 %% duplicates over 1,000 hot keys vs all-unique (SQLite, %s)" % gc_on,
        "sqlite_hot90", "sqlite_first", 3)

    def cpu_row(name, k, limit):
        v = cpu_us(k)
        if v is None:
            return
        rows.append("| %s | %s | %.1f µs | | | | ≤ %g µs | %s |" % (
            name, k, v, limit, "yes" if v <= limit else "**no**"))

    cpu_row("idemd CPU per first request (/proc ticks over the run / answers), SQLite FULL, "
            "group commit on", "sqlite_first", 40)
    cpu_row("idemd CPU per replay (/proc ticks over the run / answers)", "replay", 10)
    if "sqlite_first" in r and "p99_ms" in r["sqlite_first"]:
        p99 = r["sqlite_first"]["p99_ms"]
        rows.append("| p99 latency of first requests, SQLite FULL, %s connections | sqlite_first "
                    "| %.2f ms | | | | ≤ 10 ms | %s |" % (conc, p99,
                                                       "yes" if p99 <= 10 else "**no**"))

    out = []
    out.append("Measured %s UTC on %s. %s s per timed run, %s connections "
               "(pgbench / raw client: the same number of clients). Servers %s." % (
                   datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
                   machine, dur, conc,
                   "with fsync on (durable commits)" if durable == "1"
                   else "with db-up.sh's test settings (fsync off)"))
    out.append("")
    out.append("| scenario | idemd run | req/s | baseline | req/s | ratio | target | met |")
    out.append("|---|---|---:|---|---:|---:|---|---|")
    out.extend(rows)
    rss, base = r.get("rss"), r.get("rss_nocache")
    if rss and base:
        keys = rss.get("status", {}).get("201", 0)
        cap = rss.get("cache_mb") or ""
        grow = (rss.get("hwm_end_kb", 0) - rss.get("hwm_start_kb", 0)) / 1024.0
        grow0 = (base.get("hwm_end_kb", 0) - base.get("hwm_start_kb", 0)) / 1024.0
        target = ("cache cap %s MB" % cap) if cap else "no cache in this build"
        met = ""
        if cap:
            met = "yes" if grow - grow0 <= float(cap) else "**no**"
        if keys < rss.get("keys_target", 0):
            met += " (%d of %d keys in the time cap; the cap filled after ~%d)" % (
                keys, rss["keys_target"], int(float(cap or 0) * 1024 * 1024 / 500))
        out.append("| idemd peak RSS (VmHWM) growth after %d distinct keys, cache on minus "
                   "cache off (SQLite, synchronous=NORMAL) | rss | +%.1f MB | rss_nocache | "
                   "+%.1f MB | +%.1f MB | within %s | %s |" % (
                       keys, grow, grow0, grow - grow0, target, met))
    out.append("")
    out.append("Every run, with latency (closed loop: latency = connections / throughput):")
    out.append("")
    out.append("| run | req/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/answer | answers "
               "| exactly-once |")
    out.append("|---|---:|---:|---:|---:|---:|---|---|")
    for k, d in r.items():
        st = d.get("status")
        answers = ", ".join("%s x %s" % (s, n) for s, n in sorted(st.items())) if st else \
            "%s" % d.get("requests", "")
        cpu = cpu_us(k)
        cpu = "%.1f" % cpu if cpu is not None else ""
        if "p50_ms" in d:
            out.append("| %s | %.0f | %.2f | %.2f | %.2f | %s | %s | %s |" % (
                k, d.get("rps", 0), d["p50_ms"], d["p99_ms"], d["p999_ms"], cpu, answers,
                d.get("verify", "")))
        else:
            out.append("| %s | %.0f | | | | | %s | (baseline) |" % (k, d.get("rps", 0),
                                                                   answers))
    table = "\n".join(out)
    print(table)
    if not doc:
        return
    try:
        with open(doc) as f:
            text = f.read()
    except FileNotFoundError:
        text = "# Benchmarks\n\n%s\n%s\n" % (BEGIN, END)
    if BEGIN not in text or END not in text:
        text += "\n%s\n%s\n" % (BEGIN, END)
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w") as f:
        f.write(head + BEGIN + "\n" + table + "\n" + END + tail)
    print("table.py: wrote %s" % doc, file=sys.stderr)


if __name__ == "__main__":
    main()
