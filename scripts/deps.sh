#!/usr/bin/env bash
# Installs the Debian 12 packages idem needs to build, run and test.
# The only place anything gets installed: the Makefile and .ci/run call it.
# Quick no-op when everything is present. Needs root (or sudo) to install.
#
#   scripts/deps.sh          build + SQLite-path dependencies (make, make run)
#   scripts/deps.sh --pkg    also the Debian packaging tools (dpkg-buildpackage)
#   scripts/deps.sh --all    everything the whole suite needs (make test): the
#                            database servers (galera-4, rsync and iproute2 for
#                            the Galera cluster of scripts/galera-up.sh),
#                            nftables for the network faults of
#                            tests/fault/test_netfault.py, promtool, the
#                            packaging tools, clang-format (the style
#                            check), clang and its
#                            libFuzzer runtime (make fuzz)
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config
  libsqlite3-dev libjansson-dev libssl-dev libcmocka-dev
  libmicrohttpd-dev libcurl4-openssl-dev libpq-dev libmariadb-dev
  libhiredis-dev libcsv-dev python3 curl openssl
)
pkg_tools=(debhelper dpkg-dev fakeroot)
for arg in "$@"; do
  case "$arg" in
    --all) pkgs+=(postgresql mariadb-server galera-4 rsync iproute2 nftables sqlite3 prometheus
             clang clang-format libclang-rt-14-dev "${pkg_tools[@]}") ;;
    --pkg) pkgs+=("${pkg_tools[@]}") ;;
    *) echo "usage: deps.sh [--all|--pkg]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps.sh: installing ${missing[*]}" >&2
# Whatever fails below, say what could not be installed (apt's own message
# alone is easy to miss in a make log).
trap 'rc=$?; [ $rc -eq 0 ] || echo "deps.sh: could not install: ${missing[*]} (exit $rc)" >&2' EXIT
SUDO=
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
# prometheus is installed for its promtool only: keep its daemon (and any
# other service a package ships) from being started by the install, as
# Debian's container images do, unless the machine has a policy already.
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  trap 'rc=$?; $SUDO rm -f "$policy"; [ $rc -eq 0 ] || echo "deps.sh: could not install: ${missing[*]} (exit $rc)" >&2' EXIT
fi
# Fresh images ship without package lists; apt-get install finds nothing then.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -print -quit 2>/dev/null)" ]; then
  $SUDO apt-get update -q
fi
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  # Lists may be stale (a package version no longer on the mirror): refresh once.
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
