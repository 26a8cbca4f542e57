package bench

import (
	"context"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/pgserver"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/redisproc"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// TestMain doubles as the worker: the harness re-executes the test binary
// with ChildEnv set to run its worker processes.
func TestMain(m *testing.M) {
	if IsChild() {
		os.Exit(ChildMain())
	}
	if _, err := redisproc.Binary(); err != nil {
		fmt.Fprintln(os.Stderr, "SKIP:", err)
		if os.Getenv("CACHEGUARD_REQUIRE_REDIS") == "1" {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testEnv is an env on a fresh server with quick sizes and one repetition.
func testEnv(t *testing.T) *env {
	t.Helper()
	srv, err := redisproc.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := Config{Quick: true, tiny: true, Reps: 1}
	res := newResults(cfg)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { admin.Close() })
	e := &env{cfg: cfg, s: res.s, reps: 1, addr: srv.Addr(), admin: admin, res: res}
	t.Cleanup(func() {
		e.spares.close()
		if e.pg != nil {
			e.pg.Close()
		}
	})
	return e
}

// havePG skips the test when PostgreSQL's server binaries are not installed.
func havePG(t *testing.T) {
	t.Helper()
	if _, err := pgserver.BinDir(); err != nil {
		t.Skip(err)
	}
}

// On the real database the harness counts every query in the loaders and
// PostgreSQL counts the same ones: a naive cache-aside sends several for a
// cold key, cacheguard one, and both counts agree when no client gave up.
func TestPGCountsQueries(t *testing.T) {
	havePG(t)
	e := testEnv(t)
	e.cfg.Systems = []string{systems.Naive, systems.Guard}
	ctx := context.Background()
	if err := e.pgStampede(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.pgMix(ctx); err != nil {
		t.Fatal(err)
	}
	if e.res.PG == nil || e.res.PG.Alone <= 0 {
		t.Fatalf("no description of the database: %+v", e.res.PG)
	}
	st, mix, mdb := e.res.Table("pg-stampede"), e.res.Table("pg-mix"), e.res.Table("pg-mix-db")
	for _, tb := range []*Table{st, mix, mdb} {
		for _, r := range tb.Rows {
			if len(r.Errs) > 0 {
				t.Errorf("%s / %s: %v", tb.ID, r.System, r.Errs)
			}
		}
	}
	med := func(tb *Table, sys, key string) float64 {
		v, ok := tb.Median(sys, key)
		if !ok {
			t.Errorf("%s / %s: no %s", tb.ID, sys, key)
		}
		return v
	}
	if n := med(st, systems.Naive, "loads"); n <= 1 {
		t.Errorf("naive stampede sent %v queries, want > 1", n)
	}
	if n, pg := med(st, systems.Guard, "loads"), med(st, systems.Guard, "pgcalls"); n != 1 || pg != 1 {
		t.Errorf("cacheguard stampede: %v queries sent, %v completed by PostgreSQL; want 1 and 1", n, pg)
	}
	if f := med(st, systems.Guard, "failed"); f != 0 {
		t.Errorf("cacheguard stampede: %v failed requests", f)
	}
	for _, sys := range []string{systems.Naive, systems.Guard} {
		sent, answered, pg := med(mdb, sys, "loads"), med(mdb, sys, "answered"), med(mdb, sys, "pgcalls")
		if sent < 1 || answered > pg || pg > sent {
			t.Errorf("%s mix: %v queries sent, %v answered, %v completed by PostgreSQL; want 1 ≤ answered ≤ completed ≤ sent", sys, sent, answered, pg)
		}
		if v := med(mix, sys, "rps"); v <= 0 {
			t.Errorf("%s mix: %v completed/s", sys, v)
		}
		if v := med(mdb, sys, "ideal"); v < 0.5 {
			t.Errorf("%s mix: loads ÷ ideal %v", sys, v)
		}
	}
	if v := med(mdb, systems.Guard, "overlap"); v != 0 {
		t.Errorf("cacheguard mix: %v queries overlapped another for the same key", v)
	}
	if s := e.res.PGSeries[systems.Guard]; s == nil || len(s.Done) == 0 {
		t.Error("no time series for the chart")
	}
}

// The stampede harness must count every load in every process: a naive
// cache-aside makes many loads, per-process singleflight at most one per
// process, and every request is accounted for.
func TestStampedeCountsLoads(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	const procs, g = 2, 8

	b, err := e.burst(ctx, systems.Naive, procs, g, false)
	if err != nil {
		t.Fatal(err)
	}
	if b.failures != nil {
		t.Fatal(b.failures)
	}
	if b.loads <= 1 || b.loads > procs*g {
		t.Errorf("naive cache-aside: %d loads, want 2..%d", b.loads, procs*g)
	}
	if len(b.lat) != procs*g {
		t.Errorf("naive cache-aside: %d latencies, want %d", len(b.lat), procs*g)
	}

	b, err = e.burst(ctx, systems.Singleflight, procs, g, false)
	if err != nil {
		t.Fatal(err)
	}
	if b.loads < 1 || b.loads > procs {
		t.Errorf("singleflight: %d loads, want 1..%d", b.loads, procs)
	}
}

// A worker process serves run after run: the second burst runs in the
// processes of the first, whose systems were closed in between, and each
// run's report is its own. Closing the spares ends the processes.
func TestWorkersServeRunAfterRun(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	const procs, g = 2, 8
	pids := func() []int {
		e.spares.mu.Lock()
		defer e.spares.mu.Unlock()
		var p []int
		for _, c := range e.spares.idle {
			p = append(p, c.cmd.Process.Pid)
		}
		slices.Sort(p)
		return p
	}
	var first []int
	for run := range 2 {
		b, err := e.burst(ctx, systems.Singleflight, procs, g, false)
		if err != nil {
			t.Fatal(err)
		}
		if b.failures != nil || len(b.lat) != procs*g || b.loads < 1 || b.loads > procs {
			t.Fatalf("run %d: %v, %d latencies, %d loads", run+1, b.failures, len(b.lat), b.loads)
		}
		if run == 0 {
			first = pids()
			if len(first) != procs {
				t.Fatalf("after the first run, %d idle workers, want %d", len(first), procs)
			}
		} else if got := pids(); !slices.Equal(got, first) {
			t.Errorf("the second run's workers %v, want the first's %v", got, first)
		}
	}
	idle := e.spares.idle
	e.spares.close()
	for _, c := range idle {
		if c.cmd.ProcessState == nil || !c.cmd.ProcessState.Success() {
			t.Errorf("worker %d: %v after close", c.cmd.Process.Pid, c.cmd.ProcessState)
		}
	}
}

// A worker serves another job only once the goroutines of the last one's
// system are gone: settled waits for one that is ending, and gives up on
// one that stays.
//
// The count settled reads is the process's: the goroutines an earlier test
// left winding down (a worker's pipes, a client's connections) would end
// during the test and hide the one that stays, so the test first waits for
// the count to hold still for 200ms (at most 10s), and keeps four stayers.
func TestSettledWaitsForGoroutines(t *testing.T) {
	for deadline, last, still := time.Now().Add(10*time.Second), -1, 0; still < 20 && time.Now().Before(deadline); still++ {
		if n := runtime.NumGoroutine(); n != last {
			last, still = n, 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	n := runtime.NumGoroutine()
	ending := make(chan struct{})
	done := make(chan struct{})
	go func() {
		<-ending
		close(done)
	}()
	time.AfterFunc(20*time.Millisecond, func() { close(ending) })
	if !settled(n) {
		t.Error("not settled although the goroutine ended")
	}
	<-done
	stay := make(chan struct{})
	defer close(stay)
	for range 4 {
		go func() { <-stay }()
	}
	if settled(n) {
		t.Error("settled although a goroutine stays")
	}
}

// A stampede's timeline covers its load: the load's own time is what the
// loader took, and no request returned before it ended.
func TestStampedeTimeline(t *testing.T) {
	e := testEnv(t)
	ctx := context.Background()
	for _, sys := range []string{systems.Guard, systems.Singleflight} {
		b, err := e.burst(ctx, sys, 2, 8, true)
		if err != nil {
			t.Fatal(err)
		}
		if b.failures != nil || b.tlErr != nil {
			t.Fatalf("%s: %v, timeline: %v", sys, b.failures, b.tlErr)
		}
		tl := b.tl
		if tl.load < e.s.load || tl.p99 < tl.load || tl.overhead != tl.p99-tl.load || tl.front < 0 || tl.filler < 0 {
			t.Errorf("%s: implausible timeline %+v (load %v)", sys, tl, e.s.load)
		}
		if sys == systems.Singleflight && (tl.pushed || tl.decoded) {
			t.Errorf("%s: a push heard, or a value from another process: %+v", sys, tl)
		}
	}
}

// A contended run must see one holder at a time and account for its time.
func TestContendedMeasuresExclusion(t *testing.T) {
	e := testEnv(t)
	if err := e.contended(context.Background()); err != nil {
		t.Fatal(err)
	}
	tb := e.res.Table("contended")
	for _, r := range tb.Rows {
		if r.Skip != "" {
			continue
		}
		if len(r.Errs) > 0 {
			t.Errorf("%s: %v", r.System, r.Errs)
		}
		if s, ok := r.Summary("overlap"); !ok || s.Max != 0 {
			t.Errorf("%s: overlapping holders %v (measured %v)", r.System, s.Max, ok)
		}
		if s, _ := r.Summary("util"); s.Median <= 0 || s.Median > 1.001 {
			t.Errorf("%s: share of time held %v, want (0, 1]", r.System, s.Median)
		}
	}
}

// Every scenario runs end to end with tiny sizes and writes its report.
func TestSmokeAllScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every scenario")
	}
	only := map[string]bool{}
	for _, s := range Scenarios {
		if s != "micro" && s != "contended" { // contended: TestContendedMeasuresExclusion
			only[s] = true
		}
	}
	res, err := Run(context.Background(), Config{Quick: true, tiny: true, Reps: 1, Only: only, Log: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"uncontended", "lone-cycle", "lone-cycle-request", "names", "handoff", "redlock", "stampede", "stampede-wake", "warm-1", "lone-hit", "scale-procs-loads",
		"scale-total-p99", "mix", "near-prop"}
	wantMD := []string{"## Targets", "1. Uncontended lock cycle", "4. Stampede", "results/stampede-latency.png",
		"results/scale-processes.png", "results/scale-requests.png"}
	if _, err := pgserver.BinDir(); err == nil {
		ids = append(ids, "pg-stampede", "pg-stampede-wake", "pg-mix", "pg-mix-db")
		wantMD = append(wantMD, "## Real database", "R2. Hot-key mix, real PostgreSQL", "results/pg-mix-timeline.png")
	}
	for _, id := range ids {
		tb := res.Table(id)
		if tb == nil {
			t.Errorf("no table %s", id)
			continue
		}
		for _, r := range tb.Rows {
			if len(r.Errs) > 0 {
				t.Errorf("%s / %s: %v", id, r.System, r.Errs)
			}
			if r.Skip == "" {
				if _, ok := r.Summary(tb.Metrics[0].Key); !ok {
					t.Errorf("%s / %s: no data", id, r.System)
				}
			}
		}
	}
	if s, _ := res.Table("stampede").Row(systems.Naive).Summary("loads"); s.Median <= 1 {
		t.Errorf("naive stampede made %v loads, want > 1", s.Median)
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "results"), 0o755); err != nil {
		t.Fatal(err)
	}
	charts, err := res.Charts(filepath.Join(dir, "results"))
	if err != nil {
		t.Fatal(err)
	}
	if len(charts) == 0 {
		t.Error("no chart written")
	}
	for _, c := range charts {
		f, err := os.Open(c)
		if err != nil {
			t.Errorf("chart %s: %v", c, err)
			continue
		}
		if _, err := png.DecodeConfig(f); err != nil {
			t.Errorf("chart %s: %v", c, err)
		}
		f.Close()
	}
	md := res.Markdown(Describe(), "go test", charts, dir)
	for _, want := range wantMD {
		if !strings.Contains(md, want) {
			t.Errorf("RESULTS.md lacks %q", want)
		}
	}
}

// testLog sends the harness's progress lines to the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// Every row a target reads is listed in targetRows, so that it runs every
// repetition.
func TestTargetsReadTargetRows(t *testing.T) {
	res := newResults(Config{})
	res.Tables = append(res.Tables, &Table{ID: "pg-mix"}, &Table{ID: "pg-stampede"})
	res.PG = &PGInfo{Alone: 20 * time.Millisecond}
	reads := 0
	res.onRead = func(table, system string) {
		reads++
		if !targetRow(table, system) {
			t.Errorf("a target reads %s / %s, which targetRows does not list", table, system)
		}
	}
	res.Targets()
	if reads == 0 {
		t.Fatal("no row read")
	}
}

// A row no target reads runs fewReps repetitions (a slow one its cap), a
// target row all of them, interleaved; -reps runs every row that many.
func TestSeriesRepsPerRow(t *testing.T) {
	for _, tc := range []struct {
		reps, flag, target, other int
	}{{5, 0, 5, fewReps}, {2, 0, 2, 2}, {4, 4, 4, 4}} {
		e := &env{cfg: Config{Reps: tc.flag}, reps: tc.reps, res: newResults(Config{})}
		tb := &Table{ID: "stampede"}
		var order []string
		err := e.seriesN(context.Background(), tc.reps, tb, []string{systems.Naive, systems.Guard, systems.LockRedsync}, func(_ context.Context, r *Row, _ int) error {
			order = append(order, r.System)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for _, s := range order {
			n[s]++
		}
		slow := min(tc.reps, max(slowRows["stampede"].reps, tc.flag))
		if n[systems.Guard] != tc.reps || n[systems.Naive] != min(tc.reps, max(tc.other, tc.flag)) || n[systems.LockRedsync] != slow {
			t.Errorf("reps %d, -reps %d: ran %v", tc.reps, tc.flag, order)
		}
		if len(order) >= 5 && order[3] != systems.Guard { // the second repetition starts one row later
			t.Errorf("reps %d: order %v", tc.reps, order)
		}
	}
}

// No row a target reads is capped as slow.
func TestSlowRowsAreNotTargetRows(t *testing.T) {
	for id, rows := range slowRows {
		for _, s := range rows.systems {
			if targetRow(id, s) {
				t.Errorf("%s / %s is both a target row and a slow one", id, s)
			}
		}
	}
}

// microMedian reads go test -bench output: the median over the runs of one
// benchmark, whatever its -GOMAXPROCS suffix, and no other's.
func TestMicroMedian(t *testing.T) {
	out := `BenchmarkWarmGetMany/small/many-2    	     500	    400000 ns/op	   85712 B/op	     634 allocs/op
BenchmarkWarmGetMany/small/many-2    	     500	    300000 ns/op	   85712 B/op	     634 allocs/op
BenchmarkWarmGetMany/small/many-2    	     500	    900000 ns/op	   85712 B/op	     634 allocs/op
BenchmarkWarmGetMany/repo/many-2     	     500	      1000 ns/op
BenchmarkWarmGetMany/small/sequential-8	      50	   7000000 ns/op
BenchmarkWarmGetMany/small/sequential-8	      50	   8000000 ns/op
PASS`
	if v, ok := microMedian(out, "BenchmarkWarmGetMany/small/many"); !ok || v != 400000 {
		t.Errorf("many: %v %v, want 400000", v, ok)
	}
	if v, ok := microMedian(out, "BenchmarkWarmGetMany/small/sequential"); !ok || v != 7500000 {
		t.Errorf("sequential: %v %v, want 7500000", v, ok)
	}
	if _, ok := microMedian(out, "BenchmarkWarmGetMany/small"); ok {
		t.Error("a parent's name matched its sub-benchmarks")
	}
}

// A baseline that loads in every process can serve its p99 in less than its
// longest load (R1b once read -4.0 ms): the cold-key rows then give no
// ratio, and the figures decide.
func TestOverRatioOfNoPositiveBaseline(t *testing.T) {
	if got := ratioOrDash(overRatio(7.3, -4.0)); got != "–" {
		t.Errorf("ratio to a negative baseline printed %q, want –", got)
	}
	if got := ratioOrDash(overRatio(7.3, 0)); got != "–" {
		t.Errorf("ratio to a zero baseline printed %q, want –", got)
	}
	if got := ratioOrDash(overRatio(6, 3)); got != "2.00×" {
		t.Errorf("ratio printed %q, want 2.00×", got)
	}
}

// The real database's table is sized by the query's time when a share is
// given: the mix's ideal (keys ÷ TTL queries a second, each taking the
// query's time alone) asks the database for that share of the host's CPUs.
func TestPGSizedByShare(t *testing.T) {
	s := sizes{pgShare: 0.2, pgMixKeys: 50, pgMixTTL: 2 * time.Second}
	want := time.Duration(0.2 * float64(runtime.NumCPU()) / 25 * float64(time.Second))
	if got := s.pgAlone(); got != want {
		t.Errorf("pgAlone = %v, want %v", got, want)
	}
	if got := (sizes{pgMixKeys: 50, pgMixTTL: 2 * time.Second}).pgAlone(); got != 0 {
		t.Errorf("pgAlone without a share = %v, want 0 (fixed rows)", got)
	}
	havePG(t)
	ctx := context.Background()
	small, err := pgdb.Start(ctx, pgdb.Options{Rows: 5_000, Repos: 100})
	if err != nil {
		t.Fatal(err)
	}
	alone := small.Alone
	small.Close()
	// Four times the small table's query: the table must grow, and its
	// query take longer (by far more than the timing's noise).
	db, err := pgdb.Start(ctx, pgdb.Options{Rows: 5_000, Repos: 100, Alone: 4 * alone})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Rows() <= 5_000 {
		t.Errorf("sized for %v (4 × %v): %d rows, want more than 5000", 4*alone, alone, db.Rows())
	}
}
