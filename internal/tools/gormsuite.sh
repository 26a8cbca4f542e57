#!/usr/bin/env bash
# gormsuite.sh runs GORM's own test suite (the tests/ directory of gorm
# v1.31.2, on SQLite) with the cacheguard GORM plugin registered on every
# connection the suite opens, and lists the tests that fail.
#
#   internal/tools/gormsuite.sh MODE [go test flags...]
#
# MODE is one of
#   none        the suite as GORM ships it (the baseline)
#   default     db.Use(gormplugin.New(locks.New(rdb)))
#   permissive  ... with Unkeyed(PassThrough), FailOpen(), NoFencing()
#   down        permissive, with Redis unreachable (a closed port): every
#               write waits for the lock attempt to fail, then goes through
#   down-breaker  the same with a locks.Breaker on the client: once it is
#               open, the lock attempt fails at once
#
# The GORM sources come from GORM_SRC (a checkout of go-gorm/gorm at v1.31.2;
# the tests/ module has a replace to ../, so the whole tree is needed), or
# else from a shallow git clone of the v1.31.2 tag. The Go module proxy cannot
# serve tests/: it is a module of its own, left out of gorm's module zip and
# never tagged. GORM's code is copied to a temporary directory, never into
# this repository. The suite's OpenTestConnection is renamed and wrapped by a
# file that registers the plugin; a private redis-server is started on a free
# loopback port and stopped at exit.
#
# Output: the failing top-level tests, one a line, in $OUT (default
# ./gormsuite-MODE.txt), go test's JSON beside it (.json), and a summary line
# "MODE: N tests, F failed".
set -euo pipefail

mode=${1:-default}
shift || true
case $mode in none | default | permissive | down | down-breaker) ;; *)
  echo "usage: $0 none|default|permissive|down|down-breaker [go test flags]" >&2
  exit 2
  ;;
esac
root=$(cd "$(dirname "$0")/../.." && pwd)
version=v1.31.2
work=$(mktemp -d /tmp/gormsuite.XXXXXX)
out=${OUT:-$PWD/gormsuite-$mode.txt}
redis_pid=
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ -n "${GORM_SRC:-}" ]; then
  cp -a "$GORM_SRC/." "$work/gorm"
  rm -rf "$work/gorm/.git"
else
  git clone -q --depth 1 --branch "$version" https://github.com/go-gorm/gorm "$work/gorm"
fi
tests=$work/gorm/tests
[ -f "$tests/tests_test.go" ] || {
  echo "$0: no tests/tests_test.go in the GORM sources" >&2
  exit 1
}

# Wrap OpenTestConnection: every connection the suite opens gets the plugin.
sed -i 's/^func OpenTestConnection(cfg \*gorm.Config)/func openTestConnection(cfg *gorm.Config)/' "$tests/tests_test.go"
cat >"$tests/zz_cacheguard_test.go" <<'EOF'
package tests_test

import (
	"os"
	"sync"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

var (
	cgOnce   sync.Once
	cgLocker *locks.Client
)

// OpenTestConnection opens the suite's database and registers the cacheguard
// plugin on it, as CACHEGUARD_MODE says.
func OpenTestConnection(cfg *gorm.Config) (*gorm.DB, error) {
	db, err := openTestConnection(cfg)
	mode := os.Getenv("CACHEGUARD_MODE")
	if err != nil || mode == "none" {
		return db, err
	}
	cgOnce.Do(func() {
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("CACHEGUARD_REDIS")})
		if mode == "down-breaker" {
			rdb.AddHook(&locks.Breaker{})
		}
		cgLocker = locks.New(rdb)
	})
	var opts []gormplugin.Option
	if mode != "default" {
		opts = append(opts, gormplugin.Unkeyed(gormplugin.PassThrough), gormplugin.FailOpen(), gormplugin.NoFencing())
	}
	return db, db.Use(gormplugin.New(cgLocker, opts...))
}
EOF

cd "$tests"
go mod edit -require github.com/cacheguard/cacheguard@v0.0.0 -replace "github.com/cacheguard/cacheguard=$root"
go mod tidy >/dev/null 2>&1 || go mod tidy

port=
case $mode in down | down-breaker)
  # A port nobody listens on: bind one, note it, close it.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  ;;
esac
if [ "$mode" != none ] && [ -z "$port" ]; then
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 20000))
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
    redis_pid=$!
    for _ in $(seq 50); do
      if redis-cli -p "$p" ping >/dev/null 2>&1; then port=$p; break; fi
      kill -0 "$redis_pid" 2>/dev/null || break
      sleep 0.1
    done
    [ -n "$port" ] && break
    kill "$redis_pid" 2>/dev/null || true
    redis_pid=
  done
  [ -n "$port" ] || {
    echo "$0: could not start redis-server" >&2
    exit 1
  }
fi

export CACHEGUARD_MODE=$mode CACHEGUARD_REDIS=127.0.0.1:${port:-0} TMPDIR=$work GORM_DIALECT=sqlite
start=$(date +%s)
go test -count=1 -json "$@" . >"$work/test.json" 2>"$work/test.err" || true
end=$(date +%s)
# Top-level tests only (no "/" in the name).
grep -E '"Action":"(pass|fail|skip)"' "$work/test.json" | grep '"Test":' |
  sed -E 's/.*"Action":"([a-z]+)".*"Test":"([^"]+)".*/\1 \2/' | grep -v '/' >"$work/results" || true
grep '^fail ' "$work/results" | cut -d' ' -f2 | sort >"$out" || true
cp "$work/test.json" "${out%.txt}.json"
total=$(wc -l <"$work/results")
failed=$(wc -l <"$out")
echo "$mode: $total tests, $failed failed, $((end - start)) s (list in $out)"
if [ "$total" = 0 ]; then
  tail -20 "$work/test.err" >&2
  grep -v '"Action":"pass"' "$work/test.json" | tail -20 >&2
fi
