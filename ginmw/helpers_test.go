package ginmw_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// newLocker starts a redis-server of the test's own and a locks.Client on it.
func newLocker(t *testing.T, opts ...locks.Option) (*locks.Client, *redis.Client, *redistest.Server) {
	t.Helper()
	s := redistest.Start(t)
	rdb := s.Client()
	l := locks.New(rdb, opts...)
	t.Cleanup(func() { l.Close() })
	return l, rdb, s
}

// hold takes the lock name for the test, released at cleanup.
func hold(t *testing.T, l *locks.Client, name string) *locks.Lock {
	t.Helper()
	lk, err := l.TryLock(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lk.Unlock(context.Background()) })
	return lk
}

// newEngine returns a Gin engine whose recovery writes nothing to the test's output.
func newEngine() *gin.Engine {
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		c.AbortWithStatus(http.StatusInternalServerError)
	}))
	return r
}

func serve(h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// startRequest sends a request to h through a real server and connection, so
// that cancel makes the client go away as a disconnecting one does. done
// receives what the client's Do returned.
func startRequest(t *testing.T, h http.Handler, method, path string) (cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	return cancel, errc
}

// recordErrors makes r append the errors each request left in c.Errors to *errs.
func recordErrors(r *gin.Engine, errs *[]error) {
	r.Use(func(c *gin.Context) {
		c.Next()
		for _, e := range c.Errors {
			*errs = append(*errs, e.Err)
		}
	})
}

// wantCalls fails the test unless the handler ran n times.
func wantCalls(t *testing.T, calls *atomic.Int64, n int64) {
	t.Helper()
	if got := calls.Load(); got != n {
		t.Fatalf("handler ran %d times, want %d", got, n)
	}
}

// errorBody is the JSON body Lock answers a refused request with.
type errorBody struct {
	Error      string `json:"error"`
	Resource   string `json:"resource"`
	RetryAfter int    `json:"retry_after"`
}

func decodeError(t *testing.T, w *httptest.ResponseRecorder) errorBody {
	t.Helper()
	var b errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
		t.Fatalf("body %q is not JSON: %v", w.Body.String(), err)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	return b
}

// lockExists reports whether the lock key of name exists (default prefix).
func lockExists(t *testing.T, rdb *redis.Client, name string) bool {
	t.Helper()
	n, err := rdb.Exists(context.Background(), "cg:lock:{"+name+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// within waits for ch or fails the test after d.
func within(t *testing.T, d time.Duration, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}

// eventually waits for an observable event, bounded by d.
var eventually = redistest.Eventually

// watchWaiting returns a channel closed once the Guard on rdb waits for
// another process's fill (redistest.FillWaiting).
var watchWaiting = redistest.FillWaiting
