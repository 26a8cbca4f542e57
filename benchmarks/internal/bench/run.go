// Package bench is the cgbench harness: it runs every scenario for cacheguard
// and its peers, interleaved, in worker processes, and writes RESULTS.md.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/redisproc"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// Scenarios, in the order they run.
var Scenarios = []string{"pg-stampede", "pg-mix", "near-prop", "uncontended", "names", "contended", "handoff", "redlock", "stampede", "warm", "scale", "mix", "micro"}

// Config says what to run and how big.
type Config struct {
	Quick bool            // small sizes, for CI: proves the harness runs, not speed
	Long  bool            // the 30 s hot-key mixes (6c and R2)
	Reps  int             // repetitions per system (0: 5, or 2 with Quick)
	Only  map[string]bool // scenarios to run; all when empty
	// Systems, when set, keeps only the systems whose name contains one of
	// these substrings (for investigating one system).
	Systems []string
	Redis   string    // an existing server to use instead of starting one
	Log     io.Writer // progress; nil for none
	tiny    bool      // smaller than Quick, for the package's own tests under -race

	// Micro runs `go test -bench` in this directory (the benchmarks module);
	// the micro scenario is skipped when empty.
	MicroDir string
	// Trace, when set, is a directory where each run of the real-database
	// mix of a cacheguard system writes what its workers did (every request,
	// query, observer event, command and message; see systems.Trace), to
	// investigate failed requests.
	Trace string
	// PGShare sizes the real database's table: the loader's query is made
	// to take, alone, this share of the host's CPU time that the
	// real-database mix's ideal (one load of each key per TTL) asks of the
	// database (0: the table keeps its fixed size, whatever the query then
	// costs; Quick ignores it).
	PGShare float64
}

func (c Config) want(s string) bool { return len(c.Only) == 0 || c.Only[s] }

func (c Config) keep(system string) bool {
	for _, s := range c.Systems {
		if strings.Contains(system, s) {
			return true
		}
	}
	return len(c.Systems) == 0
}

func (c Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, time.Now().Format("15:04:05 ")+format+"\n", args...)
	}
}

// sizes are the knobs of every scenario.
type sizes struct {
	cycleG         int
	cycleDur       time.Duration
	contProcs      int
	contG          int
	hold           time.Duration
	contDur        time.Duration
	pollRetry      time.Duration
	stampProcs     int
	stampG         int
	load           time.Duration
	stampRetry     time.Duration
	warmG          int
	warmDur        time.Duration
	warmKeys       int
	loneDur        time.Duration // a one-goroutine run (tables 1c, 5c)
	scaleProcs     []int         // sweep A: processes, with scaleG goroutines each
	scaleG         int
	scaleTotals    []int // sweep B: total concurrent requests over scaleFixedP processes
	scaleFixedP    int
	mixProcs       int
	mixG           int
	mixInterval    time.Duration
	mixKeys        int
	mixTTL         time.Duration
	mixDur         time.Duration
	mixReps        int // at most this many repetitions of the mix (all with Long)
	microCount     int
	microIters     string // -benchtime of the micro-benchmarks: a fixed number of iterations
	microIterMany  string // the same for BenchmarkWarmGetMany's 100 Gets in a row
	microIterBatch string // and for its GetMany of the same 100 keys, ~15 times cheaper

	// The real database.
	pgRows     int           // table size: the loader's query scans every row
	pgShare    float64       // or sized so: see Config.PGShare
	pgPool     int           // connections per worker process
	pgDeadline time.Duration // per request
	pgMixProcs int
	pgMixRate  float64 // requests/s offered, all processes together
	pgMixKeys  int
	pgMixTTL   time.Duration
	pgMixWarm  time.Duration // the ramp-up, left out of the steady-state figures
	pgMixDur   time.Duration
	pgMixReps  int // at most this many repetitions
	pgBucket   time.Duration

	nearDur time.Duration // the near-cache propagation rounds of one run

	manyNames   int   // names of the many-name uncontended run
	handWaiters []int // local waiters of the hand-off scenario
	newReps     int   // at most this many repetitions of tables 1b, 2b and 8 (0: all)
}

func (c Config) sizes() sizes {
	s := sizes{
		cycleG: 16, cycleDur: 1500 * time.Millisecond,
		contProcs: 4, contG: 4, hold: time.Millisecond, contDur: 1500 * time.Millisecond, pollRetry: time.Millisecond,
		stampProcs: 8, stampG: 128, load: 50 * time.Millisecond, stampRetry: 50 * time.Millisecond,
		warmG: 16, warmDur: time.Second, warmKeys: 1000, loneDur: 400 * time.Millisecond,
		scaleProcs: []int{1, 2, 4, 8, 16}, scaleG: 128, scaleTotals: []int{128, 512, 1024, 4096}, scaleFixedP: 8,
		mixProcs: 4, mixG: 32, mixInterval: 16 * time.Millisecond, mixKeys: 10_000, mixTTL: time.Second, mixDur: 3 * time.Second, mixReps: 2,
		microCount: 5, microIters: "1000x", microIterMany: "50x", microIterBatch: "500x",
		pgRows: 500_000, pgShare: c.PGShare, pgPool: 10, pgDeadline: time.Second,
		pgMixProcs: 8, pgMixRate: 2000, pgMixKeys: 50, pgMixTTL: 2 * time.Second, pgMixWarm: 2 * time.Second,
		pgMixDur: 6 * time.Second, pgMixReps: 3, pgBucket: 200 * time.Millisecond,
		nearDur:   3 * time.Second,
		manyNames: 10_000, handWaiters: []int{1, 100, 1000}, newReps: 3,
	}
	if c.Long {
		s.mixDur, s.mixReps = 30*time.Second, 0
		s.pgMixDur = 30 * time.Second // R2: ten and more refresh cycles of its 2 s TTL, not three
	}
	if c.Quick {
		s.cycleG, s.cycleDur = 4, 150*time.Millisecond
		s.contProcs, s.contG, s.contDur = 2, 2, 200*time.Millisecond
		s.stampProcs, s.stampG = 2, 16
		s.warmG, s.warmDur, s.warmKeys, s.loneDur = 4, 150*time.Millisecond, 20, 100*time.Millisecond
		s.scaleProcs, s.scaleG, s.scaleTotals, s.scaleFixedP = []int{1, 2}, 16, []int{16, 64}, 2
		s.mixProcs, s.mixG, s.mixKeys, s.mixDur, s.mixTTL = 2, 4, 200, 600*time.Millisecond, 200*time.Millisecond
		s.microCount, s.microIters, s.microIterMany, s.microIterBatch = 1, "20x", "5x", "20x"
		s.pgRows, s.pgShare, s.pgMixReps = 20_000, 0, 1
		s.pgMixProcs, s.pgMixRate, s.pgMixKeys, s.pgMixTTL, s.pgMixWarm, s.pgMixDur = 2, 100, 20, 300*time.Millisecond, 300*time.Millisecond, 1200*time.Millisecond
		s.nearDur = 400 * time.Millisecond
		s.manyNames, s.handWaiters = 200, []int{1, 10, 50}
	}
	if c.tiny {
		s.cycleDur, s.contDur, s.warmDur, s.warmKeys = 100*time.Millisecond, 150*time.Millisecond, 100*time.Millisecond, 5
		s.stampG = 8
		s.scaleProcs, s.scaleG, s.scaleTotals, s.scaleFixedP = []int{1}, 8, []int{8}, 1
		s.mixG, s.mixKeys, s.mixDur, s.mixTTL = 2, 50, 400*time.Millisecond, 150*time.Millisecond
		s.pgRows, s.pgPool = 5_000, 4
		s.pgMixRate, s.pgMixDur = 60, 900*time.Millisecond
		s.manyNames, s.handWaiters = 40, []int{1, 5}
	}
	return s
}

func (c Config) reps() int {
	switch {
	case c.Reps > 0:
		return c.Reps
	case c.Quick:
		return 2
	}
	return 5
}

// Results is everything a run measured.
type Results struct {
	Started time.Time
	Took    time.Duration
	// Steps is each scenario's wall time, in the order they ran.
	Steps  []Step
	Quick  bool
	Long   bool
	Reps   int // repetitions of a row a target reads
	Few    int // repetitions of the other rows (see env.repsOf)
	Tables []*Table
	// Latency samples pooled over repetitions, in ms, for the charts.
	StampedeLat   map[string][]float64
	ContendedWait map[string][]float64
	PGStampedeLat map[string][]float64
	// PGSeries is the last repetition of the real-database mix over time.
	PGSeries map[string]*Series
	PG       *PGInfo  // nil when the real-database scenarios did not run
	Micro    string   // go test -bench output
	Notes    []string // skipped scenarios and other remarks
	s        sizes
	// onRead, when set, is told of every row the targets read (tests).
	onRead func(table, system string)
}

func (r *Results) read(table, system string) {
	if r.onRead != nil {
		r.onRead(table, system)
	}
}

// Table returns the table with the given ID, or nil.
func (r *Results) Table(id string) *Table {
	for _, t := range r.Tables {
		if t.ID == id {
			return t
		}
	}
	return nil
}

// env is what scenarios share: the main server and an admin client on it.
type env struct {
	serverCmds int64 // commands Redis ran in the last measured run (see serverCounters)
	cfg        Config
	s          sizes
	reps       int
	addr       string
	admin      *redis.Client
	res        *Results
	seq        int          // makes keys unique within a run
	pg         *pgdb.Server // started by the first real-database scenario
	pgErr      error        // why it could not start
	// spares are the worker processes idle between runs; they keep their
	// database pools open, so they end before the database does.
	spares spares
}

func (e *env) key(prefix string) string {
	e.seq++
	return prefix + ":" + strconv.FormatInt(e.res.Started.UnixNano(), 36) + ":" + strconv.Itoa(e.seq)
}

// pgSteps are the scenarios that run on the real database.
var pgSteps = []string{"pg-stampede", "pg-mix", "near-prop"}

// Run runs the selected scenarios and returns their results.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	res := newResults(cfg)
	e := &env{cfg: cfg, s: res.s, reps: res.Reps, addr: cfg.Redis, res: res}
	if e.addr == "" {
		srv, err := redisproc.Start()
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		e.addr = srv.Addr()
	}
	e.admin = redis.NewClient(&redis.Options{Addr: e.addr})
	defer e.admin.Close()
	defer func() {
		e.spares.close()
		if e.pg != nil {
			e.pg.Close()
		}
	}()
	if err := e.admin.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis at %s: %w", e.addr, err)
	}
	steps := []struct {
		name string
		fn   func(context.Context) error
	}{
		{"pg-stampede", e.pgStampede},
		{"pg-mix", e.pgMix},
		{"near-prop", e.nearProp},
		{"uncontended", e.uncontended},
		{"names", e.manyNames},
		{"contended", e.contended},
		{"handoff", e.handoff},
		{"redlock", e.redlock},
		{"stampede", e.stampede},
		{"warm", e.warm},
		{"scale", e.scale},
		{"mix", e.mix},
		{"micro", e.micro},
	}
	// The real database runs from the first scenario that needs it to the
	// last (pgSteps), not beside the Redis scenarios after them.
	lastPG := -1
	for i, st := range steps {
		if cfg.want(st.name) && slices.Contains(pgSteps, st.name) {
			lastPG = i
		}
	}
	for i, st := range steps {
		if i > lastPG && e.pg != nil {
			e.spares.close()
			e.pg.Close()
			e.pg = nil
		}
		if !cfg.want(st.name) {
			continue
		}
		t0 := time.Now()
		cfg.logf("scenario %s", st.name)
		if err := st.fn(ctx); err != nil {
			return res, fmt.Errorf("scenario %s: %w", st.name, err)
		}
		took := time.Since(t0)
		res.Steps = append(res.Steps, Step{st.name, took})
		cfg.logf("scenario %s done in %v", st.name, took.Round(time.Second))
	}
	res.Took = time.Since(res.Started)
	return res, nil
}

// Step is one scenario's wall time.
type Step struct {
	Name string
	Took time.Duration
}

func newResults(cfg Config) *Results {
	few := min(cfg.reps(), fewReps)
	if cfg.Reps > 0 {
		few = cfg.Reps
	}
	return &Results{Started: time.Now(), Quick: cfg.Quick, Long: cfg.Long, Reps: cfg.reps(), Few: few, s: cfg.sizes(),
		StampedeLat: map[string][]float64{}, ContendedWait: map[string][]float64{},
		PGStampedeLat: map[string][]float64{}, PGSeries: map[string]*Series{}}
}

// series runs fn for every system and repetition, interleaved: each
// repetition runs every system once, starting one system later than the
// previous repetition (A B C, B C A, …), so drift in the machine's load
// spreads over all systems. A system that is not merged yet is skipped with a
// TODO in its row; a failed run is recorded in its row and the series goes on.
// capped returns the repetitions of a scenario capped at n (0: no cap),
// unless -reps asked for a number.
func (e *env) capped(n int) int {
	if n > 0 && e.cfg.Reps == 0 {
		return min(e.reps, n)
	}
	return e.reps
}

func (e *env) series(ctx context.Context, t *Table, names []string, fn func(ctx context.Context, r *Row, rep int) error) error {
	return e.seriesN(ctx, e.reps, t, names, fn)
}

// seriesN is series with n repetitions for the rows a target reads
// (targetRow), and at most fewReps for the others, unless -reps asked for a
// number: a repetition runs the rows that still need one, in rotating order.
func (e *env) seriesN(ctx context.Context, n int, t *Table, names []string, fn func(ctx context.Context, r *Row, rep int) error) error {
	var live []string
	for _, n := range names {
		if !e.cfg.keep(n) {
			continue
		}
		r := t.Row(n)
		if err := systems.Available(n); err != nil {
			r.Skip = "TODO: not merged yet"
			if !errors.Is(err, systems.ErrNotMerged) {
				r.Skip = err.Error()
			}
			continue
		}
		live = append(live, n)
	}
	for rep := range n {
		var due []string
		for _, s := range live {
			if rep < e.repsOf(t.ID, s, n) {
				due = append(due, s)
			}
		}
		k := rep % max(len(due), 1)
		for _, n := range slices.Concat(due[k:], due[:k]) {
			if err := ctx.Err(); err != nil {
				return err
			}
			r := t.Row(n)
			t0 := time.Now()
			err := fn(ctx, r, rep)
			e.cfg.logf("  %-40s rep %d  %v", n, rep+1, time.Since(t0).Round(time.Millisecond))
			if err != nil {
				e.cfg.logf("  %s: %v", n, err)
				r.Errs = append(r.Errs, oneLine(err.Error()))
			}
		}
	}
	return nil
}

// fewReps is how many repetitions a row that no target reads runs at most:
// enough for a median and its spread.
const fewReps = 3

// repsOf returns the repetitions of system's row of table id when its
// scenario runs n: all n for a row a target reads, at most fewReps for the
// others, unless -reps asked for a number.
func (e *env) repsOf(id, system string, n int) int {
	switch {
	case e.cfg.Reps > 0 || targetRow(id, system):
		return n
	case slices.Contains(slowRows[id].systems, system):
		return min(n, slowRows[id].reps)
	}
	return min(n, fewReps)
}

// slowRows are rows no target reads whose runs cost seconds and whose
// verdict was the same in every repetition on record: they run at most the
// repetitions given (their tables' intros say so). The stampede's
// lock+double-check peers took 2.4-16.5 s a run (60 of the scenario's 75 s at
// 3 repetitions, against 0.3-0.7 s a run for the others), their p99 27-200
// times cacheguard's in every run on record: one run each shows that; on the
// real database, the go-redis/cache rows failed thousands of the mix's
// requests in every repetition, and so did cacheguard's near-cache row
// (366-4,929), and in the stampede naive cache-aside failed all 1024 requests
// (5.5-7.3 s a run) while the per-process peers ran one query per process and
// failed none (but one repetition of Once).
var slowRows = map[string]slowRow{
	"stampede":    {1, []string{systems.LockRedsync, systems.LockBSM, systems.LockRueidis}},
	"pg-mix":      {2, []string{systems.GoRedisCache, systems.GoRedisLocal, systems.GuardNear}},
	"pg-stampede": {2, []string{systems.Naive, systems.Singleflight, systems.GoRedisCache, systems.GoRedisLocal}},
}

// slowRow is the cap on the repetitions of some rows of a table.
type slowRow struct {
	reps    int
	systems []string
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// serverCounters reads the server's CPU time, its count of pub/sub
// (un)subscribe commands, which go-redis hooks do not see, and of every
// command it ran — those a script ran included, the harness's own (INFO,
// CONFIG, CLIENT, PING, HELLO) not: a count of the work asked of Redis that does not
// depend on the host.
func (e *env) serverCounters(ctx context.Context) (cpu time.Duration, subs, all int64) {
	cpu, _ = redisproc.CPU(ctx, e.admin)
	info, err := e.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return cpu, 0, 0
	}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, _ := strconv.ParseInt(calls, 10, 64)
		switch cmd, _, _ := strings.Cut(strings.TrimPrefix(name, "cmdstat_"), "|"); cmd {
		// Not PSUBSCRIBE: no system uses it, the stampede's timeline does (see pushWatch).
		case "subscribe", "unsubscribe", "ssubscribe", "sunsubscribe":
			subs += n
			all += n
		case "info", "config", "client", "ping", "hello", "auth", "select":
		default:
			all += n
		}
	}
	return cpu, subs, all
}

// measured runs jobs in worker processes and returns their reports with the
// server CPU and (un)subscribe commands spent between GO and the last report.
// e.serverCmds is set to the commands it ran meanwhile (see serverCounters).
func (e *env) measured(ctx context.Context, jobs []Job) (reps []Report, cpu time.Duration, subs int64, err error) {
	var cpu0, cpu1 time.Duration
	var s0, s1, a0, a1 int64
	reps, err = e.spares.run(ctx, jobs, Hooks{
		BeforeGo: func() { cpu0, s0, a0 = e.serverCounters(ctx) },
		AfterRun: func() { cpu1, s1, a1 = e.serverCounters(ctx) },
	})
	e.serverCmds = a1 - a0
	return reps, cpu1 - cpu0, s1 - s0, err
}

func firstErr(reps []Report) error {
	var n int64
	first := ""
	for _, r := range reps {
		n += r.Errors
		if first == "" {
			first = r.FirstErr
		}
	}
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d operation(s) failed, first: %s", n, first)
}
