#!/usr/bin/env bash
# contrib/prometheus/idem-alerts.yml: valid rules (promtool check rules) that
# fire as their unit tests expect (promtool test rules).
set -euo pipefail
dir=$1
command -v promtool >/dev/null ||
  { echo "promtool not found: install it with scripts/deps.sh --all (Debian package prometheus)" >&2; exit 1; }
cd "$dir"
promtool check rules idem-alerts.yml
promtool test rules idem-alerts.test.yml
