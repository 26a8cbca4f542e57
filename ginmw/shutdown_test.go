package ginmw_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// shutdownApp is one process of a service: a lock client, a Guard, and an
// engine with a locked PUT and a cached GET whose handlers wait for release.
type shutdownApp struct {
	l       *locks.Client
	g       *cacheguard.Guard
	r       *gin.Engine
	entered chan string // the method of each handler that started
	release chan struct{}
}

func newShutdownApp(t *testing.T, s *redistest.Server) *shutdownApp {
	a := &shutdownApp{entered: make(chan string, 4), release: make(chan struct{})}
	a.l = locks.New(s.Client())
	a.g = cacheguard.New(s.Client())
	t.Cleanup(func() { a.g.Close(); a.l.Close() })
	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))
	wait := func(c *gin.Context) error {
		a.entered <- c.Request.Method
		select {
		case <-a.release:
			return nil
		case <-c.Request.Context().Done():
			return context.Cause(c.Request.Context())
		}
	}
	a.r = newEngine()
	a.r.PUT("/repos/:id", ginmw.Lock(a.l, repo), ginmw.InvalidateAfter(a.g, repo), func(c *gin.Context) {
		if err := wait(c); err != nil {
			ginmw.Abort(c, err)
			return
		}
		c.String(http.StatusOK, "saved")
	})
	a.r.GET("/repos/:id", ginmw.Cache(a.g, time.Minute, ginmw.CacheKey(repo)), func(c *gin.Context) {
		if err := wait(c); err != nil {
			ginmw.Abort(c, err)
			return
		}
		c.String(http.StatusOK, "repo")
	})
	return a
}

// serveApp serves a's engine on a real listener; shutdown and close are the
// server's.
func serveApp(t *testing.T, a *shutdownApp) (srv *http.Server, url string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv = &http.Server{Handler: a.r}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return srv, "http://" + ln.Addr().String()
}

type answer struct {
	code int
	body string
	err  error
}

func send(client *http.Client, method, url string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(method, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- answer{code: resp.StatusCode, body: string(b)}
	}()
	return out
}

// The recommended order for a graceful stop — http.Server.Shutdown, then
// Guard.Shutdown, then the lock client's — lets in-flight requests finish:
// a locked PUT completes and releases its lock and invalidates, a GET that
// runs the handler for the cache stores its response, and a request of
// another process that waited for that response gets it. Nothing is left
// locked, no waiter elsewhere fails.
func TestServerShutdownCompletesInFlight(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	a, b := newShutdownApp(t, s), newShutdownApp(t, s)
	srv, url := serveApp(t, a)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	put := send(client, http.MethodPut, url+"/repos/1")
	get := send(client, http.MethodGet, url+"/repos/2")
	for range 2 {
		within(t, 10*time.Second, recvAny(a.entered), "a's handlers")
	}
	// Another process waits for the response a's GET is loading (for the
	// same host: the host is part of the key).
	other := make(chan answer, 1)
	go func() {
		w := serve(b.r, http.MethodGet, url+"/repos/2")
		other <- answer{code: w.Code, body: w.Body.String() + " " + w.Header().Get("X-Cache")}
	}()
	eventually(t, 10*time.Second, "b's GET to wait", func() bool { return b.g.Stats().Misses == 1 })

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		shut <- srv.Shutdown(ctx) // waits for the two requests
	}()
	eventually(t, 10*time.Second, "the listener to close", func() bool {
		_, err := net.DialTimeout("tcp", url[len("http://"):], time.Second)
		return err != nil
	})
	close(a.release)
	if got := <-put; got.err != nil || got.code != http.StatusOK || got.body != "saved" {
		t.Fatalf("PUT in flight: %+v", got)
	}
	if got := <-get; got.err != nil || got.code != http.StatusOK || got.body != "repo" {
		t.Fatalf("GET in flight: %+v", got)
	}
	if err := <-shut; err != nil {
		t.Fatalf("srv.Shutdown: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.g.Shutdown(ctx); err != nil {
		t.Fatalf("Guard.Shutdown: %v", err)
	}
	if err := a.l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := <-other; got.code != http.StatusOK || got.body != "repo COALESCED" {
		t.Fatalf("the other process's GET: %+v", got)
	}
	if lockExists(t, rdb, "repos:1") {
		t.Fatal("the PUT's lock outlived the shutdown")
	}
}

// When the grace period ends first, http.Server.Close cancels the requests
// still running: a locked handler that follows its context answers (here
// through Abort), and Lock releases its lock at once — it does not wait for
// the lease to run out.
func TestServerCloseReleasesLocks(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	a := newShutdownApp(t, s)
	srv, url := serveApp(t, a)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)

	put := send(client, http.MethodPut, url+"/repos/3")
	within(t, 10*time.Second, recvAny(a.entered), "the PUT's handler")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("srv.Shutdown with a handler still running: %v", err)
	}
	srv.Close() // cancels the running requests' contexts
	if got := <-put; got.err == nil {
		t.Fatalf("PUT: %+v, want the connection closed", got)
	}
	eventually(t, 5*time.Second, "the lock to be released (well before its 10s lease)", func() bool { return !lockExists(t, rdb, "repos:3") })
}

// recvAny turns one receive from ch into a closed channel, for within.
func recvAny[T any](ch <-chan T) <-chan struct{} {
	done := make(chan struct{})
	go func() { <-ch; close(done) }()
	return done
}

// scriptGate holds the first script round trip (a pipeline with EVAL or
// EVALSHA: a Get's get-or-lease on a miss) a client sends until open is
// closed, once armed (newScriptGate arms it); held is closed when it holds it.
type scriptGate struct {
	armed    atomic.Bool // holds nothing before
	once     sync.Once
	held     chan struct{}
	open     chan struct{}
	openOnce sync.Once
}

func newScriptGate(t *testing.T) *scriptGate {
	g := &scriptGate{held: make(chan struct{}), open: make(chan struct{})}
	g.armed.Store(true)
	t.Cleanup(g.release)
	return g
}

func (g *scriptGate) release() { g.openOnce.Do(func() { close(g.open) }) }

func (g *scriptGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *scriptGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *scriptGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); g.armed.Load() && (n == "evalsha" || n == "eval") {
			g.once.Do(func() {
				close(g.held)
				<-g.open
			})
		}
		return next(ctx, cmds)
	}
}

// Guard.Shutdown cancels a load whose handler is still running; the handler
// answers its context's end through Abort. That response answers no other
// request: a request that waited for the load runs its own handler, whether
// the load ran on the request that started it or — that request gone — as
// a BackgroundRefresh copy. (On the code before, the copy's 499 was handed
// to the waiting request as COALESCED: a client that never went away got
// "client closed request" and no body.) And Abort answers the request that
// ran the handler 503, not 499: its client did not go away.
func TestShutdownCancelledLoadIsNotShared(t *testing.T) {
	for _, path := range []string{"request", "background refresh"} {
		t.Run(path, func(t *testing.T) {
			s := redistest.Start(t)
			rdb := s.Client()
			gate := newScriptGate(t)
			if path == "background refresh" {
				rdb.AddHook(gate)
			}
			g := cacheguard.New(rdb)
			t.Cleanup(func() { g.Close() })
			r := newEngine()
			var calls atomic.Int64
			entered := make(chan struct{}, 1)
			r.GET("/slow", ginmw.Cache(g, time.Minute, ginmw.BackgroundRefresh(r)), func(c *gin.Context) {
				if n := calls.Add(1); n > 1 {
					c.String(http.StatusOK, "fresh")
					return
				}
				entered <- struct{}{}
				<-c.Request.Context().Done() // until Shutdown cancels the load
				ginmw.Abort(c, c.Request.Context().Err())
			})
			type reply struct {
				code        int
				cache, body string
			}
			get := func(ctx context.Context) <-chan reply {
				out := make(chan reply, 1)
				go func() {
					w := httptest.NewRecorder()
					r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/slow", nil).WithContext(ctx))
					out <- reply{w.Code, w.Header().Get("X-Cache"), w.Body.String()}
				}()
				return out
			}

			actx, leave := context.WithCancel(context.Background())
			defer leave()
			a := get(actx)
			if path == "background refresh" {
				// The first request leaves before the load asks for its
				// handler: the load runs a copy through the engine.
				within(t, 10*time.Second, gate.held, "the first request's lease")
				leave()
				if got := <-a; got.code != ginmw.StatusClientClosedRequest {
					t.Fatalf("the request that left: %+v, want 499", got)
				}
				gate.release()
			}
			within(t, 10*time.Second, entered, "the load's handler")
			b := get(context.Background())
			eventually(t, 10*time.Second, "the second request to wait for the load", func() bool { return g.Stats().Misses == 2 })

			done, cancel := context.WithCancel(context.Background())
			cancel() // no grace: the load is cancelled at once
			if err := g.Shutdown(done); !errors.Is(err, context.Canceled) {
				t.Fatalf("Shutdown: %v", err)
			}
			if path == "request" {
				// The request whose handler ran is still there: the load's
				// end is no client gone (499) but the service shutting down.
				if got := <-a; got.code != http.StatusServiceUnavailable || !strings.Contains(got.body, "service unavailable") {
					t.Fatalf("the request that ran the handler got %+v, want 503", got)
				}
			}
			got := <-b
			if got.code == ginmw.StatusClientClosedRequest || got.cache == "COALESCED" {
				t.Fatalf("the waiting request got %+v: the cancelled load's answer", got)
			}
			if got.code != http.StatusOK || got.cache != "BYPASS" || got.body != "fresh" {
				t.Fatalf("the waiting request got %+v, want its own handler's 200 (BYPASS)", got)
			}
		})
	}
}

// A Lock after Cache waits inside a load; when Guard.Shutdown cancels the
// load, Lock answers 503 (the service is shutting down), not 499: the
// client did not go away.
func TestShutdownWhileLoadWaitsForLock(t *testing.T) {
	l, lrdb, _ := newLocker(t)
	hold(t, l, "repos:7")
	g, _ := startGuard(t)
	r := newEngine()
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute), ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(time.Minute))), func(c *gin.Context) {
		c.String(http.StatusOK, "repo")
	})
	a := make(chan *httptest.ResponseRecorder, 1)
	go func() { a <- serve(r, http.MethodGet, "/repos/7") }()
	eventually(t, 10*time.Second, "the load's Lock to wait", func() bool {
		n, _ := lrdb.ZCard(context.Background(), "cg:q:{repos:7}").Result()
		return n > 0
	})
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Shutdown(done); !errors.Is(err, context.Canceled) {
		t.Fatalf("Shutdown: %v", err)
	}
	w := <-a
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("status %d, Retry-After %q, body %s: want 503, Retry-After 1", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
}
