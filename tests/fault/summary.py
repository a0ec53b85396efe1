"""Print the summary table of make test-long (docs/reliability.md keeps a
copy): one row per case and backend from the tab-separated lines the fault
tests append to $IDEM_RESULTS_FILE (case, backend, rounds, faults, requests,
outcome).

    python3 tests/fault/summary.py RESULTS_FILE [CTEST_EXIT_CODE]

Only a case that passed writes its row; with a non-zero exit code the last
line says that some failed instead of "nothing acknowledged lost". The
date, the machine's load average and core count follow, for the copy in
docs/reliability.md.
"""

import os
import sys
import time


def main():
    if len(sys.argv) not in (2, 3):
        sys.stderr.write("usage: summary.py RESULTS_FILE [CTEST_EXIT_CODE]\n")
        return 2
    try:
        with open(sys.argv[1]) as f:
            rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    except OSError as e:
        sys.stderr.write("summary.py: no results (%s): did any case run?\n" % e)
        return 1
    head = ("case", "backend", "rounds", "faults", "requests", "outcome")
    table = [head] + [tuple(r) for r in rows if len(r) == len(head)]
    width = [max(len(r[i]) for r in table) for i in range(len(head))]
    print()
    print("| " + " | ".join(h.ljust(width[i]) for i, h in enumerate(head)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in width) + "|")
    for r in table[1:]:
        print("| " + " | ".join(v.ljust(width[i]) for i, v in enumerate(r)) + " |")
    total = [sum(int(r[i]) for r in table[1:]) for i in (2, 3, 4)]
    failed = len(sys.argv) == 3 and sys.argv[2] != "0"
    print("\n%d cases passed: %d rounds, %d faults injected, %d requests; %s"
          % (len(table) - 1, total[0], total[1], total[2],
             "SOME CASES FAILED (see the ctest output above)" if failed
             else "nothing acknowledged lost"))
    try:
        load = "load average %.2f %.2f %.2f" % os.getloadavg()
    except OSError:
        load = "load average unknown"
    print("%s, %s, %d cores" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), load,
                                os.cpu_count() or 0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
