// Package cgotel reports what cacheguard's packages do to OpenTelemetry:
// metrics through a MeterProvider and spans through a TracerProvider (the
// global ones unless given). It is a module of its own, so that the library
// pulls in no OpenTelemetry dependency.
//
//	a := cgotel.New()
//	g := cacheguard.New(rdb, cacheguard.Observer(a.CacheObserver()))
//	l := locks.New(rdb, locks.Observer(a.LockObserver()))
//	rdb.AddHook(&locks.Breaker{Observer: a.LockObserver()})
//	db.Use(gormplugin.New(l, gormplugin.Observer(a.GormObserver())))
//
// Metrics (names in OpenTelemetry's dotted style, durations in seconds; the
// event counters are observable counters, summed at collection from striped
// atomic counts, so counting a cache hit costs a few nanoseconds):
//
//   - cacheguard.cache.events{event}: every cache outcome, by
//     cacheguard.EventKind ("hit", "miss", "load", "coalesced_local",
//     "coalesced_remote", "stale", "early_refresh", "negative_hit",
//     "wait_timeout", "fail_open", "decode_error", "redis_error", "near_hit",
//     "fail_safe", "near_invalidated").
//   - cacheguard.cache.load.duration{error}: how long each load ran; a load
//     whose loader answered cacheguard.ErrUncached (a result not to be
//     stored, not a failure) counts as error=false.
//   - cacheguard.lock.events{event}: every lock outcome, by locks.EventKind
//     ("acquired", "reentered", "not_obtained", "released", "lost",
//     "renewal_failed", "breaker_opened", "breaker_closed"); acquired +
//     reentered = released + lost + the holds open now.
//   - cacheguard.lock.wait.duration{outcome}: how long acquisitions waited
//     (outcome "acquired", "reentered" or "not_obtained").
//   - cacheguard.lock.hold.duration: how long each hold lasted, from its
//     grant to its release or loss (a re-entry is a hold of its own).
//   - cacheguard.gorm.events{event}: the GORM plugin's events
//     (gormplugin.EventKind).
//
// Metrics carry no key or lock name: their number is unbounded, and a metric
// attribute per key would make as many time series. Spans carry them:
//
//   - "cacheguard.load" for each load this process ran, a child of the span
//     of the call that ran it, with cacheguard.key;
//   - "cacheguard.lock.wait" for each acquisition, a child of the caller's
//     span, with cacheguard.lock.name and cacheguard.lock.outcome.
//
// HashKeys replaces keys and names in span attributes by a hash of them, for
// keys that hold user data. Nothing else of the caller's data is recorded.
package cgotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// scope is the instrumentation scope's name.
const scope = "github.com/cacheguard/cacheguard/cgotel"

// Option configures an Adapter.
type Option func(*config)

type config struct {
	mp   metric.MeterProvider
	tp   trace.TracerProvider
	hash bool
}

// MeterProvider sets where metrics go. The default is otel.GetMeterProvider().
func MeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// TracerProvider sets where spans go. The default is otel.GetTracerProvider().
func TracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// HashKeys records a hash of each cache key and lock name in span
// attributes instead of the key itself. Off by default.
func HashKeys() Option { return func(c *config) { c.hash = true } }

// Adapter turns the observers' events into metrics and spans. Make one per
// process and pass its observers to every Guard, Client, Redlock, Breaker
// and Plugin. It is safe for concurrent use.
type Adapter struct {
	tracer trace.Tracer
	hash   bool

	// Events are counted in striped atomic counters and reported by the
	// instruments' callbacks at collection: a cache hit costs an atomic add,
	// not an instrument call.
	cacheEvents, lockEvents, gormEvents striped
	loadTime                            metric.Float64Histogram
	waitTime                            metric.Float64Histogram
	holdTime                            metric.Float64Histogram
}

// New returns an Adapter. It panics with a "cgotel:" message if an
// instrument cannot be created (a MeterProvider that refuses the names).
func New(opts ...Option) *Adapter {
	cfg := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider()}
	for _, o := range opts {
		o(&cfg)
	}
	m := cfg.mp.Meter(scope)
	a := &Adapter{tracer: cfg.tp.Tracer(scope), hash: cfg.hash}
	var errs []error
	counter := func(name, desc string, counts *striped, kindName func(int) string) {
		var sets [maxKinds]metric.ObserveOption
		for k := range sets {
			sets[k] = metric.WithAttributeSet(attribute.NewSet(attribute.String("event", kindName(k))))
		}
		_, err := m.Int64ObservableCounter(name, metric.WithDescription(desc), metric.WithUnit("{event}"),
			metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
				for k := range sets {
					if n := counts.sum(k); n > 0 {
						o.Observe(n, sets[k])
					}
				}
				return nil
			}))
		errs = append(errs, err)
	}
	seconds := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
		errs = append(errs, err)
		return h
	}
	counter("cacheguard.cache.events", "Cache outcomes, by kind.", &a.cacheEvents,
		func(k int) string { return cacheguard.EventKind(k).String() })
	counter("cacheguard.lock.events", "Lock and circuit-breaker outcomes, by kind.", &a.lockEvents,
		func(k int) string { return locks.EventKind(k).String() })
	counter("cacheguard.gorm.events", "GORM plugin events, by kind.", &a.gormEvents,
		func(k int) string { return gormplugin.EventKind(k).String() })
	a.loadTime = seconds("cacheguard.cache.load.duration", "How long the loads this process ran took.")
	a.waitTime = seconds("cacheguard.lock.wait.duration", "How long lock acquisitions waited.")
	a.holdTime = seconds("cacheguard.lock.hold.duration", "How long each lock hold lasted, from its grant to its release or loss (re-entries count as holds of their own).")
	for _, err := range errs {
		if err != nil {
			panic("cgotel: " + err.Error())
		}
	}
	return a
}

// Chain returns an observer that calls each of fs in turn: the Adapter's
// observer beside one of your own.
func Chain[E any](fs ...func(context.Context, E)) func(context.Context, E) {
	return func(ctx context.Context, e E) {
		for _, f := range fs {
			if f != nil {
				f(ctx, e)
			}
		}
	}
}

// maxKinds bounds the event kinds counted (each package has fewer).
const maxKinds = 32

// striped counts events by kind in cells picked at random, so that the
// goroutines counting hits on several cores do not all write one cache line.
type striped struct {
	cells [8]struct {
		n [maxKinds]atomic.Int64
		_ [64]byte
	}
}

func (s *striped) add(kind int) {
	if kind >= 0 && kind < maxKinds {
		s.cells[rand.Uint32()%uint32(len(s.cells))].n[kind].Add(1)
	}
}

func (s *striped) sum(kind int) int64 {
	var n int64
	for i := range s.cells {
		n += s.cells[i].n[kind].Load()
	}
	return n
}

var (
	loadOK   = metric.WithAttributeSet(attribute.NewSet(attribute.Bool("error", false)))
	loadErr  = metric.WithAttributeSet(attribute.NewSet(attribute.Bool("error", true)))
	waitOK   = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "acquired")))
	waitFail = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "not_obtained")))
	waitRe   = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", "reentered")))
)

// CacheObserver returns the observer to pass to cacheguard.Observer.
func (a *Adapter) CacheObserver() func(context.Context, cacheguard.Event) {
	return func(ctx context.Context, e cacheguard.Event) {
		// Counted last: an event that is counted has its histogram sample
		// and span recorded already.
		defer a.cacheEvents.add(int(e.Kind))
		if e.Kind != cacheguard.EventLoad {
			return
		}
		// A loader's cacheguard.ErrUncached is an answer that is not to be
		// stored (ginmw.Cache's private or oversized pages), not a failure.
		failed := e.Err != nil && !errors.Is(e.Err, cacheguard.ErrUncached)
		if failed {
			a.loadTime.Record(ctx, e.Duration.Seconds(), loadErr)
		} else {
			a.loadTime.Record(ctx, e.Duration.Seconds(), loadOK)
		}
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return // no trace to join: a root span per load would be noise
		}
		end := time.Now()
		_, span := a.tracer.Start(ctx, "cacheguard.load", trace.WithTimestamp(end.Add(-e.Duration)),
			trace.WithAttributes(a.key("cacheguard.key", e.Key)))
		if failed {
			span.RecordError(e.Err)
		}
		span.End(trace.WithTimestamp(end))
	}
}

// LockObserver returns the observer to pass to locks.Observer (a Client
// or a Redlock) and to a locks.Breaker's Observer.
func (a *Adapter) LockObserver() func(context.Context, locks.Event) {
	return func(ctx context.Context, e locks.Event) {
		defer a.lockEvents.add(int(e.Kind)) // last, as in CacheObserver
		switch e.Kind {
		case locks.EventAcquired, locks.EventReentered, locks.EventNotObtained:
			outcome, opt := "acquired", waitOK
			switch e.Kind {
			case locks.EventNotObtained:
				outcome, opt = "not_obtained", waitFail
			case locks.EventReentered:
				outcome, opt = "reentered", waitRe
			}
			a.waitTime.Record(ctx, e.Wait.Seconds(), opt)
			if trace.SpanContextFromContext(ctx).IsValid() {
				end := time.Now()
				_, span := a.tracer.Start(ctx, "cacheguard.lock.wait", trace.WithTimestamp(end.Add(-e.Wait)),
					trace.WithAttributes(a.key("cacheguard.lock.name", e.Name), attribute.String("cacheguard.lock.outcome", outcome)))
				if e.Err != nil {
					span.RecordError(e.Err)
				}
				span.End(trace.WithTimestamp(end))
			}
		case locks.EventReleased, locks.EventLost:
			a.holdTime.Record(ctx, e.Held.Seconds())
		}
	}
}

// GormObserver returns the observer to pass to gormplugin.Observer.
func (a *Adapter) GormObserver() func(context.Context, gormplugin.Event) {
	return func(ctx context.Context, e gormplugin.Event) {
		a.gormEvents.add(int(e.Kind))
	}
}

// key is a span attribute naming a key or lock, hashed if asked.
func (a *Adapter) key(name, v string) attribute.KeyValue {
	if a.hash {
		sum := sha256.Sum256([]byte(v))
		v = hex.EncodeToString(sum[:8])
	}
	return attribute.String(name, v)
}
