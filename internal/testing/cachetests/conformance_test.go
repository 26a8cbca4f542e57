package cachetests

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestConformance runs the suite found in $CACHE_TESTS through ginmw.Cache.
// CACHE_TESTS_ID runs one test (the suite prints its exchange).
// CACHE_TESTS_MAX_REQUIRED fails the test past that many required failures.
func TestConformance(t *testing.T) {
	suite := os.Getenv("CACHE_TESTS")
	if suite == "" {
		t.Skip("CACHE_TESTS is not set: the path of a checkout of github.com/http-tests/cache-tests with npm dependencies installed")
	}
	suite, err := filepath.Abs(suite)
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}

	origin := startOrigin(t, node, suite)
	s := redistest.Start(t)
	g := cacheguard.New(s.Client())
	t.Cleanup(func() { g.Close() })
	proxy := httputil.NewSingleHostReverseProxy(origin)
	proxy.ErrorLog = log.New(io.Discard, "", 0) // some tests close the origin's connection on purpose
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Any("/*path", ginmw.Cache(g, time.Minute), func(c *gin.Context) { proxy.ServeHTTP(c.Writer, c.Request) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Close()
		<-served
	})

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cli := exec.CommandContext(ctx, node, "--no-warnings", "test-engine/cli.mjs")
	cli.Dir = suite
	id := os.Getenv("CACHE_TESTS_ID")
	cli.Env = append(os.Environ(), "npm_config_base=http://"+ln.Addr().String(), "npm_config_id="+id, "npm_package_config_id="+id)
	var out, stderr bytes.Buffer
	cli.Stdout, cli.Stderr = &out, &stderr
	if err := cli.Run(); err != nil {
		t.Fatalf("suite client: %v\n%s\n%s", err, stderr.Bytes(), out.Bytes())
	}
	if id != "" {
		t.Logf("%s", out.Bytes())
		return
	}
	resultsFile := filepath.Join(t.TempDir(), "results.json")
	if f := os.Getenv("CACHE_TESTS_OUT"); f != "" {
		resultsFile = f
	}
	if err := os.WriteFile(resultsFile, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	here, err := filepath.Abs("count.mjs")
	if err != nil {
		t.Fatal(err)
	}
	counted, err := exec.CommandContext(ctx, node, here, suite, resultsFile).Output()
	if err != nil {
		t.Fatalf("counting: %v", err)
	}
	var sum struct {
		Counts map[string]int
		Fyi    map[string]int
		Failed []struct{ ID, Name, Detail string }
	}
	if err := json.Unmarshal(counted, &sum); err != nil {
		t.Fatalf("counting: %v: %s", err, counted)
	}
	for _, f := range sum.Failed {
		t.Logf("FAIL %s: %s — %s", f.ID, f.Name, f.Detail)
	}
	t.Logf("results, each test on its own: %v", sum.Counts)
	t.Logf("results as cache-tests.fyi shows them (dependencies honoured): %v", sum.Fyi)
	t.Logf("required failures: %d", len(sum.Failed))
	if m := os.Getenv("CACHE_TESTS_MAX_REQUIRED"); m != "" {
		if n, err := strconv.Atoi(m); err == nil && len(sum.Failed) > n {
			t.Errorf("%d required failures, more than CACHE_TESTS_MAX_REQUIRED=%d", len(sum.Failed), n)
		}
	}
}

// startOrigin starts the suite's origin server on a free port and waits
// until it answers.
func startOrigin(t *testing.T, node, suite string) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(node, "test-engine/server/server.mjs")
	cmd.Dir = suite
	cmd.Env = append(os.Environ(), "npm_config_protocol=http", "npm_config_port="+strconv.Itoa(port),
		"npm_config_pidfile="+filepath.Join(t.TempDir(), "origin.pid"))
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // it may have exited
		<-exited
	})
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-exited:
			t.Fatalf("origin server exited: %v\n%s", waitErr, log.Bytes())
		default:
		}
		if c, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
			c.Close()
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("origin server did not listen on %s: %s", u.Host, log.Bytes())
		}
		time.Sleep(50 * time.Millisecond) // polling a child process's port: no event to wait on
	}
}
