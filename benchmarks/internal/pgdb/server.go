// Package pgdb is the real database of the benchmarks: a private PostgreSQL
// server (internal/pgserver) holding one table large enough that the loader's
// query, an aggregate over an unindexed column, costs tens of milliseconds
// alone; the loader the worker processes run against it, through a
// connection pool of fixed size; and the server-side accounting (CPU time of
// every PostgreSQL process, statements counted by pg_stat_statements).
package pgdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cacheguard/cacheguard/internal/pgserver"
)

// Query is the loader's statement: a seq scan of the whole table, since
// repo_id has no index.
const Query = "SELECT count(*), coalesce(sum(stars), 0), coalesce(max(size), 0) FROM events WHERE repo_id = $1"

// database is the benchmark's database on the private server.
const database = "cgbench"

// Options size the database.
type Options struct {
	// Rows is the size of the table; the loader's query scans all of them.
	Rows int
	// Alone, when set, sizes the table instead: Start fills Rows rows,
	// times the query, and refills the table with as many rows as make it
	// take about Alone (a seq scan's time is linear in its rows), so that
	// the database's work per query is the same share of any host.
	Alone time.Duration
	// Repos is the number of distinct repo_id values (the keys).
	Repos int
	// MaxConnections is the server's limit (default 200).
	MaxConnections int
}

// Server is a running PostgreSQL server with the benchmark's table.
type Server struct {
	srv   *pgserver.Server
	admin *pgx.Conn
	opts  Options
	// Alone is the loader's query time on the idle server (median of 5).
	Alone time.Duration
	rows  int // the table's size
	// Version is the server's version string.
	Version string
}

// Settings are the server settings the benchmark adds to pgserver's test
// defaults (fsync off, 64 MB shared buffers): the whole table fits in shared
// buffers, pg_stat_statements counts statements, and one query uses one core
// (no parallel workers), so that its cost does not depend on what else runs.
var Settings = []string{
	"shared_buffers=256MB",
	"shared_preload_libraries=pg_stat_statements",
	"pg_stat_statements.track=top",
	"max_parallel_workers_per_gather=0",
	"jit=off",
}

// Start starts a server, creates the table and fills it, and measures the
// loader's query alone.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Rows <= 0 || opts.Repos <= 0 {
		return nil, fmt.Errorf("pgdb: rows %d and repos %d must be positive", opts.Rows, opts.Repos)
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{MaxConnections: opts.MaxConnections, Settings: Settings})
	if err != nil {
		return nil, err
	}
	s := &Server{srv: srv, opts: opts}
	if err := s.setup(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Server) setup(ctx context.Context) error {
	if err := s.srv.CreateDB(ctx, database); err != nil {
		return err
	}
	if err := s.srv.PSQL(ctx, database, "CREATE EXTENSION pg_stat_statements"); err != nil {
		return err
	}
	var err error
	if s.admin, err = pgx.Connect(ctx, s.DSN()); err != nil {
		return fmt.Errorf("pgdb: connect: %w", err)
	}
	if err := s.admin.QueryRow(ctx, "SELECT version()").Scan(&s.Version); err != nil {
		return fmt.Errorf("pgdb: version: %w", err)
	}
	if i := strings.Index(s.Version, " on "); i > 0 {
		s.Version = s.Version[:i]
	}
	if err := s.fill(ctx, s.opts.Rows); err != nil {
		return err
	}
	// Sized by the query's time: two refills at most (the second corrects
	// what the first run's timing missed), each only when 10% off.
	for range 2 {
		want := s.opts.Alone
		if want <= 0 || (s.Alone > want*9/10 && s.Alone < want*11/10) {
			break
		}
		n := int(float64(s.rows) * float64(want) / float64(s.Alone))
		if err := s.fill(ctx, max(n, 1000)); err != nil {
			return err
		}
	}
	return nil
}

// fill (re)creates the table with rows rows and times the loader's query
// on it.
func (s *Server) fill(ctx context.Context, rows int) error {
	// repo_id is spread evenly over the repos; stars and size are noise so
	// that the aggregates differ per repo.
	ddl := fmt.Sprintf(`DROP TABLE IF EXISTS events;
CREATE TABLE events (id bigint PRIMARY KEY, repo_id int NOT NULL, stars int NOT NULL, size int NOT NULL, kind smallint NOT NULL, created_at timestamptz NOT NULL);
INSERT INTO events SELECT g, g %% %d, (g::bigint * 7919) %% 1000, (g::bigint * 104729) %% 100000, g %% 7, timestamptz '2024-01-01' + g * interval '1 second' FROM generate_series(1, %d) g;`, s.opts.Repos, rows)
	if err := s.srv.PSQL(ctx, database, ddl); err != nil {
		return err
	}
	// Mark every page all-visible now, so that a measured scan checks no
	// tuple's visibility and writes no hint bit. The CHECKPOINT first: with
	// synchronous_commit off, the insert's commit is not flushed yet, no
	// hint bit can be set, and VACUUM leaves every page not all-visible.
	if err := s.srv.PSQL(ctx, database, "CHECKPOINT"); err != nil {
		return err
	}
	if err := s.srv.PSQL(ctx, database, "VACUUM (FREEZE, ANALYZE) events"); err != nil {
		return err
	}
	var pages, visible int64
	if err := s.admin.QueryRow(ctx, "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'events'").Scan(&pages, &visible); err != nil {
		return fmt.Errorf("pgdb: visibility: %w", err)
	}
	if visible < pages {
		return fmt.Errorf("pgdb: %d of %d pages all-visible after VACUUM", visible, pages)
	}
	// Twice to warm the buffers, then five timed runs.
	var d []time.Duration
	for i := range 7 {
		t0 := time.Now()
		var n, a, b int64
		if err := s.admin.QueryRow(ctx, Query, i).Scan(&n, &a, &b); err != nil {
			return fmt.Errorf("pgdb: loader query: %w", err)
		}
		if i >= 2 {
			d = append(d, time.Since(t0))
		}
	}
	slices.Sort(d)
	s.rows, s.Alone = rows, d[len(d)/2]
	return nil
}

// DSN is the connection string of the benchmark's database.
func (s *Server) DSN() string { return s.srv.DSN(database) }

// Rows is the table's size.
func (s *Server) Rows() int { return s.rows }

// Close stops the server and removes its files.
func (s *Server) Close() {
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.admin.Close(ctx)
		cancel()
	}
	s.srv.Stop()
}

// Counters are the server's own counts, read with Snapshot; subtract two
// snapshots to get what happened between them.
type Counters struct {
	CPU time.Duration // user+system CPU time of every PostgreSQL process
	// Calls is the number of loader queries that ran to completion
	// (pg_stat_statements: a query is counted when it ends, even if its
	// client has gone).
	Calls int64
	// ExecTime is the server's execution time of those queries.
	ExecTime time.Duration
}

// Sub returns c − o.
func (c Counters) Sub(o Counters) Counters {
	return Counters{CPU: c.CPU - o.CPU, Calls: c.Calls - o.Calls, ExecTime: c.ExecTime - o.ExecTime}
}

// Snapshot reads the counters.
func (s *Server) Snapshot(ctx context.Context) (Counters, error) {
	var c Counters
	var err error
	if c.CPU, err = serverCPU(s.srv.Pid()); err != nil {
		return c, err
	}
	var ms float64
	err = s.admin.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(total_exec_time), 0)
FROM pg_stat_statements WHERE query LIKE '%FROM events WHERE repo_id%'`).Scan(&c.Calls, &ms)
	if err != nil {
		return c, fmt.Errorf("pgdb: pg_stat_statements: %w", err)
	}
	c.ExecTime = time.Duration(ms * float64(time.Millisecond))
	return c, nil
}

// WaitIdle waits until no other session runs a statement (queries whose
// clients gave up run to their end), for at most d. It returns how many were
// still active when it gave up.
func (s *Server) WaitIdle(ctx context.Context, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	for {
		var n int
		err := s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE state <> 'idle' AND pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n)
		if err != nil {
			return 0, fmt.Errorf("pgdb: pg_stat_activity: %w", err)
		}
		if n == 0 || time.Now().After(deadline) {
			return n, nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return n, ctx.Err()
		case <-t.C:
		}
	}
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on every
// Linux architecture Go supports).
const clockTicks = 100

// serverCPU returns the user+system CPU time of the postmaster pm and of
// every live process it forked (a backend's parent is the postmaster; its
// process group is not: each backend calls setsid), plus the time of the
// children the postmaster has reaped (its cutime and cstime), so that a
// backend counts whether or not its connection has closed.
func serverCPU(pm int) (time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("pgdb: cpu: %w", err)
	}
	var ticks int64
	found := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := statFields(pid)
		if err != nil || len(f) < 15 {
			continue // exited meanwhile
		}
		// f[0] is field 3 (state): field n is f[n-3].
		if ppid, _ := strconv.Atoi(f[1]); ppid != pm && pid != pm {
			continue
		}
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += ut + st
		if pid == pm {
			found = true
			cut, _ := strconv.ParseInt(f[13], 10, 64)
			cst, _ := strconv.ParseInt(f[14], 10, 64)
			ticks += cut + cst
		}
	}
	if !found {
		return 0, fmt.Errorf("pgdb: cpu: no process %d", pm)
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// statFields returns the fields of /proc/<pid>/stat after the command name.
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, errors.New("pgdb: malformed stat")
	}
	return strings.Fields(string(b[i+1:])), nil
}
