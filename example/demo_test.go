package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// runMainEnv makes the test binary run main instead of the tests, so a test
// can start the program as a process of its own (signals, exit codes).
const runMainEnv = "CACHEGUARD_EXAMPLE_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		return
	}
	gin.SetMode(gin.ReleaseMode)
	goleak.VerifyTestMain(m, redistest.LeakOptions()...)
}

// testDemo is the demonstration as the tests run it: the default sizes, with
// a smaller burst in -short mode.
func testDemo() demoConfig {
	cfg := defaultDemo()
	if testing.Short() {
		cfg.Requests = 300
	}
	return cfg
}

// checkReport asserts the demonstration's invariants.
func checkReport(t *testing.T, cfg demoConfig, rep *report) {
	t.Helper()
	if rep.Guarded.Loads != 1 {
		t.Errorf("guarded burst: %d database loads, want 1", rep.Guarded.Loads)
	}
	if rep.Guarded.Failed != 0 || rep.Naive.Failed != 0 {
		t.Errorf("failed reads: %d guarded, %d unguarded, want none", rep.Guarded.Failed, rep.Naive.Failed)
	}
	if rep.Naive.Loads < 1 {
		t.Errorf("unguarded burst: %d database loads, want at least 1", rep.Naive.Loads)
	}
	e := rep.Edits
	if e.Lost != 0 {
		t.Errorf("%d lost updates, want 0", e.Lost)
	}
	if e.Applied+e.Conflicts != cfg.Edits || e.Other != 0 {
		t.Errorf("edits: %d applied + %d answered 409 + %d other, want %d applied or 409", e.Applied, e.Conflicts, e.Other, cfg.Edits)
	}
	if e.Applied < 1 {
		t.Error("no edit was applied")
	}
	if e.MaxConcurrent != 1 {
		t.Errorf("at most %d edits inside the critical section at once, want 1", e.MaxConcurrent)
	}
	for _, p := range e.Problems {
		t.Error(p)
	}
	if rep.Reads.Fresh != rep.Reads.Instances || !rep.Reads.ListFresh {
		t.Errorf("after the edits %d of %d instances served version %d (list fresh: %v)",
			rep.Reads.Fresh, rep.Reads.Instances, e.FinalVersion, rep.Reads.ListFresh)
	}
	if err := rep.ok(); err != nil {
		t.Errorf("report.ok: %v", err)
	}
}

func TestDemoEmbedded(t *testing.T) {
	e, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cfg := testDemo()
	var out bytes.Buffer
	rep, err := runDemo(context.Background(), cfg, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: e.Addr()}) }, &out)
	if err != nil {
		t.Fatalf("runDemo: %v\n%s", err, out.String())
	}
	checkReport(t, cfg, rep)
	printReport(&out, cfg, rep)
	t.Logf("\n%s", out.String())
}

func TestDemoRealRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := testDemo()
	var out bytes.Buffer
	rep, err := runDemo(context.Background(), cfg, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr()}) }, &out)
	if err != nil {
		t.Fatalf("runDemo: %v\n%s", err, out.String())
	}
	checkReport(t, cfg, rep)
	printReport(&out, cfg, rep)
	t.Logf("\n%s", out.String())
	// The run removed its keys from the shared server.
	if n, err := srv.Client().DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Errorf("after the demo the server holds %d keys (err %v), want 0", n, err)
	}
}

// TestRunDemo runs the whole program in-process: flags, the embedded
// server, the demonstration and its table.
func TestRunDemo(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-requests", "50", "-edits", "5", "-instances", "3"}, noEnv, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr.String(), stdout.String())
	}
	for _, want := range []string{"embedded (miniredis)", "database loads", "p99 latency", "conflicts answered 409", "lost updates               0"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

func noEnv(string) string { return "" }

func TestRunBadUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-nope"},
		{"-instances", "x"},
		{"-instances", "0"},
		{"-requests", "-1"},
		{"-edits", "100000"},
		{"-edit-wait", "-1s"},
		{"-listen", "nope"},
		{"-redis", "localhost"},
		{"-redis", "redis://:x@[::1"},
		{"dance"},
		{"serve", "extra"},
		{"serve", "-control", "no-fencing"},
		{"serve", "-hooks", "-control", "nope"},
		{"serve", "-lease", "0"},
		{"serve", "-cache-ttl", "0"},
		{"serve", "-db", "mysql://x"},
		{"serve", "-cluster"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, noEnv, &stdout, &stderr)
		if code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
		if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "example: ") {
			t.Errorf("%q: stderr %q, want one line starting with \"example: \"", args, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: wrote %q to stdout", args, stdout.String())
		}
	}
}

func TestRunHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, noEnv, &stdout, &stderr); code != 0 {
		t.Fatalf("-h: exit %d", code)
	}
	if !strings.Contains(stdout.String(), "usage: go run ./example") || !strings.Contains(stdout.String(), "-redis addr") {
		t.Errorf("-h printed %q", stdout.String())
	}
}

func TestRunUnreachableRedis(t *testing.T) {
	for name, c := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"flag":      {args: []string{"-redis", "127.0.0.1:1"}},
		"url flag":  {args: []string{"-redis", "redis://:secret@127.0.0.1:1/0"}},
		"REDIS_URL": {env: map[string]string{"REDIS_URL": "redis://127.0.0.1:1"}},
		"serve":     {args: []string{"serve", "-redis", "127.0.0.1:1"}},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			start := time.Now()
			code := run(context.Background(), c.args, func(k string) string { return c.env[k] }, &stdout, &stderr)
			if code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			msg := stderr.String()
			if lines := strings.Split(strings.TrimSpace(msg), "\n"); len(lines) != 1 || !strings.Contains(msg, "cannot reach Redis at 127.0.0.1:1") {
				t.Errorf("stderr %q, want one line naming the address", msg)
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("stderr shows the password: %q", msg)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("took %v to give up", d)
			}
		})
	}
}

// TestServe runs serve mode in-process and follows its curl lines.
func TestServe(t *testing.T) {
	out := newWatch(regexp.MustCompile(`serving on (http://\S+)`))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var stderr bytes.Buffer
	go func() { done <- run(ctx, []string{"serve"}, noEnv, out, &stderr) }()
	var base string
	select {
	case base = <-out.match:
	case code := <-done:
		t.Fatalf("serve exited %d: %s", code, stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatal("serve printed no address")
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	do := func(method, path, body string) (int, http.Header, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	repo := func(b []byte) Repo {
		t.Helper()
		var r Repo
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return r
	}
	for i, want := range []string{"MISS", "HIT"} {
		code, h, b := do("GET", "/repos/1", "")
		if code != 200 || h.Get("X-Cache") != want || repo(b).Name != "acme/api" {
			t.Errorf("GET /repos/1 #%d: %d X-Cache %q %s, want 200 %s acme/api", i+1, code, h.Get("X-Cache"), b, want)
		}
		code, h, _ = do("GET", "/repos", "")
		if code != 200 || h.Get("X-Cache") != want {
			t.Errorf("GET /repos #%d: %d X-Cache %q, want 200 %s", i+1, code, h.Get("X-Cache"), want)
		}
	}
	code, _, b := do("PUT", "/repos/1/settings", `{"edit":"e1","default_branch":"trunk"}`)
	if r := repo(b); code != 200 || r.Version != 1 || r.Fence == 0 || r.Settings.DefaultBranch != "trunk" {
		t.Errorf("PUT: %d %s, want 200, version 1, a fence, branch trunk", code, b)
	}
	code, _, b = do("PATCH", "/repos/1/settings", `{"edit":"e1b","visibility":"public"}`)
	if r := repo(b); code != 200 || r.Version != 2 || r.Settings.Visibility != "public" || len(r.Settings.Edits) != 2 {
		t.Errorf("PATCH settings (First and Save): %d %s, want 200, version 2, visibility public, two edits", code, b)
	}
	code, _, b = do("PATCH", "/repos/2", `{"edit":"r1","name":"acme/web2"}`)
	if r := repo(b); code != 200 || r.Version != 1 || r.Fence == 0 || r.Name != "acme/web2" {
		t.Errorf("PATCH: %d %s, want 200, version 1, a fence, the new name", code, b)
	}
	if code, _, b := do("PATCH", "/repos/2", `{"edit":"r2"}`); code != 400 {
		t.Errorf("PATCH without a name: %d %s, want 400", code, b)
	}
	if code, h, b := do("GET", "/repos/1", ""); code != 200 || h.Get("X-Cache") != "MISS" || repo(b).Version != 2 {
		t.Errorf("GET /repos/1 after the edit: %d X-Cache %q %s, want the edit reloaded", code, h.Get("X-Cache"), b)
	}
	code, h, b := do("GET", "/repos", "")
	var list []Repo
	json.Unmarshal(b, &list) //nolint:errcheck // checked below
	if code != 200 || h.Get("X-Cache") != "MISS" || len(list) != 3 || list[0].Version != 2 {
		t.Errorf("GET /repos after the edit: %d X-Cache %q %s, want the list reloaded", code, h.Get("X-Cache"), b)
	}
	for path, want := range map[string]int{"/repos/99": 404, "/repos/x": 400, "/naive/repos/99": 404} {
		if code, _, b := do("GET", path, ""); code != want {
			t.Errorf("GET %s: %d %s, want %d", path, code, b, want)
		}
	}
	for body, want := range map[string]int{`{}`: 400, `{"edit":"e2","visibility":"secret"}`: 400, `nope`: 400} {
		if code, _, b := do("PUT", "/repos/1/settings", body); code != want {
			t.Errorf("PUT %s: %d %s, want %d", body, code, b, want)
		}
	}
	if code, _, b := do("PUT", "/repos/99/settings", `{"edit":"e3"}`); code != 404 {
		t.Errorf("PUT /repos/99/settings: %d %s, want 404", code, b)
	}
	if code, _, b := do("GET", "/stats", ""); code != 200 || !bytes.Contains(b, []byte(`"repo_queries"`)) {
		t.Errorf("GET /stats: %d %s", code, b)
	}
	if code, _, b := do("GET", "/metrics", ""); code != 200 || !bytes.Contains(b, []byte(`cacheguard_cache_events_total{event="load"} `)) ||
		!bytes.Contains(b, []byte("\ncacheguard_locks_held ")) {
		t.Errorf("GET /metrics: %d %s", code, b)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d after its context ended: %s", code, stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
	if !strings.Contains(out.String(), "curl -i "+base+"/repos/1") {
		t.Errorf("no curl lines in:\n%s", out.String())
	}
}

// TestProcess runs the program as a process of its own: serve stops on
// SIGTERM and SIGINT with exit 0; bad usage and an unreachable Redis exit 2
// and 1 with one line on stderr.
func TestProcess(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd := command(t, "serve")
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(stdout)
			var base string
			for base == "" && sc.Scan() {
				if m := regexp.MustCompile(`serving on (http://\S+)`).FindStringSubmatch(sc.Text()); m != nil {
					base = m[1]
				}
			}
			if base == "" {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatal("no address printed")
			}
			resp, err := http.Get(base + "/repos/1")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			http.DefaultClient.CloseIdleConnections()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, stdout) //nolint:errcheck // drained until the process exits
			if err := cmd.Wait(); err != nil {
				t.Errorf("after %v: %v", sig, err)
			}
		})
	}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-instances", "nope"}, 2, "invalid value"},
		{[]string{"-redis", "127.0.0.1:1"}, 1, "cannot reach Redis at 127.0.0.1:1"},
	} {
		cmd := command(t, c.args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		code := -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != c.code || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), c.msg) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and one line with %q", c.args, code, stderr.String(), c.code, c.msg)
		}
	}
}

// command returns the program as a process: this test binary running main.
func command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "REDIS_URL=")
	return cmd
}

// watch is an output buffer that reports the first submatch of a pattern.
type watch struct {
	mu    sync.Mutex // guards b and sent
	b     bytes.Buffer
	re    *regexp.Regexp
	sent  bool
	match chan string
}

func newWatch(re *regexp.Regexp) *watch { return &watch{re: re, match: make(chan string, 1)} }

func (w *watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if !w.sent {
		if m := w.re.FindSubmatch(w.b.Bytes()); m != nil {
			w.sent = true
			w.match <- string(m[1])
		}
	}
	return len(p), nil
}

func (w *watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
