#!/usr/bin/env bash
# cmake --install into a scratch DESTDIR, then build a program outside the
# project against the installed libidem with pkg-config only (the shared
# library, then the static one) and run it: one request, then its replay.
#   test_install.sh BUILD_DIR SOURCE_FILE
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=/opt/idem-test

DESTDIR=$tmp/root cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
root=$tmp/root$prefix
for f in bin/idemd bin/idemctl include/idem/idem.h; do
  [ -e "$root/$f" ] || { echo "not installed: $f" >&2; cat "$tmp/install.log" >&2; exit 1; }
done
pc=$(find "$root" -name idem.pc)
libdir=$(dirname "$(dirname "$pc")")
ls "$libdir"/libidem.so.0 "$libdir"/libidem.a >/dev/null

export PKG_CONFIG_PATH=$(dirname "$pc")
flags=$(pkg-config --cflags --libs idem)
echo "pkg-config --cflags --libs idem: $flags"
inc=$(pkg-config --variable=includedir idem)
[ "$(cd "$inc" && pwd -P)" = "$(cd "$root/include" && pwd -P)" ] ||
  { echo "idem.pc: includedir $inc is not $root/include" >&2; exit 1; }

# Shared: the binary finds libidem.so.0 through LD_LIBRARY_PATH (a
# DESTDIR tree is not where ld.so looks).
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer" "$src" $flags
LD_LIBRARY_PATH=$libdir "$tmp/consumer" "$tmp/shared.db"
# ldd's output captured first: `ldd | grep -q` under pipefail fails when
# grep exits at its match and ldd dies of SIGPIPE (seen 1 run in 10).
linked=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/consumer")
grep -q "libidem.so.0 => $libdir" <<<"$linked"

# Static libidem.a, its dependencies shared (Debian's libpq-dev has no
# static libpgcommon, so `pkg-config --static` cannot link fully static):
# the libraries idem.pc lists as private.
deps=$(pkg-config --print-requires-private idem | awk '{print $1}')
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer-static" "$src" \
  $(pkg-config --cflags idem) "$libdir/libidem.a" $(pkg-config --libs $deps) -lcsv -pthread
"$tmp/consumer-static" "$tmp/static.db"
linked=$(ldd "$tmp/consumer-static")
! grep -q libidem <<<"$linked"
"$root/bin/idemctl" --db "sqlite:$tmp/ctl.db" migrate
echo "install test: ok"
