#!/usr/bin/env bash
# Builds the Debian packages (debian/) in a scratch copy of the tree, so
# that neither the tree nor its parent directory gets build output, and
# puts the .deb files in OUTDIR:
#   scripts/build-deb.sh OUTDIR        (make deb: OUTDIR = build/deb)
# Needs the packaging tools: scripts/deps.sh --pkg. Copies the files git
# knows (tracked and untracked, not ignored), so uncommitted edits count.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build-deb.sh OUTDIR}
command -v dpkg-buildpackage >/dev/null && command -v dh >/dev/null ||
  { echo "build-deb.sh: dpkg-buildpackage/debhelper missing: scripts/deps.sh --pkg" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-deb.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/idem"
if git -C "$here" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$here" && git ls-files -z --cached --others --exclude-standard |
     xargs -0 -r sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh |
     tar --null -T - -cf -) | tar -C "$tmp/idem" -xf -
else
  (cd "$here" && tar --exclude='./build*' -cf - .) | tar -C "$tmp/idem" -xf -
fi
jobs=$(nproc 2>/dev/null || echo 2)
(cd "$tmp/idem" && DEB_BUILD_OPTIONS="parallel=$jobs ${DEB_BUILD_OPTIONS:-}" \
  dpkg-buildpackage -us -uc -b) >"$tmp/build.log" 2>&1 ||
  { tail -n 40 "$tmp/build.log" >&2; echo "build-deb.sh: dpkg-buildpackage failed" >&2; exit 1; }
cp "$tmp"/*.deb "$out"/
ls "$out"/*.deb
