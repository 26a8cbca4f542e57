package pgdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The loader's failures, for errors.Is. Each wraps (joins) the cause, the
// context's error included.
var (
	// ErrPool: no connection of the pool was free before the caller's
	// context ended (pool exhaustion).
	ErrPool = errors.New("pgdb: no pool connection before the deadline")
	// ErrQuery: the query failed or the caller's context ended while it ran.
	ErrQuery = errors.New("pgdb: query failed")
	// ErrSealed: the run is over (Seal); the query was not sent.
	ErrSealed = errors.New("pgdb: the run is over")
)

// Row is what the loader's query returns for one repo.
type Row struct {
	Events, Stars, MaxSize int64
}

// Loader runs the loader's query on a pool that Pools keeps and counts what
// it does, for one run. It is safe for concurrent use; it needs no closing.
type Loader struct {
	pool *pgxpool.Pool

	sent      atomic.Int64 // queries sent to the server
	ok        atomic.Int64 // queries that returned a row
	poolFails atomic.Int64 // calls that found no connection in time
	queryErrs atomic.Int64 // queries that failed (deadline included)

	mu     sync.Mutex // guards spans and sealed, and orders sent against sealed
	spans  []Span     // every query sent
	sealed bool       // Seal: no more queries
}

// Span is one query: its repo and when it was sent and returned (wall
// clock, unix ns).
type Span struct {
	Key   int64 `json:"k"`
	Start int64 `json:"s"`
	End   int64 `json:"e"`
}

// Pools keeps a worker process's connection pools open from one run to the
// next, as a service's pool outlives any one burst of its requests. Every
// connection is warmed by one run of the loader's query before a run uses
// it, so that a run measures neither dialling nor a fresh backend's first
// scan: a backend maps the shared buffers it touches page by page, and its
// first scan of the table cost about 45 ms more than the next ones (60
// against 17 ms alone on the EPYC host) — in a run whose pools were fresh,
// most queries were a backend's first, and PostgreSQL spent twice the CPU a
// service that has been up would. Like most services, a pool uses pgx's
// defaults otherwise: a query whose context ends closes its connection (the
// server runs the query to its end regardless) and the next caller dials a
// new one; the next run's Loader warms it. The zero Pools is ready to use.
type Pools struct {
	mu sync.Mutex // guards m
	m  map[poolKey]*kept
}

type poolKey struct {
	dsn   string
	conns int
}

// kept is an open pool and the backends it has warmed.
type kept struct {
	pool   *pgxpool.Pool
	warmed map[uint32]bool // by backend pid
}

// Loader returns a loader with counts of its own on the pool of conns
// connections to dsn, opening the pool on first use, once each of the pool's
// conns connections is open and warm.
func (ps *Pools) Loader(ctx context.Context, dsn string, conns int) (*Loader, error) {
	if conns <= 0 {
		return nil, fmt.Errorf("pgdb: a pool of %d connections", conns)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	k := poolKey{dsn, conns}
	p := ps.m[k]
	if p == nil {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, fmt.Errorf("pgdb: %w", err)
		}
		cfg.MaxConns = int32(conns)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("pgdb: %w", err)
		}
		p = &kept{pool: pool, warmed: map[uint32]bool{}}
		if ps.m == nil {
			ps.m = map[poolKey]*kept{}
		}
		ps.m[k] = p
	}
	// A connection found broken is closed, and the warm-up runs again
	// to replace it.
	for try := 0; ; try++ {
		broken, err := p.warm(ctx, conns)
		if err != nil {
			return nil, err
		}
		if broken == 0 {
			break
		}
		if try == 2 {
			return nil, fmt.Errorf("pgdb: %d pool connections still broken after %d warm-ups", broken, try+1)
		}
	}
	return &Loader{pool: p.pool}, nil
}

// warm holds all conns connections of the pool at once (dialling those that
// are missing, all together: one after another, they cost a round trip and a
// backend start each) and runs the loader's query on each one not warmed yet.
//
// A connection warmed in an earlier run is pinged first: a run's query cut
// by its deadline can leave its connection broken (a read deadline in the
// past: its next query fails at once with an i/o timeout), and the next run
// would find it so — one process's load failing for the harness's sake, not
// the system's. Such a connection is closed (the pool drops it) and counted
// in broken; the caller warms again.
func (p *kept) warm(ctx context.Context, conns int) (broken int, err error) {
	held := make([]*pgxpool.Conn, conns)
	errs := make([]error, conns)
	bad := make([]bool, conns)
	var wg sync.WaitGroup
	for i := range held {
		wg.Go(func() {
			c, err := p.pool.Acquire(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("pgdb: open the pool: %w", err)
				return
			}
			held[i] = c
			if p.warmed[c.Conn().PgConn().PID()] { // read only while the goroutines run
				if err := c.Ping(ctx); err != nil {
					bad[i] = true
					_ = c.Conn().Close(ctx)
				}
				return
			}
			if _, err := c.Exec(ctx, Query, -1); err != nil { // no such repo: the whole scan, no row
				errs[i] = fmt.Errorf("pgdb: warm-up query: %w", err)
			}
		})
	}
	wg.Wait()
	for i, h := range held {
		if h != nil {
			if bad[i] {
				broken++
			} else if errs[i] == nil {
				p.warmed[h.Conn().PgConn().PID()] = true
			}
			h.Release()
		}
	}
	if broken > 0 {
		fmt.Fprintf(os.Stderr, "pgdb: %d broken pool connection(s) replaced before the run\n", broken)
	}
	return broken, errors.Join(errs...)
}

// Close closes every pool.
func (ps *Pools) Close() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, p := range ps.m {
		p.pool.Close()
		delete(ps.m, k)
	}
}

// Load runs the query for repo under ctx.
func (l *Loader) Load(ctx context.Context, repo int64) (Row, error) {
	c, err := l.pool.Acquire(ctx)
	if err != nil {
		l.poolFails.Add(1)
		return Row{}, errors.Join(ErrPool, err)
	}
	defer c.Release()
	l.mu.Lock()
	if l.sealed {
		l.mu.Unlock()
		return Row{}, ErrSealed
	}
	l.sent.Add(1)
	l.mu.Unlock()
	sp := Span{Key: repo, Start: time.Now().UnixNano()}
	var r Row
	err = c.QueryRow(ctx, Query, repo).Scan(&r.Events, &r.Stars, &r.MaxSize)
	sp.End = time.Now().UnixNano()
	l.mu.Lock()
	l.spans = append(l.spans, sp)
	l.mu.Unlock()
	if err != nil {
		l.queryErrs.Add(1)
		return Row{}, errors.Join(ErrQuery, err)
	}
	l.ok.Add(1)
	return r, nil
}

// Seal ends the run: a Load from now on sends nothing and fails with
// ErrSealed, so that Stats, read after it, count every query the server will
// have run for this run (a cache's background refresh that began after the
// run's last request would otherwise reach the server uncounted).
func (l *Loader) Seal() {
	l.mu.Lock()
	l.sealed = true
	l.mu.Unlock()
}

// Stats are a loader's counts.
type Stats struct {
	Sent, OK, PoolFails, QueryErrs int64
	At                             []int64 // wall clock (unix ns) of every query sent and returned, sorted
	Spans                          []Span  // every query sent and returned, in no order
}

// Stats returns the counts so far.
func (l *Loader) Stats() Stats {
	l.mu.Lock()
	spans := slices.Clone(l.spans)
	l.mu.Unlock()
	at := make([]int64, len(spans))
	for i, sp := range spans {
		at[i] = sp.Start
	}
	slices.Sort(at)
	return Stats{Sent: l.sent.Load(), OK: l.ok.Load(), PoolFails: l.poolFails.Load(), QueryErrs: l.queryErrs.Load(),
		At: at, Spans: spans}
}
