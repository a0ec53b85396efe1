#!/usr/bin/env bash
# Installs the Debian 12 packages idem needs to build, run and test.
# The only place anything gets installed: the Makefile and .ci/run call it.
# Quick no-op when everything is present. Needs root (or sudo) to install.
#
#   scripts/deps.sh          build + test dependencies (SQLite path)
#   scripts/deps.sh --all    also the database servers the full suite starts
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libsqlite3-dev libjansson-dev libssl-dev libcmocka-dev
  libmicrohttpd-dev libcurl4-openssl-dev libpq-dev libmariadb-dev
  libhiredis-dev libcsv-dev python3 curl openssl
)
if [ "${1:-}" = "--all" ]; then
  pkgs+=(postgresql mariadb-server sqlite3)
fi

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps.sh: installing ${missing[*]}" >&2
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# Fresh images ship without package lists; apt-get install finds nothing then.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -print -quit 2>/dev/null)" ]; then
  $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  # Lists may be stale (a package version no longer on the mirror): refresh once.
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
