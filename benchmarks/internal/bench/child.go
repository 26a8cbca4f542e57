package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// ChildEnv is set in the environment of worker processes: a binary that sees
// it must call ChildMain instead of its normal main (cgbench and the tests'
// TestMain do).
const ChildEnv = "CGBENCH_CHILD"

// ProfileEnv, when set to a directory in cgbench's environment, makes every
// worker process write a CPU profile of each job there.
const ProfileEnv = "CGBENCH_CPUPROFILE"

// IsChild reports whether this process was started as a worker.
func IsChild() bool { return os.Getenv(ChildEnv) == "1" }

// Job is what the coordinator asks one worker process to do.
type Job struct {
	Kind       string        `json:"kind"` // cycle, contended, stampede, warm, mix, pgstampede, pgmix, nearwatch, nearwrite
	System     string        `json:"system"`
	Addrs      []string      `json:"addrs"`
	Goroutines int           `json:"goroutines"`
	Duration   time.Duration `json:"duration,omitempty"`
	Hold       time.Duration `json:"hold,omitempty"`
	Retry      time.Duration `json:"retry,omitempty"`
	Key        string        `json:"key,omitempty"`
	Keys       int           `json:"keys,omitempty"` // warm: keys read; mix: key space
	Load       time.Duration `json:"load,omitempty"` // loader time
	TTL        time.Duration `json:"ttl,omitempty"`
	Interval   time.Duration `json:"interval,omitempty"` // mix: time between one goroutine's requests
	Seed       uint64        `json:"seed,omitempty"`
	// Settle is how long a stampede worker stays up after its requests
	// returned, so that background refreshes are done and counted.
	Settle time.Duration `json:"settle,omitempty"`
	// Cutoff makes a contended worker's waiters give up at the run's end
	// (without it they wait for their turn, one hold each).
	Cutoff bool `json:"cutoff,omitempty"`
	// Warmup is how long a mix worker runs before it records latencies.
	Warmup time.Duration `json:"warmup,omitempty"`
	// Timeline makes a stampede worker record where the time goes (Fill).
	Timeline bool `json:"timeline,omitempty"`
	// Trace makes a real-database mix worker of cacheguard record what it
	// did (Report.Trace), to investigate a run (cgbench -trace).
	Trace bool `json:"trace,omitempty"`
	// Request makes a cycle worker call each Lock and Unlock under a context
	// of its own that can be cancelled (context.WithCancel, as a server's
	// request has), instead of context.Background.
	Request bool `json:"request,omitempty"`
	// Wakes makes a cycle or warm worker run under the execution tracer
	// for Duration and report only who woke its goroutines (Report.Wakes).
	// It is a run of its own, after the timed one (see env.wakes): the
	// tracer slows calls down, and Redis's CPU and commands are read around
	// a whole run.
	Wakes bool `json:"wakes,omitempty"`

	// The real database (pgstampede, pgmix).
	DSN      string        `json:"dsn,omitempty"`
	Pool     int           `json:"pool,omitempty"`     // connections in this process's pool
	Deadline time.Duration `json:"deadline,omitempty"` // per request
	Rate     float64       `json:"rate,omitempty"`     // pgmix: requests/s this process offers
	Bucket   time.Duration `json:"bucket,omitempty"`   // pgmix: width of the time series' buckets
}

// Acq is one acquisition of a contended lock.
type Acq struct {
	Wait    int64 `json:"w"` // ns from the Lock call to its return
	Grant   int64 `json:"g"` // wall clock (unix ns) when Lock returned
	Release int64 `json:"r"` // wall clock when Unlock was called
}

// Report is what one worker process measured.
type Report struct {
	Ops      int64   `json:"ops"`              // completed operations
	Lat      []int64 `json:"lat,omitempty"`    // per-operation latency, ns
	Acqs     []Acq   `json:"acqs,omitempty"`   // contended
	Loads    int64   `json:"loads"`            // database loads
	LoadAt   []int64 `json:"loadAt,omitempty"` // mix: wall clock of each load start
	Requests int64   `json:"requests"`         // commands sent to Redis (client side)
	Mallocs  uint64  `json:"mallocs"`          // heap allocations during the run
	CSw      int64   `json:"csw"`              // cycle, warm: the process's context switches during the run (see osCounts)
	VCSw     int64   `json:"vcsw"`             // cycle, warm: the voluntary ones among them
	Syscalls int64   `json:"syscalls"`         // cycle, warm: its read/write system calls during the run; -1 when not counted
	CPU      int64   `json:"cpu,omitempty"`    // cycle, warm: the process's CPU time during the run, ns (see osCounts)
	Errors   int64   `json:"errors"`
	FirstErr string  `json:"firstErr,omitempty"`
	Start    int64   `json:"start"`   // wall clock (unix ns) at GO
	Elapsed  int64   `json:"elapsed"` // ns from GO to the end of the run

	// Dist is the latency distribution of a one-process run (cycle, warm),
	// computed by the worker after the run instead of Lat: a near cache's
	// millions of samples need not cross the pipe.
	Dist *stats.Dist `json:"dist,omitempty"`

	// ReqKey and ReqAt are every request of a mix: its key (the Zipf rank)
	// and when it was sent (unix ns), for the ideal number of loads.
	ReqKey []int32 `json:"reqKey,omitempty"`
	ReqAt  []int64 `json:"reqAt,omitempty"`

	// Seen: a near-cache watcher's first read of each version, or the
	// writer's return of each round's Invalidate: {version, unix ns}.
	Seen [][2]int64 `json:"seen,omitempty"`
	// Dropped: when a watcher's near cache dropped the key on a message
	// (unix ns).
	Dropped []int64 `json:"dropped,omitempty"`
	// Probes: a watcher's receipt of each bare PUBLISH of the probe
	// (pubProbe): {probe number, unix ns}.
	Probes [][2]int64 `json:"probes,omitempty"`

	PG    *PGReport            `json:"pg,omitempty"`    // pgstampede, pgmix
	Fill  *Fill                `json:"fill,omitempty"`  // stampede, pgstampede with Timeline
	Wakes *WakeCounts          `json:"wakes,omitempty"` // cycle, warm: a Job.Wakes run
	Trace []systems.TraceEvent `json:"trace,omitempty"` // pgmix with Trace
}

// WakeCounts is who woke a worker's goroutines during a Job.Wakes run (see
// wakes): Ops operations, ByRuntime wake-ups by the runtime (a reply, a
// timer), HandOffs by another goroutine of the process, the run's own
// (starting its goroutines, waiting for them) taken out.
type WakeCounts struct {
	Ops       int64 `json:"ops"`
	ByRuntime int64 `json:"byRuntime"`
	HandOffs  int64 `json:"handOffs"`
}

// PGReport is what a worker on the real database measured beyond Report.
type PGReport struct {
	// The loader's counts: queries sent to the server, queries that
	// returned, calls that found no free pool connection before their
	// context ended, queries that failed or hit the deadline.
	Sent, OK, PoolFails, QueryErrs int64
	// Outcome of each request, in the order of ReqAt (pgmix) or of Lat
	// (pgstampede): one of the out* constants.
	Out []uint8 `json:"out,omitempty"`
	// LatAll is every request's latency (ns), in the order of Out.
	LatAll []int64 `json:"latAll,omitempty"`
	// Age is, for each request that succeeded (pgmix), how long before it
	// returned the query that produced its value had returned (ns).
	Age []int64 `json:"age,omitempty"`
	// Spans are the queries the loader sent (pgmix).
	Spans []pgdb.Span `json:"spans,omitempty"`
	// MaxLag is how late (ns) the open-loop generator sent its latest
	// request: a loaded machine can starve it.
	MaxLag int64 `json:"maxLag,omitempty"`
}

// Request outcomes on the real database.
const (
	outOK      uint8 = iota
	outPool          // no pool connection before the deadline (pool exhaustion)
	outQuery         // the query hit the deadline or failed
	outTimeout       // the deadline ended while waiting for another caller's load
	outOther
)

// worker is a prepared job: Run measures, Close tears down.
type worker interface {
	Run(ctx context.Context) Report
	Close()
}

// profile starts a CPU profile of job j when ProfileEnv names a directory,
// and returns what stops it.
func profile(j Job) (stop func()) {
	dir := os.Getenv(ProfileEnv)
	if dir == "" {
		return func() {}
	}
	f, err := os.CreateTemp(dir, strings.NewReplacer(" ", "-", "/", "-").Replace(j.Kind+"-"+j.System)+"-*.cpu")
	if err != nil {
		return func() {}
	}
	if pprof.StartCPUProfile(f) != nil {
		f.Close()
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// ChildMain runs jobs one after another until stdin ends. For each, it reads
// the Job from stdin, prepares it, prints READY, waits for GO, runs it and
// prints RESULT <json>; then it waits for NEXT (the coordinator sends it once
// every worker of the run has reported), closes the job's system and prints
// IDLE, ready for the next job. It returns the exit code. With
// CGBENCH_CPUPROFILE set to a directory, each job's CPU profile is written
// there (see profile).
func ChildMain() int {
	in := bufio.NewReader(os.Stdin)
	var pools pgdb.Pools
	defer pools.Close()
	ctx := context.Background()
	for {
		line, err := in.ReadString('\n')
		if err == io.EOF && line == "" {
			return 0 // the coordinator is done with this worker
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "cgbench child: read job:", err)
			return 2
		}
		var j Job
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			fmt.Fprintln(os.Stderr, "cgbench child: decode job:", err)
			return 2
		}
		var db *pgdb.Loader
		if j.DSN != "" {
			if db, err = pools.Loader(ctx, j.DSN, j.Pool); err != nil {
				fmt.Fprintln(os.Stderr, "cgbench child: prepare:", err)
				return 1
			}
		}
		before := runtime.NumGoroutine() // the pools' own are running by now
		stop := profile(j)
		code, next := runJob(ctx, in, j, db)
		stop()
		if !next || !settled(before) {
			return code
		}
		fmt.Println("IDLE")
	}
}

// runJob runs one job on db (the real database's loader, for the jobs that
// query it) and closes its system. next reports whether the coordinator
// asked for another job.
func runJob(ctx context.Context, in *bufio.Reader, j Job, db *pgdb.Loader) (code int, next bool) {
	w, err := prepare(ctx, j, db)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgbench child: prepare:", err)
		return 1, false
	}
	defer w.Close()
	fmt.Println("READY")
	if line, err := in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "GO" {
		fmt.Fprintln(os.Stderr, "cgbench child: no GO:", line, err)
		return 2, false
	}
	r := w.Run(ctx)
	b, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgbench child: encode:", err)
		return 1, false
	}
	os.Stdout.Write(append(append([]byte("RESULT "), b...), '\n'))
	// Close only once every worker has reported: a worker that finished
	// first and tore its system down at once would take the CPU from the
	// workers still measuring.
	line, err := in.ReadString('\n')
	return 0, err == nil && strings.TrimSpace(line) == "NEXT"
}

// settled reports whether the goroutines are back to n within a moment of
// a system's Close (a closed connection's reader may take that long), after
// a collection, so that the next job starts on a heap of live data only.
func settled(n int) bool {
	runtime.GC()
	for range 200 {
		if runtime.NumGoroutine() <= n {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintf(os.Stderr, "cgbench child: %d goroutines left after Close, %d before the job: exiting instead of running another\n",
		runtime.NumGoroutine(), n)
	return false
}

// child is one running worker process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr *capBuf
	pools  map[string]bool // the database pools it keeps open (see poolOf)
}

// capBuf keeps the first 8 KiB written to it (a worker's stderr).
type capBuf struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (c *capBuf) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := 8<<10 - c.b.Len(); room > 0 {
		c.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capBuf) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.TrimSpace(c.b.String())
}

// startChild starts a worker process on job j.
func startChild(j Job) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	// A race-detector build sleeps a second before exiting while other
	// goroutines run (GORACE atexit_sleep_ms, default 1000), which would
	// outlast exitGrace: a worker has nothing left to race with then.
	cmd.Env = append(os.Environ(), ChildEnv+"=1", "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	// A worker dies with the coordinator.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c := &child{cmd: cmd, stderr: &capBuf{}}
	cmd.Stderr = c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.stdout = bufio.NewReaderSize(out, 1<<16)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := c.send(j); err != nil {
		c.kill()
		return nil, err
	}
	return c, nil
}

// send gives the worker its next job.
func (c *child) send(j Job) error {
	b, err := json.Marshal(j)
	if err != nil {
		return err
	}
	if p := poolOf(j); p != "" {
		if c.pools == nil {
			c.pools = map[string]bool{}
		}
		c.pools[p] = true
	}
	_, err = c.stdin.Write(append(b, '\n'))
	return err
}

// poolOf names the database pool job j uses, which its worker then keeps
// open ("" for none).
func poolOf(j Job) string {
	if j.DSN == "" {
		return ""
	}
	return fmt.Sprintf("%s %d", j.DSN, j.Pool)
}

// expect reads stdout lines until one starts with prefix and returns the rest.
func (c *child) expect(prefix string) (string, error) {
	for {
		line, err := c.stdout.ReadString('\n')
		if s, ok := strings.CutPrefix(line, prefix); ok && err == nil {
			return strings.TrimSpace(s), nil
		}
		if err != nil {
			werr := c.cmd.Wait()
			return "", fmt.Errorf("worker exited before %s (%v, %v): %s", strings.TrimSpace(prefix), err, werr, c.stderr.String())
		}
	}
}

func (c *child) kill() {
	if c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
	}
	_ = c.cmd.Wait()
}

// Hooks run in the coordinator around the measured part of a run.
type Hooks struct {
	BeforeGo func() // after every worker is READY, just before GO
	AfterRun func() // after every worker reported
}

// spares keeps worker processes between runs, idle, and gives each run's
// jobs to them before it starts new ones (see ChildMain). A service's
// processes are up long before a burst of its requests; a fresh process
// spends the first tens of milliseconds of a run faulting in its heap and
// growing its stacks (about 120 ms of CPU across a stampede's 8 processes at
// GO on the EPYC host), and its database pools would be fresh as well. The
// zero spares is ready to use; close ends its workers.
type spares struct {
	mu   sync.Mutex // guards idle
	idle []*child
}

// start gives job j to an idle worker — preferably one that keeps the
// job's database pool open, or none when the job needs none — or to a new
// process.
func (s *spares) start(j Job) (*child, error) {
	s.mu.Lock()
	want, best := poolOf(j), -1
	for i, c := range s.idle {
		if best < 0 || (want != "" && c.pools[want]) || (want == "" && len(c.pools) == 0) {
			best = i
		}
	}
	var c *child
	if best >= 0 {
		c = s.idle[best]
		s.idle = slices.Delete(s.idle, best, best+1)
	}
	s.mu.Unlock()
	if c != nil {
		if err := c.send(j); err == nil {
			return c, nil
		}
		c.kill()
	}
	return startChild(j)
}

// close ends the idle workers: each closes its pools and exits; one that
// has not within exitGrace is killed.
func (s *spares) close() {
	s.mu.Lock()
	idle := s.idle
	s.idle = nil
	s.mu.Unlock()
	for _, c := range idle {
		c.stdin.Close()
	}
	deadline := time.Now().Add(exitGrace)
	for _, c := range idle {
		exited := make(chan struct{})
		go func() {
			_ = c.cmd.Wait()
			close(exited)
		}()
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-exited:
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-exited
		}
		t.Stop()
	}
}

// run gives one job to each worker process, releases them together once all
// are ready (the barrier), and returns their reports in job order. The
// workers then close their systems and go back to s.
func (s *spares) run(ctx context.Context, jobs []Job, h Hooks) ([]Report, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	children := make([]*child, 0, len(jobs))
	defer func() { // those not back in s
		for _, c := range children {
			c.kill()
		}
	}()
	for _, j := range jobs {
		c, err := s.start(j)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
	}
	// A run that outlives ctx is stopped: its workers are killed, which
	// ends the reads below.
	all := slices.Clone(children)
	stop := context.AfterFunc(ctx, func() {
		for _, c := range all {
			_ = c.cmd.Process.Kill()
		}
	})
	defer stop()
	for _, c := range children {
		if _, err := c.expect("READY"); err != nil {
			return nil, err
		}
	}
	if h.BeforeGo != nil {
		h.BeforeGo()
	}
	for _, c := range children {
		if _, err := io.WriteString(c.stdin, "GO\n"); err != nil {
			return nil, err
		}
	}
	reports := make([]Report, len(children))
	errs := make([]error, len(children))
	var wg sync.WaitGroup
	for i, c := range children {
		wg.Go(func() {
			s, err := c.expect("RESULT ")
			if err == nil {
				err = json.Unmarshal([]byte(s), &reports[i])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if h.AfterRun != nil {
		h.AfterRun()
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if !stop() {
		return nil, ctx.Err()
	}
	// Every report is in: the workers close their systems and come back
	// idle. One still closing after exitGrace is killed: waiting for it
	// would measure nothing. One that exits instead (its system left
	// goroutines behind) is not reused.
	for _, c := range children {
		_, _ = io.WriteString(c.stdin, "NEXT\n")
	}
	idle := make([]chan bool, len(children))
	for i, c := range children {
		idle[i] = make(chan bool, 1)
		go func() {
			_, err := c.expect("IDLE")
			idle[i] <- err == nil
		}()
	}
	// Every child is waited for here, by its expect (which reaps a worker
	// that exits): none is left to the deferred kill.
	deadline := time.Now().Add(idleGrace)
	var back []*child
	var werr error
	for i, c := range children {
		t := time.NewTimer(time.Until(deadline))
		select {
		case ok := <-idle[i]:
			if ok {
				back = append(back, c)
			} else if st := c.cmd.ProcessState; werr == nil && st != nil && !st.Success() {
				werr = fmt.Errorf("worker: %v: %s", st, c.stderr.String())
			}
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-idle[i]
		}
		t.Stop()
	}
	children = nil
	s.mu.Lock()
	s.idle = append(s.idle, back...)
	s.mu.Unlock()
	if werr != nil {
		return nil, werr
	}
	return reports, nil
}

// idleGrace is how long a worker may take to close its system after its
// report and come back idle: a run's database queries whose deadline passed
// leave their connections closing for a while (pgx cancels each on the
// server). A worker killed instead costs the next run a new process.
const idleGrace = 5 * time.Second

// exitGrace is how long an idle worker may take to close its database pools
// and exit.
const exitGrace = time.Second
