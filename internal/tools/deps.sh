#!/usr/bin/env bash
# Installs what `make test` needs when it is absent and the machine allows it:
# redis-server and postgresql (Debian packages; the tests start their own
# servers) and gcc (cgo: -race and the sqlite driver).
set -u
missing=()
if [ -z "${REDIS_SERVER_BIN:-}" ] && ! command -v redis-server >/dev/null 2>&1; then missing+=(redis-server); fi
if [ -z "${PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && ! command -v postgres >/dev/null 2>&1; then missing+=(postgresql); fi
if ! command -v gcc >/dev/null 2>&1; then missing+=(gcc); fi
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "deps: installing ${missing[*]} with apt-get"
  # Keep the package's init script from starting a system-wide redis on :6379.
  policy=/usr/sbin/policy-rc.d
  created=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created=1; fi
  export DEBIAN_FRONTEND=noninteractive
  ok=1
  apt-get update -qq >/dev/null || ok=0
  [ $ok = 1 ] && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || ok=0
  [ $created = 1 ] && rm -f "$policy"
  if [ $ok = 1 ]; then exit 0; fi
  echo "deps: apt-get install ${missing[*]} failed" >&2
else
  echo "deps: missing ${missing[*]}: install the Debian packages (sudo apt-get install ${missing[*]})" >&2
fi
# A missing redis-server or postgresql skips the tests that need it, unless CACHEGUARD_REQUIRE_REDIS=1.
if [ "${CACHEGUARD_REQUIRE_REDIS:-}" = 1 ]; then exit 1; fi
exit 0
