package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// startHooked starts one instance with the test-only hooks on a real Redis,
// its hook lines going to out.
func startHooked(t *testing.T, h *hooks) string {
	t.Helper()
	srv := redistest.Start(t)
	dsn := filepath.Join(t.TempDir(), "repos.db")
	if err := createSchema(dsn); err != nil {
		t.Fatal(err)
	}
	cfg := serviceConfig{DB: dsn, Prefix: "hooks:", Pool: 4, EditWait: 5 * time.Second, Meter: &meter{}, Hooks: h}
	in, err := startInstance(cfg, srv.Client(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := in.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	return in.url
}

// TestHooksPauseAtEveryStep parks a request at each step, sees the line, and
// releases it (over HTTP for the first steps, by SIGCONT for the last).
func TestHooksPauseAtEveryStep(t *testing.T) {
	out := &lines{ch: make(chan string, 16)}
	h := newHooks(out, "")
	base := startHooked(t, h)
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	for i, step := range steps {
		method, path, body := "PUT", "/repos/1/settings", `{"edit":"h`+step+`"}`
		if step == stepCacheLoad {
			method, path, body = "GET", "/repos/2", ""
		}
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(headerPauseAt, step)
		req.Header.Set(headerHookTag, "t"+step)
		type answer struct {
			status int
			span   string
			err    error
		}
		done := make(chan answer, 1)
		go func() {
			resp, err := client.Do(req)
			if err != nil {
				done <- answer{err: err}
				return
			}
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained
			resp.Body.Close()
			done <- answer{status: resp.StatusCode, span: resp.Header.Get(headerEditSpan)}
		}()
		select {
		case l := <-out.ch:
			if want := "hook at " + step + " t" + step; l != want {
				t.Fatalf("line %q, want %q", l, want)
			}
		case a := <-done:
			t.Fatalf("%s: answered %d %v without pausing", step, a.status, a.err)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no hook line", step)
		}
		select {
		case a := <-done:
			t.Fatalf("%s: answered %d before its release", step, a.status)
		default:
		}
		if i%2 == 0 {
			resp, err := client.Post(base+"/_hooks/release?tag=t"+step, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), `"released":1`) {
				t.Errorf("%s: release answered %s", step, b)
			}
		} else if err := syscall.Kill(syscall.Getpid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		a := <-done
		if a.err != nil || a.status != http.StatusOK {
			t.Errorf("%s: %d %v, want 200", step, a.status, a.err)
		}
		if method == "PUT" && !regexp.MustCompile(`^\d+,\d+,0$`).MatchString(a.span) {
			t.Errorf("%s: %s %q", step, headerEditSpan, a.span)
		}
	}
}

// TestHooksInert: without -hooks the headers do nothing and no span is reported.
func TestHooksInert(t *testing.T) {
	base := startHooked(t, nil)
	req, _ := http.NewRequest("PUT", base+"/repos/1/settings", strings.NewReader(`{"edit":"x"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(headerPauseAt, stepAfterRead)
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(headerEditSpan) != "" {
		t.Errorf("%d, span %q: want 200 and no span", resp.StatusCode, resp.Header.Get(headerEditSpan))
	}
	for _, path := range []string{"/_hooks/release"} {
		resp, err := http.Post(base+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s: %d, want 404", path, resp.StatusCode)
		}
	}
	http.DefaultClient.CloseIdleConnections()
}

// lines hands each line written to it to ch.
type lines struct {
	ch  chan string
	buf string
}

func (l *lines) Write(p []byte) (int, error) {
	l.buf += string(p)
	for {
		i := strings.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		l.ch <- l.buf[:i]
		l.buf = l.buf[i+1:]
	}
}
