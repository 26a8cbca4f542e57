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

	PG    *PGReport            `json:"pg,omitempty"`    // pgstampede, pgmix
	Fill  *Fill                `json:"fill,omitempty"`  // stampede, pgstampede with Timeline
	Trace []systems.TraceEvent `json:"trace,omitempty"` // pgmix with Trace
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

// ChildMain runs one job: it reads the Job from stdin, prepares it, prints
// READY, waits for GO on stdin, runs it and prints RESULT <json>. It returns
// the exit code.
func ChildMain() int {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgbench child: read job:", err)
		return 2
	}
	var j Job
	if err := json.Unmarshal([]byte(line), &j); err != nil {
		fmt.Fprintln(os.Stderr, "cgbench child: decode job:", err)
		return 2
	}
	ctx := context.Background()
	w, err := prepare(ctx, j)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgbench child: prepare:", err)
		return 1
	}
	defer w.Close()
	fmt.Println("READY")
	if line, err = in.ReadString('\n'); err != nil || strings.TrimSpace(line) != "GO" {
		fmt.Fprintln(os.Stderr, "cgbench child: no GO:", line, err)
		return 2
	}
	r := w.Run(ctx)
	b, err := json.Marshal(r)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgbench child: encode:", err)
		return 1
	}
	os.Stdout.Write(append(append([]byte("RESULT "), b...), '\n'))
	// Close only once every worker has reported (the coordinator then
	// closes stdin): a worker that finished first and tore its system down
	// at once (its pools' database backends exiting with it) would take
	// the CPU from the workers still measuring.
	_, _ = io.Copy(io.Discard, in)
	return 0
}

// child is one running worker process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	stderr *capBuf
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

func startChild(ctx context.Context, j Job) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self)
	cmd.Env = append(os.Environ(), ChildEnv+"=1")
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
	b, _ := json.Marshal(j)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		c.kill()
		return nil, err
	}
	return c, nil
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

// runWorkers starts one worker process per job, releases them together once
// all are ready (the barrier), and returns their reports in job order.
func runWorkers(ctx context.Context, jobs []Job, h Hooks) ([]Report, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	children := make([]*child, 0, len(jobs))
	defer func() {
		for _, c := range children {
			c.kill()
		}
	}()
	for _, j := range jobs {
		c, err := startChild(ctx, j)
		if err != nil {
			return nil, err
		}
		children = append(children, c)
	}
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
	// Every report is in: the workers close their systems and exit. One
	// still closing after exitGrace (a database pool waiting out the cancel
	// requests of queries whose deadline passed takes seconds) is killed:
	// waiting for it would measure nothing.
	exited := make([]chan error, len(children))
	for i, c := range children {
		c.stdin.Close()
		exited[i] = make(chan error, 1)
		go func() { exited[i] <- c.cmd.Wait() }()
	}
	grace := time.NewTimer(exitGrace)
	defer grace.Stop()
	var werr error
	for i, c := range children {
		select {
		case err := <-exited[i]:
			if err != nil && werr == nil {
				werr = fmt.Errorf("worker: %v: %s", err, c.stderr.String())
			}
			continue
		case <-grace.C:
		}
		for _, c := range children[i:] {
			_ = c.cmd.Process.Kill()
		}
		for _, ch := range exited[i:] {
			<-ch
		}
		break
	}
	children = nil
	if werr != nil {
		return nil, werr
	}
	return reports, nil
}

// exitGrace is how long a worker may take to exit after its report.
const exitGrace = 250 * time.Millisecond
