package ginmw_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/locks"
)

// A lock lost while the handler ran — its key deleted, so the renewal finds
// another owner — and a handler that stops without answering (its write was
// refused, or it saw its context end) must not leave the request answered
// 200: Lock answers 409 lock lost.
func TestLockLostWithoutAnswerIsNot200(t *testing.T) {
	l, rdb, _ := newLocker(t)
	entered := make(chan struct{})
	r := newEngine()
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.Lease(150*time.Millisecond))), func(c *gin.Context) {
		close(entered)
		<-c.Request.Context().Done() // the write it was about to make would be refused: it gives up
	})
	done := make(chan int, 1)
	go func() { done <- serve(r, http.MethodPut, "/repos/15").Code }()
	within(t, 10*time.Second, entered, "the handler")
	if err := rdb.Del(context.Background(), "cg:lock:{repos:15}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != http.StatusConflict {
			t.Fatalf("status %d after the lock was lost mid-handler, want 409", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("request never finished")
	}
}

// statusErr is an application error that knows its HTTP status.
type statusErr struct{ code int }

func (e statusErr) Error() string   { return fmt.Sprintf("app error %d", e.code) }
func (e statusErr) HTTPStatus() int { return e.code }

// Abort maps every error of the library — and errors that carry their own
// answer — to one documented status, JSON body and Retry-After.
func TestAbortMapsErrors(t *testing.T) {
	redisDown := errors.New("dial tcp: connection refused")
	busyRedlock := &locks.RedlockError{Op: "lock", Name: "repos:1", Nodes: 3, Quorum: 2, Refused: []string{"a", "b"}}
	cases := []struct {
		name  string
		err   error
		code  int
		msg   string
		retry string
	}{
		{"own answer", &ginmw.Error{Status: http.StatusTeapot, Kind: errors.New("ginmw: short and stout")}, http.StatusTeapot, "short and stout", ""},
		{"wrapped own answer", fmt.Errorf("saving: %w", &ginmw.Error{Status: 422, Kind: errors.New("bad settings")}), 422, "bad settings", ""},
		{"HTTPError", fmt.Errorf("x: %w", statusErr{402}), 402, "app error 402", ""},
		{"busy Client", &locks.NotObtainedError{Name: "repos:1", RetryAfter: 2500 * time.Millisecond}, http.StatusConflict, "resource locked", "3"},
		{"busy Redlock", busyRedlock, http.StatusConflict, "resource locked", "1"},
		{"stale write", fmt.Errorf("gormplugin: stale write: %w", locks.ErrNotHeld), http.StatusConflict, "lock lost", "1"},
		{"lost scope", locks.ErrLost, http.StatusConflict, "lock lost", "1"},
		{"lost lock (context cause)", locks.ErrLost, http.StatusConflict, "lock lost", "1"},
		{"lock service down", &locks.NotObtainedError{Name: "repos:1", Err: redisDown}, http.StatusServiceUnavailable, "service unavailable", "1"},
		{"cache down (FailClosed)", errors.Join(cacheguard.ErrUnavailable, redisDown), http.StatusServiceUnavailable, "service unavailable", "1"},
		{"wait budget", fmt.Errorf("%w: %q", cacheguard.ErrWaitTimeout, "repos:1"), http.StatusServiceUnavailable, "cached response unavailable", "1"},
		{"remote load", fmt.Errorf("%w: db down", cacheguard.ErrRemoteLoad), http.StatusServiceUnavailable, "cached response unavailable", "1"},
		// Another process's answer was not to be cached: this request has
		// none, and nothing failed; a retry gets its own.
		{"uncached elsewhere", fmt.Errorf("%w: %q, in another process: sets a cookie", cacheguard.ErrUncached, "repos:1"), http.StatusServiceUnavailable, "cached response unavailable", "1"},
		{"not found", fmt.Errorf("repo 7: %w", cacheguard.ErrNotFound), http.StatusNotFound, "no such resource", ""},
		{"closed guard", cacheguard.ErrClosed, http.StatusServiceUnavailable, "service unavailable", "1"},
		{"deadline", context.DeadlineExceeded, http.StatusServiceUnavailable, "request timed out", "1"},
		{"anything else", errors.New("pq: relation does not exist"), http.StatusInternalServerError, "internal error", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var recorded []error
			r := newEngine()
			recordErrors(r, &recorded)
			r.GET("/x", func(c *gin.Context) { ginmw.Abort(c, tc.err) })
			w := serve(r, http.MethodGet, "/x")
			if w.Code != tc.code || w.Header().Get("Retry-After") != tc.retry {
				t.Fatalf("status %d Retry-After %q, want %d %q", w.Code, w.Header().Get("Retry-After"), tc.code, tc.retry)
			}
			b := decodeError(t, w)
			if b.Error != tc.msg {
				t.Fatalf("body %+v, want error %q", b, tc.msg)
			}
			if tc.retry != "" && fmt.Sprint(b.RetryAfter) != tc.retry {
				t.Fatalf("retry_after %d, want %s", b.RetryAfter, tc.retry)
			}
			if len(recorded) != 1 || !errors.Is(recorded[0], tc.err) {
				t.Fatalf("recorded %v", recorded)
			}
			var own *ginmw.Error
			if e := ginmw.ErrorFor(tc.err); e.Status != tc.code || !errors.Is(e, tc.err) && !errors.As(tc.err, &own) {
				t.Fatalf("ErrorFor = %+v", e)
			}
		})
	}
}

// A client that went away gets nothing written: 499 in the log.
func TestAbortClientGone(t *testing.T) {
	status := make(chan int, 1)
	entered := make(chan struct{})
	r := newEngine()
	r.Use(func(c *gin.Context) { c.Next(); status <- c.Writer.Status() })
	r.GET("/x", func(c *gin.Context) {
		close(entered)
		<-c.Request.Context().Done()
		ginmw.Abort(c, c.Request.Context().Err())
	})
	cancel, errc := startRequest(t, r, http.MethodGet, "/x")
	within(t, 10*time.Second, entered, "the handler")
	cancel()
	<-errc
	if got := <-status; got != ginmw.StatusClientClosedRequest {
		t.Fatalf("status %d, want 499", got)
	}
}
