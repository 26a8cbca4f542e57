package cgotel_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/cgotel"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

var redisAddr string

func TestMain(m *testing.M) { redistest.Main(m, &redisAddr) }

// rig is an Adapter writing to an in-memory reader and span recorder.
type rig struct {
	a      *cgotel.Adapter
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newRig(t *testing.T, opts ...cgotel.Option) *rig {
	r := &rig{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = r.tp.Shutdown(context.Background())
	})
	r.a = cgotel.New(append([]cgotel.Option{cgotel.MeterProvider(mp), cgotel.TracerProvider(r.tp)}, opts...)...)
	return r
}

// counts returns metric name -> attribute value -> sum (counters) or count
// (histograms).
func (r *rig) counts(t *testing.T) map[string]map[string]int64 {
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			c := map[string]int64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					c[label(p.Attributes.ToSlice())] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					c[label(p.Attributes.ToSlice())] += int64(p.Count)
				}
			}
			out[m.Name] = c
		}
	}
	return out
}

func label(kvs []attributeKV) string {
	s := ""
	for _, kv := range kvs {
		s += kv.Value.String()
	}
	return s
}

// TestStampede: 20 concurrent Gets of a cold key in a traced request give
// one load (one load-duration sample, one "cacheguard.load" span, a child of
// the request's span, naming the key) and 20 calls' outcomes.
func TestStampede(t *testing.T) {
	r := newRig(t)
	s := redistest.Start(t)
	g := cacheguard.New(s.Client(), cacheguard.Observer(r.a.CacheObserver()))
	t.Cleanup(func() { _ = g.Close() })
	ctx, root := r.tp.Tracer("test").Start(context.Background(), "request")
	var loads atomic.Int32
	release := make(chan struct{})
	load := func(context.Context) (string, error) {
		loads.Add(1)
		<-release
		return "v", nil
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := cacheguard.Get(ctx, g, "repos:1", load); err != nil || v != "v" {
				t.Errorf("Get: %q, %v", v, err)
			}
		}()
	}
	redistest.Eventually(t, 5*time.Second, "the load started", func() bool { return loads.Load() == 1 })
	close(release)
	wg.Wait()
	root.End()

	c := r.counts(t)
	if n := c["cacheguard.cache.load.duration"]["false"]; n != 1 {
		t.Fatalf("load-duration samples %d, want 1 (%v)", n, c)
	}
	ev := c["cacheguard.cache.events"]
	if ev["load"] != 1 || ev["miss"]+ev["hit"] < 20 {
		t.Fatalf("cache events %v: want 1 load and 20 calls' outcomes", ev)
	}
	var loadSpans int
	for _, sp := range r.spans.Ended() {
		if sp.Name() != "cacheguard.load" {
			continue
		}
		loadSpans++
		if sp.Parent().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("load span not in the request's trace")
		}
		if got := attr(sp.Attributes(), "cacheguard.key"); got != "repos:1" {
			t.Errorf("load span key %q", got)
		}
	}
	if loadSpans != 1 {
		t.Fatalf("%d load spans, want 1", loadSpans)
	}
}

// TestContendedAndLostLock: two acquisitions of one name, the second waiting
// for the first (two wait samples, a wait span each in the caller's trace),
// then a lock lost (a fixed lease that runs out): lock events, hold times.
func TestContendedAndLostLock(t *testing.T) {
	r := newRig(t, cgotel.HashKeys())
	s := redistest.Start(t)
	l := locks.New(s.Client(), locks.Observer(r.a.LockObserver()))
	t.Cleanup(func() { l.Close() })
	ctx, root := r.tp.Tracer("test").Start(context.Background(), "request")
	first, err := l.Lock(ctx, "repos:2")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		lk, err := l.Lock(ctx, "repos:2")
		if err == nil {
			err = lk.Unlock(ctx)
		}
		done <- err
	}()
	redistest.Eventually(t, 5*time.Second, "the second caller waits", func() bool {
		n, _ := s.Client().Exists(ctx, "cg:q:{repos:2}").Result()
		return n == 1 || len(done) > 0
	})
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lost, err := l.Lock(ctx, "repos:3", locks.Lease(100*time.Millisecond), locks.NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	<-lost.Lost()
	root.End()
	// The Lost event follows the closing of Lost; the adapter counts an
	// event after recording its samples.
	redistest.Eventually(t, 5*time.Second, "the Lost event", func() bool {
		return r.counts(t)["cacheguard.lock.events"]["lost"] == 1
	})

	c := r.counts(t)
	ev := c["cacheguard.lock.events"]
	if ev["acquired"] != 3 || ev["released"] != 2 || ev["lost"] != 1 {
		t.Fatalf("lock events %v: want 3 acquired, 2 released, 1 lost", ev)
	}
	if n := c["cacheguard.lock.wait.duration"]["acquired"]; n != 3 {
		t.Fatalf("wait samples %d, want 3", n)
	}
	if n := c["cacheguard.lock.hold.duration"][""]; n != 3 {
		t.Fatalf("hold samples %d, want 3 (%v)", n, c["cacheguard.lock.hold.duration"])
	}
	waits := 0
	for _, sp := range r.spans.Ended() {
		if sp.Name() == "cacheguard.lock.wait" {
			waits++
			if got := attr(sp.Attributes(), "cacheguard.lock.name"); got == "repos:2" || got == "repos:3" || len(got) != 16 {
				t.Errorf("lock name %q: want a 16-hex-digit hash (HashKeys)", got)
			}
		}
	}
	if waits != 3 {
		t.Fatalf("%d wait spans, want 3", waits)
	}
}

// TestUncachedLoadIsNotAFailure: a load whose loader answers with
// cacheguard.ErrUncached — a result that is not a failure but is not to be
// stored, as ginmw.Cache's loads of private or oversized pages are — is
// recorded as a successful load, not with error=true; a load that failed is.
func TestUncachedLoadIsNotAFailure(t *testing.T) {
	r := newRig(t)
	s := redistest.Start(t)
	g := cacheguard.New(s.Client(), cacheguard.Observer(r.a.CacheObserver()))
	t.Cleanup(func() { _ = g.Close() })
	ctx := context.Background()
	uncached := func(context.Context) (string, error) {
		return "", fmt.Errorf("page over MaxBody: %w", cacheguard.ErrUncached)
	}
	if _, err := cacheguard.Get(ctx, g, "page:big", uncached); !errors.Is(err, cacheguard.ErrUncached) {
		t.Fatalf("Get: %v", err)
	}
	failed := func(context.Context) (string, error) { return "", errors.New("database down") }
	if _, err := cacheguard.Get(ctx, g, "page:down", failed); err == nil {
		t.Fatal("Get of a failing load: no error")
	}
	c := r.counts(t)["cacheguard.cache.load.duration"]
	if c["false"] != 1 || c["true"] != 1 {
		t.Fatalf("load-duration samples by error: %v, want one false (the uncached answer) and one true", c)
	}
}
