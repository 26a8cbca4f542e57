package cacheguard_test

// Regression tests for the defects an outside probe found: each names the
// rule it checks.

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// logBuffer collects what a Guard's Logger writes.
type logBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// An Observer is user code: its panic is recovered and logged wherever the
// Guard calls it, and what reported the event goes on. A panic on EventLoad
// used to escape the fill, leaving its lease renewed until the load timeout.
func TestObserverPanicOnLoadReleasesLease(t *testing.T) {
	ctx := context.Background()
	var logs logBuffer
	var once sync.Once
	g, rdb := newGuard(t, cacheguard.Logger(logs.logger()), cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
		if e.Kind == cacheguard.EventLoad {
			once.Do(func() { panic("observer boom") })
		}
	}))
	key := testKey(t)
	v, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) { return item{Name: "v"}, nil },
		cacheguard.LoadTimeout(time.Minute))
	if err != nil || v.Name != "v" {
		t.Fatalf("Get with an Observer panicking on EventLoad = %v, %v; want the loaded value", v, err)
	}
	if n := rdb.Exists(ctx, leaseKey(key)).Val(); n != 0 {
		t.Fatalf("fill lease left in Redis after the Observer panicked (pttl %v)", rdb.PTTL(ctx, leaseKey(key)).Val())
	}
	var r cacheguard.Result
	if v, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) { return item{Name: "w"}, nil },
		cacheguard.ReportTo(&r)); err != nil || v.Name != "v" || r != cacheguard.Hit {
		t.Fatalf("next Get = %v, %v, %v; want a Hit of the stored value", v, err, r)
	}
	if s := logs.String(); !strings.Contains(s, "Observer panicked") || !strings.Contains(s, "observer boom") {
		t.Errorf("the Observer's panic was not logged: %q", s)
	}
}

// An Observer panicking on the shared subscription's goroutine
// (EventNearInvalidated) used to kill the process; the subscription goes on.
func TestObserverPanicOnSubscriptionGoroutine(t *testing.T) {
	ctx := context.Background()
	a, _ := newGuard(t, cacheguard.Logger(slog.New(slog.DiscardHandler)), cacheguard.NearCache(10, time.Minute),
		cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
			if e.Kind == cacheguard.EventNearInvalidated {
				panic("observer boom near")
			}
		}))
	b, _ := newGuard(t)
	key := testKey(t)
	for i := range 2 {
		load := func(context.Context) (item, error) { return item{ID: i}, nil }
		eventually(t, 5*time.Second, "a near-cache hit", func() bool {
			var r cacheguard.Result
			_, err := cacheguard.Get(ctx, a, key, load, cacheguard.ReportTo(&r))
			return err == nil && r == cacheguard.NearHit
		})
		heard := cacheguard.NearHeard(a, key)
		if err := b.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		// The second round needs the subscription alive after the first panic.
		eventually(t, 5*time.Second, "a's near cache to drop the key", func() bool { return cacheguard.NearHeard(a, key) > heard })
	}
}
