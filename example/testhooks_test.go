package main

import (
	"context"
	"fmt"
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
func startHooked(t *testing.T, h *testHooks) string {
	t.Helper()
	srv := redistest.Start(t)
	dsn := filepath.Join(t.TempDir(), "repos.db")
	if err := createSchema(dsn); err != nil {
		t.Fatal(err)
	}
	cfg := serviceConfig{DB: dsn, Prefix: "hooks:", Pool: 4, EditWait: 5 * time.Second, Meter: &meter{}, TestHooks: h}
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

// hookCase is a request the hooks' tests send: it asks to pause at step.
type hookCase struct{ method, path, body, step string }

// hookCases are a request per step and route that passes it: every edit
// route at each write step, both cached reads at cache-load.
func hookCases() []hookCase {
	var cs []hookCase
	for _, e := range []struct{ method, path, body string }{
		{"PUT", "/repos/1/settings", `{"edit":"h%d"}`},          // gormplugin.Transaction
		{"PATCH", "/repos/1/settings", `{"edit":"h%d"}`},        // First, then Save
		{"PATCH", "/repos/1", `{"edit":"h%d","name":"n%[1]d"}`}, // First, then Updates
	} {
		for _, step := range []string{stepAfterLock, stepAfterRead, stepBeforeUpdate, stepAfterUpdate} {
			cs = append(cs, hookCase{e.method, e.path, fmt.Sprintf(e.body, len(cs)), step})
		}
	}
	return append(cs,
		hookCase{"GET", "/repos/2", "", stepCacheLoad}, // cacheguard.Get's loader
		hookCase{"GET", "/repos", "", stepCacheLoad},   // ginmw.Cache's handler
	)
}

type hookAnswer struct {
	status int
	span   string
	err    error
}

// send sends c with its pause step and tag; the answer arrives on the channel.
func (c hookCase) send(client *http.Client, base, tag string) <-chan hookAnswer {
	req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(headerPauseAt, c.step)
	req.Header.Set(headerHookTag, tag)
	done := make(chan hookAnswer, 1)
	go func() {
		resp, err := client.Do(req)
		if err != nil {
			done <- hookAnswer{err: err}
			return
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // drained
		resp.Body.Close()
		done <- hookAnswer{status: resp.StatusCode, span: resp.Header.Get(headerEditSpan)}
	}()
	return done
}

var spanHeader = regexp.MustCompile(`^\d+,\d+,0$`)

// TestHooksPauseAtEveryStep parks a request at each step of each route that
// passes it, sees the line, and releases it (alternately over HTTP and by
// SIGCONT); every edit reports its span.
func TestHooksPauseAtEveryStep(t *testing.T) {
	out := &lines{ch: make(chan string, 16)}
	h := newTestHooks(out, "")
	base := startHooked(t, h)
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	for i, c := range hookCases() {
		name := c.method + " " + c.path + " at " + c.step
		tag := fmt.Sprintf("t%d", i)
		done := c.send(client, base, tag)
		select {
		case l := <-out.ch:
			if want := "hook at " + c.step + " " + tag; l != want {
				t.Fatalf("%s: line %q, want %q", name, l, want)
			}
		case a := <-done:
			t.Fatalf("%s: answered %d %v without pausing", name, a.status, a.err)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no hook line", name)
		}
		select {
		case a := <-done:
			t.Fatalf("%s: answered %d before its release", name, a.status)
		default:
		}
		if i%2 == 0 {
			resp, err := client.Post(base+"/_hooks/release?tag="+tag, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), `"released":1`) {
				t.Errorf("%s: release answered %s", name, b)
			}
		} else if err := syscall.Kill(syscall.Getpid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		a := <-done
		if a.err != nil || a.status != http.StatusOK {
			t.Errorf("%s: %d %v, want 200", name, a.status, a.err)
		}
		if edit := c.method != "GET"; edit != spanHeader.MatchString(a.span) {
			t.Errorf("%s: %s %q", name, headerEditSpan, a.span)
		}
	}
}

// TestHooksStepsOfOtherRequests: a request that asks for a step its route
// does not pass is answered without pausing (a read's query is not an
// edit's after-read, an edit's read is not a cache load).
func TestHooksStepsOfOtherRequests(t *testing.T) {
	out := &lines{ch: make(chan string, 16)}
	base := startHooked(t, newTestHooks(out, ""))
	client := &http.Client{Timeout: 20 * time.Second}
	defer client.CloseIdleConnections()
	for i, c := range []hookCase{
		{"GET", "/repos/3", "", stepAfterRead},
		{"GET", "/repos", "", stepAfterRead},
		{"GET", "/repos/3", "", stepBeforeUpdate},
		{"PUT", "/repos/3/settings", `{"edit":"o1"}`, stepCacheLoad},
		{"PATCH", "/repos/3", `{"edit":"o2","name":"x"}`, stepCacheLoad},
	} {
		a := <-c.send(client, base, fmt.Sprintf("o%d", i))
		if a.err != nil || a.status != http.StatusOK {
			t.Errorf("%s %s at %s: %d %v, want 200", c.method, c.path, c.step, a.status, a.err)
		}
		select {
		case l := <-out.ch:
			t.Errorf("%s %s at %s: %q", c.method, c.path, c.step, l)
		default:
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
