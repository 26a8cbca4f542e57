package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// heldLease holds the first get-or-lease script sent until its context ends
// (the command timeout), after telling held and waiting for proceed: a
// process too busy to send it in time, while Redis answers everything else.
type heldLease struct {
	held, proceed chan struct{}
	armed         atomic.Bool
}

func (h *heldLease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *heldLease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { return next(ctx, cmd) }
}
func (h *heldLease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if a := c.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == leaseScript.SHA() && h.armed.CompareAndSwap(true, false) {
				close(h.held)
				<-h.proceed
				<-ctx.Done()
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestLeaseTimeoutWhileRedisAnswers: a get-or-lease script that the command
// timeout ends while Redis answers the Guard's other commands is sent again
// (Redis did not stall: this process was too slow), so the miss loads once,
// under the lease, and stores the value — it does not fail open.
func TestLeaseTimeoutWhileRedisAnswers(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	g := New(rdb, CommandTimeout(300*time.Millisecond))
	t.Cleanup(func() { g.Close() })
	load := func(v string) func(context.Context) (string, error) {
		return func(context.Context) (string, error) { return v, nil }
	}
	if _, err := Get(ctx, g, "other", load("o")); err != nil {
		t.Fatal(err)
	}
	h := &heldLease{held: make(chan struct{}), proceed: make(chan struct{})}
	h.armed.Store(true)
	rdb.AddHook(h)
	done := make(chan error, 1)
	go func() {
		v, err := Get(ctx, g, "k", load("v"))
		if err == nil && v != "v" {
			err = errors.New("got " + v)
		}
		done <- err
	}()
	<-h.held
	var res Result
	if _, err := Get(ctx, g, "other", load("o"), ReportTo(&res)); err != nil || res != Hit {
		t.Fatalf("the other key: %v, %v; want a hit (Redis answers)", err, res)
	}
	close(h.proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := g.Stats(); st.FailOpenLoads != 0 || st.Loads != 2 {
		t.Fatalf("fail-open loads %d, loads %d; want 0 and 2 (each key's, under its lease)", st.FailOpenLoads, st.Loads)
	}
	if _, err := Get(ctx, g, "k", load("again"), ReportTo(&res)); err != nil || res != Hit {
		t.Fatalf("after the miss: %v, %v; want a hit (stored under the lease)", err, res)
	}
}

// renewalHook is a go-redis hook that calls itself before sending each
// pipeline that holds a lease renewal.
type renewalHook func()

func (h renewalHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h renewalHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h renewalHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if a := c.Args(); len(a) > 1 && a[0] == "evalsha" && a[1] == renewScript.SHA() {
				h()
				break
			}
		}
		return next(ctx, cmds)
	}
}

// heldRenewal holds every lease-renewal pipeline until release is closed,
// telling held of the first: a renewal whose answer is slow to come.
type heldRenewal struct {
	held, release chan struct{}
	once          atomic.Bool
}

func (h *heldRenewal) hook() renewalHook {
	return func() {
		if h.once.CompareAndSwap(false, true) {
			close(h.held)
		}
		<-h.release
	}
}

// TestStoreDoesNotWaitForRenewal: a load that ends while a renewal of its
// lease is on its way stores its value and serves its callers at once; the
// renewal's answer is not waited for (the store's compare-and-set does not
// need it). Before, the fill waited for the renewal's round trip, which on a
// starved host took hundreds of ms (a trace of the real-database mix: 18 of
// the 26 fills whose store was sent >20ms after the load ended).
func TestStoreDoesNotWaitForRenewal(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	h := &heldRenewal{held: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(h.hook())
	g := New(rdb, Lease(90*time.Millisecond))
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	t.Cleanup(func() { release(); g.Close() })
	got := make(chan error, 1)
	go func() {
		v, err := Get(ctx, g, "k", func(context.Context) (string, error) {
			<-h.held // a renewal is on its way, held
			return "v", nil
		})
		if err == nil && v != "v" {
			err = errors.New("got " + v)
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		release()
		<-got
		t.Fatal("the Get returned only once the renewal in flight was answered")
	}
	release()
	var res Result
	if v, err := Get(ctx, g, "k", func(context.Context) (string, error) { return "again", nil }, ReportTo(&res)); err != nil || v != "v" || res != Hit {
		t.Fatalf("after the fill: %v, %v, %v; want the stored value, a hit", v, err, res)
	}
}

// slowCodec is JSON whose Marshal tells marshalling, then waits for proceed:
// a value that takes long to encode (tens of MB under -race on a busy host).
type slowCodec struct {
	JSON
	marshalling, proceed chan struct{}
}

func (c slowCodec) Marshal(v any) ([]byte, error) {
	close(c.marshalling)
	<-c.proceed
	return c.JSON.Marshal(v)
}

// TestLeaseKeptWhileEncoding: the fill lease is renewed until the value is
// stored, not only while the loader runs, and the value's TTL counts from
// its store. Before, renewals stopped when the loader returned; a value
// whose encoding outlasted the rest of the lease (a slow codec; 33 MB under
// -race in CI) let a waiter in another process take the lease over and load
// the key a second time for one expiry. And a value whose encoding outlasted
// its TTL was stored already expired (fresh-until was stamped at the
// loader's end): the waiter found it so and loaded it again (found by
// TestGenCache: TTL 300 ms, a value 600 ms to encode).
func TestLeaseKeptWhileEncoding(t *testing.T) {
	for _, ttl := range []time.Duration{time.Minute, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("TTL %v", ttl), func(t *testing.T) { leaseKeptWhileEncoding(t, ttl, false) })
	}
}

// TestLeaseKeptWhileEncodingPastClose: a fill whose loader returned before
// its Guard closed goes on to store its value (Close waits for it), and its
// lease is renewed until that store answered, Close or not. Before, Close
// ended the renewals with the Guard's other tasks while the value was still
// encoding: the lease ran out, a waiter in another process took it over and
// loaded the key a second time for one expiry, and the first store failed
// (found by TestGenCache: a Shutdown step during a value 600 ms to encode).
func TestLeaseKeptWhileEncodingPastClose(t *testing.T) { leaseKeptWhileEncoding(t, time.Minute, true) }

// leaseKeptWhileEncoding fills a key on one Guard whose value takes longer
// than a lease to encode (closing that Guard meanwhile when closing), while a
// Guard on another client waits for it: the waiter must be served the
// first's value, with no load of its own.
func leaseKeptWhileEncoding(t *testing.T, ttl time.Duration, closing bool) {
	ctx := context.Background()
	const lease = time.Second // long enough for a -race run's GC pauses, short enough for the test
	s := redistest.Start(t)
	ra, rb := s.Client(), s.Client()
	var renewals atomic.Int64
	ra.AddHook(renewalHook(func() { renewals.Add(1) }))
	codec := slowCodec{marshalling: make(chan struct{}), proceed: make(chan struct{})}
	a := New(ra, Lease(lease), TTL(ttl), Jitter(0), Encoding(codec))
	b := New(rb, Lease(lease), TTL(ttl), Jitter(0))
	t.Cleanup(func() { a.Close(); b.Close() })
	key := "lease-kept-encoding:" + t.Name() + time.Now().Format("150405.000000000")

	filled := make(chan error, 1)
	go func() {
		_, err := Get(ctx, a, key, func(context.Context) (string, error) { return "from a", nil })
		filled <- err
	}()
	<-codec.marshalling
	closed := make(chan struct{})
	if closing {
		go func() { a.Close(); close(closed) }() // it waits for the fill
		redistest.Eventually(t, 10*time.Second, "a's Guard to close", func() bool { return a.root.Err() != nil })
	} else {
		close(closed)
	}
	var bLoads atomic.Int64
	got := make(chan string, 1)
	go func() {
		v, err := Get(ctx, b, key, func(context.Context) (string, error) { bLoads.Add(1); return "from b", nil })
		if err != nil {
			v = err.Error()
		}
		got <- v
	}()
	// Encoding goes on for longer than a lease (and than the shorter TTL),
	// past Close when closing: renewals go on (≥ 4 of them, one a third of a
	// lease) or, without them, b takes the lease over.
	from := renewals.Load()
	redistest.Eventually(t, 10*time.Second, "4 renewals while encoding, or a second load", func() bool {
		return renewals.Load()-from >= 4 || bLoads.Load() > 0
	})
	close(codec.proceed)
	if err := <-filled; err != nil {
		t.Fatal(err)
	}
	<-closed
	if v := <-got; v != "from a" || bLoads.Load() != 0 {
		t.Fatalf("the waiter got %q after %d loads of its own; want a's value, no second load", v, bLoads.Load())
	}
}
