// Command cgbench runs cacheguard's side-by-side benchmarks against its peers
// and writes RESULTS.md with charts. `make bench` runs it; see benchmarks/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/cacheguard/cacheguard/benchmarks/internal/bench"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

func main() {
	if bench.IsChild() {
		os.Exit(bench.ChildMain())
	}
	os.Exit(run())
}

func run() int {
	var (
		quick = flag.Bool("quick", false, "tiny sizes and 2 repetitions: proves the harness works, measures nothing")
		long  = flag.Bool("long", false, "run the hot-key mixes (6c, and R2 on the real database) for 30 s per repetition")
		addr  = flag.String("redis", "", "use this redis server (host:port) instead of starting one")
		out   = flag.String("out", "", "directory for RESULTS.md and results/ (default: the benchmarks module, or out/quick with -quick)")
		reps  = flag.Int("reps", 0, "repetitions per system (default 5, 2 with -quick; the mixes 3, unless given)")
		only  = flag.String("only", "", "comma-separated scenarios to run: "+strings.Join(bench.Scenarios, ","))
		syss  = flag.String("systems", "", "comma-separated substrings: run only the systems whose name contains one")
		label = flag.String("command", "", "the command to record in RESULTS.md (default: this command line)")
		busy  = flag.Bool("busy", false, "keep one CPU busy beside the benchmark (a spinning thread), as a loaded machine would")
		trace = flag.String("trace", "", "write what cacheguard's workers did in each real-database mix run into this directory")
		expl  = flag.Bool("explain", false, "read the trace files given as arguments (see -trace) and say what their failed requests waited for")
		share = flag.Float64("pgshare", 0.2, "size the real database's table so that the mix's ideal (one query per key per TTL) asks this share of the host's CPUs (0: 500,000 rows, whatever the query costs)")
		loads = flag.Int("maxloads", 0, "give every cacheguard system MaxConcurrentLoads(n) in each process (0: none, the default)")
	)
	flag.Parse()
	if *share < 0 || *share > 1 {
		fmt.Fprintf(os.Stderr, "cgbench: -pgshare %g: want a share of the host's CPUs between 0 and 1 (0: the fixed table)\n", *share)
		return 2
	}
	if *loads > 0 { // the workers inherit it (see systems.MaxLoadsEnv)
		os.Setenv(systems.MaxLoadsEnv, strconv.Itoa(*loads))
	}
	if *expl {
		for _, p := range flag.Args() {
			if err := bench.Explain(os.Stdout, p); err != nil {
				fmt.Fprintln(os.Stderr, "cgbench:", err)
				return 1
			}
		}
		return 0
	}

	cfg := bench.Config{Quick: *quick, Long: *long, Reps: *reps, Redis: *addr, Log: os.Stderr, Only: map[string]bool{}, Trace: *trace, PGShare: *share}
	for s := range strings.SplitSeq(*only, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !contains(bench.Scenarios, s) {
			fmt.Fprintf(os.Stderr, "cgbench: unknown scenario %q (have %s)\n", s, strings.Join(bench.Scenarios, ", "))
			return 2
		}
		cfg.Only[s] = true
	}
	for s := range strings.SplitSeq(*syss, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Systems = append(cfg.Systems, s)
		}
	}
	mod := moduleDir()
	cfg.MicroDir = mod
	dir := *out
	if dir == "" {
		dir = mod
		if dir == "" {
			dir = "."
		}
		if *quick {
			dir = filepath.Join(dir, "out", "quick")
		}
	}
	command := *label
	if command == "" {
		command = strings.Join(append([]string{"cgbench"}, os.Args[1:]...), " ")
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	machine := bench.Describe()
	if *busy {
		machine.Busy = true
		done := spin()
		defer done()
	}
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgbench:", err)
	}
	if res == nil {
		return 1
	}
	if werr := write(res, machine, command, dir); werr != nil {
		fmt.Fprintln(os.Stderr, "cgbench:", werr)
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}

func write(res *bench.Results, m bench.Machine, command, dir string) error {
	rdir := filepath.Join(dir, "results")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return err
	}
	charts, err := res.Charts(rdir)
	if err != nil {
		return fmt.Errorf("charts: %w", err)
	}
	if res.Micro != "" {
		if err := os.WriteFile(filepath.Join(rdir, "micro.txt"), []byte(res.Micro+"\n"), 0o644); err != nil {
			return err
		}
	}
	p := filepath.Join(dir, "RESULTS.md")
	if err := os.WriteFile(p, []byte(res.Markdown(m, command, charts, dir)), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "cgbench: wrote", p)
	return nil
}

// moduleDir finds the benchmarks module above the working directory.
func moduleDir() string {
	d, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/cacheguard/cacheguard/benchmarks\n") {
			return d
		}
		if sub := filepath.Join(d, "benchmarks"); d != sub {
			if b, err := os.ReadFile(filepath.Join(sub, "go.mod")); err == nil &&
				strings.Contains(string(b), "module github.com/cacheguard/cacheguard/benchmarks\n") {
				return sub
			}
		}
		parent := filepath.Dir(d)
		if parent == d {
			return ""
		}
		d = parent
	}
}

// spin keeps one CPU busy on a locked OS thread until the returned func is
// called.
func spin() func() {
	var stop atomic.Bool
	stopped := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(stopped)
		for n := 0; !stop.Load(); n++ {
		}
	}()
	return func() {
		stop.Store(true)
		<-stopped
	}
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}
