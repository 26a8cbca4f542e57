package gormplugin_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/internal/logtest"
)

// events collects what the plugin reports to its Observer.
type events struct {
	mu  sync.Mutex
	all []gormplugin.Event
}

func (ev *events) observe(_ context.Context, e gormplugin.Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.all = append(ev.all, e)
}

func (ev *events) kinds() []gormplugin.EventKind {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []gormplugin.EventKind
	for _, e := range ev.all {
		out = append(out, e.Kind)
	}
	return out
}

func (ev *events) count(k gormplugin.EventKind) int {
	n := 0
	for _, got := range ev.kinds() {
		if got == k {
			n++
		}
	}
	return n
}

// Failed invalidations are reported, retried with backoff, and given up after
// their attempts, each step reported to the Observer.
func TestInvalidationRetriesReported(t *testing.T) {
	forDBs(t, testInvalidationRetriesReported)
}

func testInvalidationRetriesReported(t *testing.T, e *env) {
	inv := &flakyInvalidator{rdb: e.rdb}
	inv.failing.Store(true)
	var ev events
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.Observer(ev.observe),
		gormplugin.RetryInvalidation(3, 10*time.Millisecond))
	if err := e.plain(t).Create(&Widget{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&Widget{ID: 1}).Update("size", 1).Error; err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the invalidation to be given up", func() bool { return ev.count(gormplugin.EventInvalidateDropped) == 1 })
	if got := inv.calls.Load(); got != 3 {
		t.Fatalf("%d invalidation attempts, want 3", got)
	}
	if ev.count(gormplugin.EventInvalidateFailed) != 1 {
		t.Fatalf("events %v, want one InvalidateFailed", ev.kinds())
	}

	// A retry that succeeds is reported too.
	e.rdb.Set(context.Background(), "cache:widgets:1", "cached", 0)
	if err := db.Model(&Widget{ID: 1}).Update("size", 2).Error; err != nil {
		t.Fatal(err)
	}
	inv.failing.Store(false)
	eventually(t, 10*time.Second, "the retried invalidation", func() bool { return ev.count(gormplugin.EventInvalidateRetried) == 1 })
	if exists(t, e.rdb, "cache:widgets:1") {
		t.Fatal("the retried invalidation left the key")
	}
}

// A pending retry does not wait out its backoff once the cache answers
// again: the next invalidation that succeeds (another write's) makes every
// pending one due at once, so the window in which reads may return the old
// value ends with the outage, not a backoff later.
func TestInvalidationRetriedWhenCacheAnswers(t *testing.T) {
	forDBs(t, testInvalidationRetriedWhenCacheAnswers)
}

func testInvalidationRetriedWhenCacheAnswers(t *testing.T, e *env) {
	ctx := context.Background()
	inv := &flakyInvalidator{rdb: e.rdb}
	var ev events
	// A backoff no test outlives: only the cache's answer can bring the
	// retry forward.
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.Observer(ev.observe),
		gormplugin.RetryInvalidation(3, time.Hour))
	for id := uint(1); id <= 2; id++ {
		if err := e.plain(t).Create(&Widget{ID: id}).Error; err != nil {
			t.Fatal(err)
		}
		e.rdb.Set(ctx, "cache:widgets:"+strconv.Itoa(int(id)), "cached", 0)
	}
	inv.failing.Store(true)
	if err := db.Model(&Widget{ID: 1}).Update("size", 1).Error; err != nil {
		t.Fatal(err)
	}
	inv.failing.Store(false)
	if err := db.Model(&Widget{ID: 2}).Update("size", 1).Error; err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the pending invalidation retried after the cache answered", func() bool {
		return ev.count(gormplugin.EventInvalidateRetried) == 1
	})
	for id := 1; id <= 2; id++ {
		if exists(t, e.rdb, "cache:widgets:"+strconv.Itoa(id)) {
			t.Fatalf("cache:widgets:%d left after its write's invalidation", id)
		}
	}
}

// Shutdown waits for a guarded transaction in flight, then flushes the
// invalidations that failed, retrying at once; when its context ends first
// it drops what is left, reports it, and says so.
func TestShutdownFlushesInvalidations(t *testing.T) {
	forDBs(t, testShutdownFlushesInvalidations)
}

func testShutdownFlushesInvalidations(t *testing.T, e *env) {
	ctx := context.Background()
	inv := &flakyInvalidator{rdb: e.rdb}
	var ev events
	// A long backoff: only Shutdown's flush can make the retry come soon.
	db, p := e.guardedPlugin(t, &gorm.Config{}, gormplugin.Invalidate(inv, cacheKeys), gormplugin.Observer(ev.observe),
		gormplugin.RetryInvalidation(5, time.Hour))
	if err := db.Create(&[]Widget{{ID: 1}, {ID: 2}}).Error; err != nil {
		t.Fatal(err)
	}
	e.rdb.Set(ctx, "cache:widgets:1", "cached", 0)
	e.rdb.Set(ctx, "cache:widgets:2", "cached", 0)

	// widgets:1: committed while the cache was down.
	inv.failing.Store(true)
	if err := db.Model(&Widget{ID: 1}).Update("size", 1).Error; err != nil {
		t.Fatal(err)
	}
	// widgets:2: a transaction in flight when Shutdown starts.
	inside, release := make(chan struct{}), make(chan struct{})
	txDone := make(chan error, 1)
	go func() {
		txDone <- gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
			if err := tx.Model(&Widget{ID: 2}).Update("size", 2).Error; err != nil {
				return err
			}
			close(inside)
			<-release
			return nil
		}, &Widget{ID: 2})
	}()
	<-inside
	shut := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		shut <- p.Shutdown(sctx)
	}()
	inv.failing.Store(false) // the cache is back
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a guarded transaction was in flight", err)
	default:
	}
	close(release)
	if err := <-txDone; err != nil {
		t.Fatal(err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	for _, k := range []string{"cache:widgets:1", "cache:widgets:2"} {
		if exists(t, e.rdb, k) {
			t.Fatalf("%s not invalidated when Shutdown returned", k)
		}
	}
	if e.held(t, "widgets:2") {
		t.Fatal("row lock left after Shutdown")
	}

	// The cache stays down: Shutdown gives up when its context ends.
	db2, p2 := e.guardedPlugin(t, &gorm.Config{}, gormplugin.Invalidate(inv, cacheKeys), gormplugin.Observer(ev.observe))
	inv.failing.Store(true)
	if err := db2.Model(&Widget{ID: 1}).Update("size", 3).Error; err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	err := p2.Shutdown(sctx)
	if !errors.Is(err, gormplugin.ErrInvalidate) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown with the cache down: %v, want ErrInvalidate and the context's error", err)
	}
	if ev.count(gormplugin.EventInvalidateDropped) != 1 {
		t.Fatalf("events %v, want one InvalidateDropped", ev.kinds())
	}
}

// A graceful shutdown of an HTTP service composes with the plugin: the
// server's Shutdown lets the request in flight finish its guarded write (200,
// committed, its lock released), then the plugin's Shutdown flushes the
// invalidation that failed meanwhile (issue 22 item 3).
func TestGracefulHTTPShutdown(t *testing.T) {
	forDBs(t, testGracefulHTTPShutdown)
}

func testGracefulHTTPShutdown(t *testing.T, e *env) {
	ctx := context.Background()
	inv := &flakyInvalidator{rdb: e.rdb}
	db, p := e.guardedPlugin(t, &gorm.Config{}, gormplugin.Invalidate(inv, cacheKeys), gormplugin.RetryInvalidation(5, time.Hour))
	if err := db.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	e.rdb.Set(ctx, "cache:counters:1", "cached", 0)
	inside, release := make(chan struct{}), make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := gormplugin.Transaction(r.Context(), db, func(tx *gorm.DB) error {
			var c Counter
			if err := tx.First(&c, 1).Error; err != nil {
				return err
			}
			close(inside)
			<-release
			return tx.Model(&c).Update("n", c.N+1).Error
		}, &Counter{ID: 1})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	status := make(chan int, 1)
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+"/", "text/plain", nil)
		if err != nil {
			status <- -1
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	<-inside
	inv.failing.Store(true) // the cache goes down while the request is in flight
	shut := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		shut <- srv.Shutdown(sctx)
	}()
	close(release)
	if code := <-status; code != http.StatusOK {
		t.Fatalf("request in flight during the shutdown answered %d, want 200", code)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatal(err)
	}
	if !exists(t, e.rdb, "cache:counters:1") {
		t.Fatal("the failing invalidator deleted the key")
	}
	inv.failing.Store(false)
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := p.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if exists(t, e.rdb, "cache:counters:1") {
		t.Fatal("the committed write's invalidation was lost")
	}
	if e.held(t, "counters:1") {
		t.Fatal("row lock left after the shutdown")
	}
	var c Counter
	e.plain(t).First(&c, 1)
	if c.N != 1 {
		t.Fatalf("n = %d, want the request's write", c.N)
	}
}

// Without Logger, a failed invalidation is logged through slog.Default(),
// rate-limited by each Plugin on its own: a second Plugin's warnings a moment
// after the first's are not swallowed (one limiter shared by every Plugin
// once did, and this test then waited in vain for the second's).
func TestWarningsGoToSlogDefault(t *testing.T) {
	def := logtest.New(8)
	def.Default(t)
	for i := range 2 {
		e := newEnv(t, onSQLite, byClient)
		inv := &flakyInvalidator{rdb: e.rdb}
		inv.failing.Store(true)
		db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.RetryInvalidation(1, 10*time.Millisecond))
		if err := e.plain(t).Create(&Widget{ID: 1}).Error; err != nil {
			t.Fatal(err)
		}
		if err := db.Model(&Widget{ID: 1}).Update("size", 1).Error; err != nil {
			t.Fatal(err)
		}
		for m := def.Wait(t, 10*time.Second); !strings.Contains(m, "given up"); m = def.Wait(t, 10*time.Second) {
			if !strings.HasPrefix(m, "gormplugin: ") {
				t.Fatalf("plugin %d: warning %q, want the plugin's", i, m)
			}
		}
	}
}

// A failed invalidation is reported under the context of the write whose
// keys it leaves, before the write returns, on both write paths (a plain
// statement, Transaction): a handler can tell its client that the keys may
// be served stale until a retry succeeds.
func TestInvalidateFailedUnderWriteContext(t *testing.T) {
	forDBs(t, testInvalidateFailedUnderWriteContext)
}

type requestID struct{}

func testInvalidateFailedUnderWriteContext(t *testing.T, e *env) {
	inv := &flakyInvalidator{rdb: e.rdb}
	inv.failing.Store(true)
	var mu sync.Mutex
	var seen []any // the request id of each EventInvalidateFailed
	db := e.guarded(t, gormplugin.Invalidate(inv, cacheKeys), gormplugin.RetryInvalidation(2, time.Hour),
		gormplugin.Observer(func(ctx context.Context, ev gormplugin.Event) {
			if ev.Kind == gormplugin.EventInvalidateFailed {
				mu.Lock()
				seen = append(seen, ctx.Value(requestID{}))
				mu.Unlock()
			}
		}))
	if err := e.plain(t).Create(&Widget{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	ctx := context.WithValue(t.Context(), requestID{}, "r1")
	if err := db.WithContext(ctx).Model(&Widget{ID: 1}).Update("size", 1).Error; err != nil {
		t.Fatal(err)
	}
	ctx = context.WithValue(t.Context(), requestID{}, "r2")
	err := gormplugin.Transaction(ctx, db, func(tx *gorm.DB) error {
		return tx.Model(&Widget{ID: 1}).Update("size", 2).Error
	}, &Widget{ID: 1})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, []any{"r1", "r2"}) {
		t.Fatalf("EventInvalidateFailed seen under request ids %v by the time the writes returned, want [r1 r2]", seen)
	}
}
