package cacheguard

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// goid is the id of the calling goroutine (from its stack's first line,
// "goroutine N [running]:").
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseInt(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// readSender records the goroutine that sends each read of a value (HGET).
type readSender struct{ last atomic.Int64 }

func (h *readSender) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *readSender) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hget" {
			h.last.Store(goid())
		}
		return next(ctx, cmd)
	}
}
func (h *readSender) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestReadInlineWhenClientBoundsIt: a hit's read runs on its caller's
// goroutine (no hand-off to a worker) when the client ends it within every
// bound the call keeps on its own: with ContextTimeoutEnabled, or without it
// when one attempt (WriteTimeout + ReadTimeout) fits before the earliest of
// the caller's deadline, the wait budget and the command timeout. Otherwise
// (go-redis's defaults: 5s each way; a deadline shorter than an attempt; no
// socket timeout) it is handed to a worker, as before.
func TestReadInlineWhenClientBoundsIt(t *testing.T) {
	s := redistest.Start(t)
	small := func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond }
	for _, tc := range []struct {
		name     string
		opt      func(*redis.Options)
		deadline time.Duration // the caller's; none when 0
		budget   time.Duration // WaitBudget; the default when 0
		inline   bool
	}{
		{"ContextTimeoutEnabled", func(o *redis.Options) { o.ContextTimeoutEnabled = true }, 0, 0, true},
		{"go-redis defaults", func(*redis.Options) {}, 0, 0, false},
		{"timeouts 100ms", small, 0, 0, true},
		{"timeouts 100ms, deadline 5s", small, 5 * time.Second, 0, true},
		{"timeouts 100ms, deadline 150ms", small, 150 * time.Millisecond, 0, false},
		{"timeouts 100ms, budget 150ms", small, 0, 150 * time.Millisecond, false},
		{"no read timeout", func(o *redis.Options) { o.ReadTimeout = -1 }, 0, 0, false},
		{"timeouts 400ms, retries", func(o *redis.Options) { o.ReadTimeout = 400 * time.Millisecond }, 0, 0, true},
		{"timeouts 600ms", func(o *redis.Options) { o.ReadTimeout = 600 * time.Millisecond }, 0, 0, false}, // 1.2s > 2 × 500ms
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := s.Client(tc.opt)
			h := &readSender{}
			rdb.AddHook(h)
			g, key, load, ctx := warmKey(t, rdb, tc.deadline)
			var opts []CallOption
			if tc.budget > 0 {
				opts = append(opts, WaitBudget(tc.budget))
			}
			var res Result
			if _, err := Get(ctx, g, key, load, append(opts, ReportTo(&res))...); err != nil || res != Hit {
				t.Fatalf("Get = %v, %v; want a hit", err, res)
			}
			if inline := h.last.Load() == goid(); inline != tc.inline {
				t.Fatalf("read on the caller's goroutine: %v, want %v", inline, tc.inline)
			}
		})
	}
}

// TestPausedRedisShortDeadlineWithoutContextTimeout: on a client without
// ContextTimeoutEnabled, a Get returns at its deadline while Redis is paused,
// whether its read was handed off (go-redis's defaults: the socket read
// would wait 5s) or ran inline (small client timeouts, no deadline: it ends
// within the command timeout and asks its flight, which fails open).
func TestPausedRedisShortDeadlineWithoutContextTimeout(t *testing.T) {
	s := redistest.Start(t)
	for _, tc := range []struct {
		name     string
		opt      func(*redis.Options)
		deadline time.Duration
		within   time.Duration
	}{
		{"go-redis defaults, deadline 200ms", func(*redis.Options) {}, 200 * time.Millisecond, 2 * time.Second},
		{"timeouts 150ms, retries, no deadline", func(o *redis.Options) {
			o.ReadTimeout, o.WriteTimeout = 150*time.Millisecond, 150*time.Millisecond
		}, 0, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := s.Client(tc.opt)
			g, key, load, ctx := warmKey(t, rdb, tc.deadline)
			s.Pause()
			start := time.Now()
			v, err := Get(ctx, g, key, load)
			took := time.Since(start)
			s.Resume()
			switch {
			case took > tc.within:
				t.Fatalf("Get took %v with Redis paused, want at most %v", took, tc.within)
			case tc.deadline > 0 && !errors.Is(err, context.DeadlineExceeded):
				t.Fatalf("Get = %v, %v; want its context's deadline", v, err)
			case tc.deadline == 0 && (err != nil || v != "v"):
				t.Fatalf("Get = %v, %v; want a fail-open load", v, err)
			}
		})
	}
}

// warmKey returns a Guard on rdb with a key already filled with "v", its
// loader, and a context with the deadline d from now (none when 0).
func warmKey(t *testing.T, rdb *redis.Client, d time.Duration) (*Guard, string, func(context.Context) (string, error), context.Context) {
	t.Helper()
	g := New(rdb, EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	key := t.Name()
	load := func(context.Context) (string, error) { return "v", nil }
	if _, err := Get(context.Background(), g, key, load); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		t.Cleanup(cancel)
	}
	return g, key, load, ctx
}

// valueSeen records the value of a context key that the read of a value
// (HGET) was sent under, and whether that context had a deadline.
type valueSeen struct {
	v        atomic.Value
	deadline atomic.Bool
}

type ctxKey struct{}

func (h *valueSeen) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *valueSeen) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hget" {
			h.v.Store(ctx.Value(ctxKey{}))
			_, ok := ctx.Deadline()
			h.deadline.Store(ok)
		}
		return next(ctx, cmd)
	}
}
func (h *valueSeen) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestInlineReadKeepsValuesAndBound: a read sent on the caller's goroutine
// under a request's context (one that can be cancelled) carries its values
// (a tracing hook needs them) and a deadline (the command's bound), on both
// client kinds.
func TestInlineReadKeepsValuesAndBound(t *testing.T) {
	s := redistest.Start(t)
	for name, opt := range map[string]func(*redis.Options){
		"ContextTimeoutEnabled": func(o *redis.Options) { o.ContextTimeoutEnabled = true },
		"timeouts 100ms":        func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond },
	} {
		t.Run(name, func(t *testing.T) {
			rdb := s.Client(opt)
			h := &valueSeen{}
			rdb.AddHook(h)
			g := New(rdb, EarlyRefresh(0))
			t.Cleanup(func() { g.Close() })
			load := func(context.Context) (string, error) { return "v", nil }
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "request"))
			defer cancel()
			for range 2 { // a miss, then a hit
				if _, err := Get(ctx, g, "k", load); err != nil {
					t.Fatal(err)
				}
			}
			if v := h.v.Load(); v != "request" || !h.deadline.Load() {
				t.Fatalf("the hit's read saw value %v, deadline %v; want the caller's value and a deadline", v, h.deadline.Load())
			}
		})
	}
}

// TestReadLineName: the values hash's name a Get builds into its read's
// command line is the name every other path uses, for keys that fit the
// line's buffer and keys that do not, with and without a hash tag.
func TestReadLineName(t *testing.T) {
	s := redistest.Start(t)
	g := New(s.Client(), Prefix("app:"))
	t.Cleanup(func() { g.Close() })
	for _, key := range []string{"k", "user:42", "a{b}c", strings.Repeat("x", 72), strings.Repeat("x", 73), strings.Repeat("y", 300)} {
		h := g.readLine(key, "rep")
		if want := g.name("v:", key); h.name != want || h.field != "rep" || h.args[0] != "hget" || *h.args[1].(*string) != want {
			t.Fatalf("readLine(%q) = %q %q %v, want the name %q", key, h.name, h.field, h.args, want)
		}
	}
}
