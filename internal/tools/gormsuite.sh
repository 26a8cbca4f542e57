#!/usr/bin/env bash
# gormsuite.sh runs GORM's own test suite (the tests/ directory of gorm
# v1.31.2, on SQLite or PostgreSQL) with the cacheguard GORM plugin
# registered on every connection the suite opens, and lists the tests that
# fail.
#
#   internal/tools/gormsuite.sh MODE [go test flags...]
#   GORM_DIALECT=postgres internal/tools/gormsuite.sh MODE ...
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
# GORM_DIALECT selects the database as GORM's suite does: sqlite (the
# default; a file in a temporary directory) or postgres, on GORM_DSN, or, when
# GORM_DSN is unset, on a private PostgreSQL server the script starts (initdb
# in a temporary directory, a free loopback port; the binaries from PG_BIN or
# /usr/lib/postgresql/*/bin) and stops at exit.
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
# ./gormsuite-DIALECT-MODE.txt), go test's JSON beside it (.json), and a
# summary line "DIALECT MODE: N tests, F failed, K fence counters left"
# (K counts the cg:fence:* keys the run left in Redis: none with NoFencing).
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
dialect=${GORM_DIALECT:-sqlite}
case $dialect in sqlite | postgres) ;; *)
  echo "$0: GORM_DIALECT=$dialect: sqlite or postgres" >&2
  exit 2
  ;;
esac
work=$(mktemp -d /tmp/gormsuite.XXXXXX)
out=${OUT:-$PWD/gormsuite-$dialect-$mode.txt}
redis_pid=
pg_dir=
as_pg=()
cleanup() {
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null || true
  if [ -n "$pg_dir" ]; then
    "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$pg_dir"
  fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

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

if [ "$dialect" = postgres ] && [ -z "${GORM_DSN:-}" ]; then
  # A private server: a new cluster, trusted local connections, loopback only.
  pg_bin=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
  [ -x "$pg_bin/postgres" ] || {
    echo "$0: no PostgreSQL server binaries (install postgresql or set PG_BIN)" >&2
    exit 1
  }
  pg_dir=$(mktemp -d /tmp/gormsuite-pg.XXXXXX)
  if [ "$(id -u)" = 0 ]; then
    chown postgres "$pg_dir"
    as_pg=(runuser -u postgres --)
  fi
  as_pg=(env -C / "${as_pg[@]}") # the server's user may not enter the current directory
  "${as_pg[@]}" "$pg_bin/initdb" -D "$pg_dir/data" -U postgres -A trust -E UTF8 --no-sync --locale=C >/dev/null
  pg_port=$(free_port)
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w -o "-p $pg_port -k $pg_dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" start >/dev/null
  "${as_pg[@]}" "$pg_bin/psql" -X -q -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -c "CREATE DATABASE gorm" >/dev/null
  export GORM_DSN="host=127.0.0.1 port=$pg_port user=postgres dbname=gorm sslmode=disable TimeZone=Asia/Shanghai"
fi

port=
case $mode in down | down-breaker)
  # A port nobody listens on: bind one, note it, close it.
  port=$(free_port)
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

export CACHEGUARD_MODE=$mode CACHEGUARD_REDIS=127.0.0.1:${port:-0} TMPDIR=$work GORM_DIALECT=$dialect
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
fences=0
if [ -n "$redis_pid" ]; then
  fences=$(redis-cli -p "$port" --scan --pattern 'cg:fence:*' | wc -l)
fi
echo "$dialect $mode: $total tests, $failed failed, $fences fence counters left, $((end - start)) s (list in $out)"
if [ "$total" = 0 ]; then
  tail -20 "$work/test.err" >&2
  grep -v '"Action":"pass"' "$work/test.json" | tail -20 >&2
fi
