#!/usr/bin/env bash
# scripts/check-style.sh: the style checks CI runs (ctest check_style).
#
#  1. clang-format (the repo's .clang-format) over the files listed in
#     FORMATTED below: the files rewritten since the check arrived, and
#     whole directories once formatted (src/cli, src/util, tests/store,
#     tests/cli: a new file there is covered at once). The rest of src/core,
#     src/store, src/pay and include/idem joins the list as it is rewritten;
#     src/server is not covered yet.
#  2. Banned functions (STYLE.md): atol atoi sprintf strcpy strcat strtok gets
#     (a call, not a word in a comment): a failure in src/core, src/store,
#     src/util, src/cli and include/; a warning elsewhere in src/ for this
#     round (src/server and src/pay are being edited on other branches).
#  3. File size: a warning (not a failure) for a C file over 1,000 lines.
#
#   scripts/check-style.sh [ROOT]     exit 0 clean, 1 on a violation
set -uo pipefail

root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$root" || exit 2
status=0

FORMATTED=(
  src/core/engine.c src/core/engine.h src/core/execute.c src/core/result.c src/core/txn.c
  src/store/backends.c src/store/schema.h src/store/schema_sqlite.c
  src/store/schema_postgres.c src/store/schema_mariadb.c
  tests/core/test_engine.c tests/core/test_init_fail.c
  src/pay/channel.h src/pay/chanclient.c src/pay/chanpool.c src/pay/chanpay.c src/pay/sweeper.c
  src/store/mariadb.c src/store/mariadb_int.h src/store/mariadb_io.c src/store/mariadb_stmt.c
  src/store/mariadb_url.c src/store/postgres_int.h src/store/postgres_sql.c
  src/store/postgres.c
  src/cli/*.c src/cli/*.h src/util/*.c src/util/*.h tests/store/*.c tests/cli/*.c
  src/pay/recon.c src/pay/notifications.c src/pay/ledger.c src/pay/reads.c src/pay/stats.c
  src/pay/admin.c src/pay/ticker.c src/pay/payments.c
)

if command -v clang-format >/dev/null 2>&1; then
  for f in "${FORMATTED[@]}"; do
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
      echo "check-style: $f is not clang-formatted (run: clang-format -i $f)"
      status=1
    fi
  done
else
  echo "check-style: clang-format not installed; format check skipped"
fi

# A banned call: the name followed by '(' outside comments and strings (a
# rough filter: lines starting with ' *' or '//' are comments).
banned='(^|[^A-Za-z0-9_])(atol|atoi|sprintf|strcpy|strcat|strtok|gets)[[:space:]]*\('
while IFS= read -r hit; do
  line=${hit#*:*:}
  case "$line" in
    *'/*'*|[[:space:]]\**|\**|*'//'*) continue ;;
  esac
  case "$hit" in
    src/core/*|src/store/*|src/util/*|src/cli/*|include/*)
      echo "check-style: banned function: $hit"
      status=1 ;;
    *) echo "check-style: warning: banned function: $hit" ;;
  esac
done < <(grep -rnE "$banned" --include='*.c' --include='*.h' src include || true)

while IFS= read -r f; do
  n=$(wc -l <"$f")
  if [ "$n" -gt 1000 ]; then
    echo "check-style: warning: $f has $n lines (split it: files stay about one thing)"
  fi
done < <(find src include -name '*.[ch]' | sort)

[ "$status" -eq 0 ] && echo "check-style: ok"
exit "$status"
