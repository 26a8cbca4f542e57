package cacheguard_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// holdSub is a go-redis hook that, once held, keeps what Redis sends on the
// client's subscription connection from its reader until released: the
// near cache's messages arrive late, as on a slow subscriber.
type holdSub struct {
	held    atomic.Bool
	release chan struct{}
	once    sync.Once
}

func newHoldSub() *holdSub { return &holdSub{release: make(chan struct{})} }

func (h *holdSub) hold() { h.held.Store(true) }
func (h *holdSub) free() { h.once.Do(func() { close(h.release) }) }

func (h *holdSub) DialHook(next redis.DialHook) redis.DialHook { return subDial(next, h.wait) }

// wait keeps a reply read on the subscription from its reader while held.
func (h *holdSub) wait() {
	if h.held.Load() {
		<-h.release
	}
}
func (h *holdSub) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdSub) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// subDial makes every connection next dials a subConn that waits with wait.
func subDial(next redis.DialHook, wait func()) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &subConn{Conn: c, wait: wait}, nil
	}
}

// subConn is a connection that knows whether it subscribed: what it reads
// once it did reaches its reader when wait returns (a late message).
type subConn struct {
	net.Conn
	wait func()
	sub  atomic.Bool
}

func (c *subConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.sub.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *subConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.sub.Load() {
		c.wait()
	}
	return n, err
}

// Reads do not go backwards across invalidations within a process, whatever
// representation each reads. Process A near-caches key's Variant("v") at
// version 1; B writes version 2 (or deletes the row), invalidates the key and
// loads it, while A's subscription is slow (their messages not yet read). A's
// plain Get reads version 2 (or the cached absence) from Redis; A's next Get
// of the key with Variant("v") returned version 1 from the near cache: a read
// that found the key's newer generation did not drop its other
// representations (only a store did).
func TestNearCacheReadsDoNotGoBackwardsAcrossRepresentations(t *testing.T) {
	for _, deleted := range []bool{false, true} {
		t.Run(map[bool]string{false: "value", true: "absence"}[deleted], func(t *testing.T) {
			testNearNotBackwards(t, deleted)
		})
	}
}

func testNearNotBackwards(t *testing.T, deleted bool) {
	ctx := context.Background()
	hold := newHoldSub()
	rdbA := shared(t)
	rdbA.AddHook(hold)
	a := cacheguard.New(rdbA, cacheguard.NearCache(100, time.Hour))
	t.Cleanup(func() { a.Close() })
	t.Cleanup(hold.free) // first: Close waits for the subscription's reader
	b, _ := newGuard(t, cacheguard.NearCache(100, time.Hour))
	eventually(t, 10*time.Second, "A's near cache to be trusted", func() bool { return cacheguard.NearTrusted(a) })
	key := testKey(t)
	var db atomic.Int64
	db.Store(1)
	load := func(context.Context) (item, error) {
		if v := db.Load(); v < 2 || !deleted {
			return item{ID: int(v), Name: "db"}, nil
		}
		return item{}, cacheguard.ErrNotFound
	}
	variant := cacheguard.Variant("v")
	var r cacheguard.Result
	for _, want := range []cacheguard.Result{cacheguard.Miss, cacheguard.NearHit} {
		if v, err := cacheguard.Get(ctx, a, key, load, variant, cacheguard.ReportTo(&r)); err != nil || v.ID != 1 || r != want {
			t.Fatalf("setup: %v, %v, %v; want version 1, %v", v, err, r, want)
		}
	}

	hold.hold() // A's subscriber reads nothing more; its near cache stays trusted
	cacheguard.TrustNear(a, time.Hour)
	db.Store(2)
	if err := b.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := cacheguard.Get(ctx, b, key, load); err != nil && !deleted {
		t.Fatalf("B: %v", err)
	}
	if v, err := cacheguard.Get(ctx, a, key, load, cacheguard.ReportTo(&r)); r != cacheguard.Hit || deleted != errors.Is(err, cacheguard.ErrNotFound) || !deleted && v.ID != 2 {
		t.Fatalf("A's plain Get: %v, %v, %v; want version 2 (or its absence) from Redis", v, err, r)
	}
	v, err := cacheguard.Get(ctx, a, key, load, variant, cacheguard.ReportTo(&r))
	if !cacheguard.NearTrusted(a) {
		t.Skip("A's subscription was given up while held (a host stalled for seconds): not the case under test")
	}
	if r == cacheguard.NearHit || v.ID == 1 {
		t.Fatalf("A's Variant Get after its plain Get returned version 2: version %d (%v), %v", v.ID, r, err)
	}
}

// holdReply is a go-redis hook that, once armed, holds the reply to the
// first HGET of a field ending in suffix after Redis ran it: the read's
// answer reaches its caller late.
type holdReply struct {
	suffix  string
	armed   atomic.Bool
	holding chan struct{} // closed when a reply is held
	release chan struct{}
}

func (h *holdReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.after(cmds...)
		return err
	}
}
func (h *holdReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(cmd)
		return err
	}
}

// after holds the caller of cmds when they read the field.
func (h *holdReply) after(cmds ...redis.Cmder) {
	for _, cmd := range cmds {
		args := cmd.Args()
		if cmd.Name() == "hget" && len(args) == 3 && strings.HasSuffix(argString(args[2]), h.suffix) && h.armed.CompareAndSwap(true, false) {
			close(h.holding)
			<-h.release
			return
		}
	}
}

// argString is a command argument as go-redis writes it.
func argString(a any) string {
	if p, ok := a.(*string); ok {
		return *p
	}
	return fmt.Sprint(a)
}

// Reads do not go backwards within a process when the key has no near
// entry yet: a read of one representation (R1, Variant "a") ran in Redis
// before another process deleted the row and invalidated the key, and its
// answer is delivered after a read of another representation (Variant "b")
// found the key's newer generation (the cached absence). R1's call may
// return its value (it began first), but the value must not enter the near
// cache: the next Get of Variant "a" returned it from there after the
// process had answered "not found" (the key's generation was recorded only
// on a node of the key, and it had none).
func TestNearCacheLateReadOfAnotherRepresentation(t *testing.T) {
	ctx := context.Background()
	hold, late := newHoldSub(), &holdReply{suffix: "|a", holding: make(chan struct{}), release: make(chan struct{})}
	rdbA := shared(t)
	rdbA.AddHook(hold)
	rdbA.AddHook(late)
	opts := []cacheguard.Option{cacheguard.NearCache(100, time.Hour), cacheguard.NegativeTTL(time.Minute)}
	a := cacheguard.New(rdbA, opts...)
	t.Cleanup(func() { a.Close() })
	t.Cleanup(hold.free) // first: Close waits for the subscription's reader
	t.Cleanup(func() {
		select {
		case <-late.release:
		default:
			close(late.release)
		}
	})
	b, _ := newGuard(t, opts...)
	eventually(t, 10*time.Second, "A's near cache to be trusted", func() bool { return cacheguard.NearTrusted(a) })
	key := testKey(t)
	var deleted atomic.Bool
	load := func(context.Context) (item, error) {
		if deleted.Load() {
			return item{}, cacheguard.ErrNotFound
		}
		return item{ID: 1, Name: "db"}, nil
	}
	va, vb := cacheguard.Variant("a"), cacheguard.Variant("b")
	if _, err := cacheguard.Get(ctx, b, key, load, va); err != nil { // version 1 of "a" in Redis
		t.Fatal(err)
	}

	hold.hold() // A's subscriber reads nothing more; its near cache stays trusted
	cacheguard.TrustNear(a, time.Hour)
	late.armed.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, load, va) // R1: version 1, answered late
		first <- err
	}()
	<-late.holding
	deleted.Store(true)
	if err := b.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := cacheguard.Get(ctx, b, key, load, vb); !errors.Is(err, cacheguard.ErrNotFound) { // the absence cached
		t.Fatalf("B: %v, want ErrNotFound", err)
	}
	if _, err := cacheguard.Get(ctx, a, key, load, vb); !errors.Is(err, cacheguard.ErrNotFound) {
		t.Fatalf("A's Get of Variant b: %v, want ErrNotFound", err)
	}
	close(late.release)
	if err := <-first; err != nil {
		t.Fatalf("R1's Get: %v", err)
	}
	var r cacheguard.Result
	v, err := cacheguard.Get(ctx, a, key, load, va, cacheguard.ReportTo(&r))
	if !cacheguard.NearTrusted(a) {
		t.Skip("A's subscription was given up while held (a host stalled for seconds): not the case under test")
	}
	if r == cacheguard.NearHit || err == nil {
		t.Fatalf("A's Get of Variant a after it answered \"not found\": %v (%v), %v; want ErrNotFound", v, r, err)
	}
}
