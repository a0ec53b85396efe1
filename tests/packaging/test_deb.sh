#!/usr/bin/env bash
# The Debian packages: build them (scripts/build-deb.sh, a scratch copy of
# the tree), unpack them into a scratch root (dpkg -x: a container-less
# stand-in for installing; maintainer scripts are not run, they would add a
# system user to this machine), then from that root:
#   - idemd --help and idemctl --db sqlite:... migrate
#   - the unit: hardened, passes systemd-analyze verify without a warning
#   - idemd started as the unit starts it (its Environment= lines), on a
#     free loopback port: /healthz answers 200, and it stops on SIGTERM
#   - a program built against libidem-dev's idem.pc and run on libidem0
#   test_deb.sh SOURCE_DIR CONSUMER_C
set -euo pipefail
src=$1 consumer=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/idem-debtest.XXXXXX")
pid=
cleanup() {
  [ -z "$pid" ] || { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "test_deb: $*" >&2; exit 1; }

"$src/scripts/build-deb.sh" "$tmp/deb" >/dev/null
root=$tmp/root
for p in idem libidem0 libidem-dev; do
  deb=$(ls "$tmp"/deb/${p}_*.deb)
  dpkg-deb -x "$deb" "$root"
done
multi=$(ls -d "$root"/usr/lib/*/ | head -n 1)
unit=$root/lib/systemd/system/idemd.service

"$root/usr/bin/idemd" --help >"$tmp/help.txt" || fail "idemd --help failed"
grep -q '^usage: idemd' "$tmp/help.txt" || fail "idemd --help: no usage line"
"$root/usr/bin/idemctl" --db "sqlite:$tmp/ctl.db" migrate || fail "idemctl migrate failed"
# Outputs captured before grep -q: a pipe into it fails under pipefail
# when the writer gets SIGPIPE after grep's early exit.
status=$("$root/usr/bin/idemctl" --db "sqlite:$tmp/ctl.db" migrate --json)
grep -q '"up_to_date": *true' <<<"$status" ||
  fail "idemctl migrate did not leave the store up to date"

# Maintainer scripts: not run here (see above), but they must parse and
# create the user and the state directory.
dpkg-deb -e "$(ls "$tmp"/deb/idem_*.deb)" "$tmp/ctl"
for s in postinst postrm; do sh -n "$tmp/ctl/$s" || fail "$s does not parse"; done
grep -q 'adduser --system' "$tmp/ctl/postinst" || fail "postinst adds no system user"
grep -q 'chown idem:idem /var/lib/idem' "$tmp/ctl/postinst" || fail "postinst makes no state dir"
grep -q 'deb-systemd-helper enable .idemd.service' "$tmp/ctl/postinst" || fail "unit not enabled"

[ -f "$root/etc/idem/idemd.env" ] || fail "no /etc/idem/idemd.env"
conffiles=$(dpkg-deb -I "$(ls "$tmp"/deb/idem_*.deb)" conffiles)
grep -qx /etc/idem/idemd.env <<<"$conffiles" ||
  fail "/etc/idem/idemd.env is not a conffile"
for d in User=idem StateDirectory=idem ProtectSystem=strict NoNewPrivileges=yes \
  ProtectHome=yes PrivateTmp=yes CapabilityBoundingSet= \
  Environment=IDEM_DB=sqlite:/var/lib/idem/idem.db ExecStart=/usr/bin/idemd; do
  grep -qx "$d" "$unit" || fail "unit lacks $d"
done
if command -v systemd-analyze >/dev/null; then
  # The unit as installed, pointed at the unpacked idemd (verify checks
  # that ExecStart is executable). Any output is a warning: fail on it.
  sed "s#/usr/bin/idemd#$root/usr/bin/idemd#" "$unit" >"$tmp/idemd.service"
  systemd-analyze verify "$tmp/idemd.service" >"$tmp/verify.log" 2>&1 ||
    { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify failed"; }
  [ ! -s "$tmp/verify.log" ] || { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify warned"; }
else
  echo "test_deb: systemd-analyze not installed: unit not verified" >&2
fi

# Start idemd as the unit does: its Environment= lines, the state directory
# (here a temp dir) as working directory, the listen address moved to a
# free port.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir "$tmp/state"
env_args=()
while IFS= read -r line; do
  env_args+=("${line#Environment=}")
done < <(grep '^Environment=' "$unit" | sed "s#/var/lib/idem#$tmp/state#; s#127.0.0.1:8080#127.0.0.1:$port#")
(cd "$tmp/state" && exec env -i PATH=/usr/bin:/bin "${env_args[@]}" "$root/usr/bin/idemd") \
  >"$tmp/idemd.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || { cat "$tmp/idemd.log" >&2; fail "idemd exited"; }
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null || { cat "$tmp/idemd.log" >&2; fail "no /healthz"; }
[ -f "$tmp/state/idem.db" ] || fail "idemd did not create its store in the state directory"
kill -TERM "$pid"
for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then fail "idemd did not stop on SIGTERM"; fi
wait "$pid" || fail "idemd exited non-zero on SIGTERM"
pid=

# libidem-dev + libidem0: idem.pc is relocatable, so the unpacked one works.
export PKG_CONFIG_PATH=${multi}pkgconfig
cc -std=c11 -Wall -Wextra -Werror -o "$tmp/consumer" "$consumer" $(pkg-config --cflags --libs idem)
LD_LIBRARY_PATH=$multi "$tmp/consumer" "$tmp/consumer.db"
echo "deb test: ok"
