package reliability

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/locks"
)

// The fuzz targets run their seeds in every `go test` (on the server TestMain
// started); run one longer with e.g.
// go test -run '^$' -fuzz FuzzReliabilityEnvelope -fuzztime 30s ./internal/reliability

// fuzzClient returns a client of the server TestMain started, closed when
// the input is done.
func fuzzClient(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// envelope builds a version-1 envelope with a JSON string payload, as
// cacheguard stores it.
func envelope(fresh time.Time, payload string) []byte {
	b := make([]byte, 24, 24+len(payload))
	b[0], b[1], b[2] = 'c', 'g', 1
	binary.BigEndian.PutUint64(b[4:], uint64(fresh.UnixMilli()))
	binary.BigEndian.PutUint64(b[12:], uint64(fresh.UnixMilli()))
	return append(b, payload...)
}

// FuzzReliabilityEnvelope stores arbitrary bytes as a cached entry and reads
// it with Get: the call never panics or hangs, and returns either the
// loader's value or, when the bytes happen to be a valid fresh envelope, its
// payload — never an error, never garbage.
func FuzzReliabilityEnvelope(f *testing.F) {
	later := time.Now().Add(time.Hour)
	for _, seed := range [][]byte{
		nil, []byte("cg"), []byte(`{"a":1}`), envelope(later, `"cached"`), envelope(later, `not json`),
		envelope(later, ""), envelope(time.Now().Add(-time.Hour), `"expired"`),
		append([]byte("cg\x01\x01"), make([]byte, 20)...), append([]byte("cg\x01\xff"), make([]byte, 30)...),
		append([]byte("cg\x09\x00"), make([]byte, 30)...),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rdb := fuzzClient(t)
		g := cacheguard.New(rdb, cacheguard.Prefix("fz:"), cacheguard.EarlyRefresh(0))
		defer g.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rdb.HSet(ctx, "fz:v:{envelope}", "string", b).Err(); err != nil {
			t.Fatal(err)
		}
		v, err := cacheguard.Get(ctx, g, "envelope", func(context.Context) (string, error) { return "loaded", nil },
			cacheguard.ReportTo(new(cacheguard.Result)), cacheguard.NegativeTTL(0))
		_ = v
		if err != nil && !errors.Is(err, cacheguard.ErrNotFound) {
			t.Fatalf("Get over %q: %v", b, err)
		}
		valid := len(b) >= 24 && b[0] == 'c' && b[1] == 'g' && b[2] == 1
		if v != "loaded" && !valid {
			t.Fatalf("Get over %q returned %q, neither the loader's value nor a valid envelope's", b, v)
		}
	})
}

// FuzzReliabilityLockName takes and releases a lock with an arbitrary name:
// an empty or oversize name is ErrInvalid; any other name (braces, spaces,
// binary) works as a lock: granted, exclusive, released.
func FuzzReliabilityLockName(f *testing.F) {
	for _, s := range []string{"", "a", "{", "}", "{}", "a}b{c", "repo:42", "with space", "\x00\xff", "|", strings.Repeat("x", locks.MaxNameLen), strings.Repeat("x", locks.MaxNameLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		rdb := fuzzClient(t)
		c := locks.New(rdb, locks.Prefix("fzl:"))
		defer c.Close()
		other := locks.New(rdb, locks.Prefix("fzl:"))
		defer other.Close()
		ctx := context.Background()
		lk, err := c.TryLock(ctx, name)
		if name == "" || len(name) > locks.MaxNameLen {
			if !errors.Is(err, locks.ErrInvalid) {
				t.Fatalf("TryLock(%q): %v, want ErrInvalid", name, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("TryLock(%q): %v", name, err)
		}
		if _, err := other.TryLock(ctx, name); !errors.Is(err, locks.ErrNotObtained) {
			t.Fatalf("second TryLock(%q): %v, want ErrNotObtained", name, err)
		}
		if lk.Fence() == 0 {
			t.Fatalf("TryLock(%q): zero fence", name)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock(%q): %v", name, err)
		}
		lk2, err := other.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("TryLock(%q) after Unlock: %v", name, err)
		}
		if lk2.Fence() <= lk.Fence() {
			t.Fatalf("fence %d after %d", lk2.Fence(), lk.Fence())
		}
		lk2.Unlock(ctx)
	})
}

// FuzzReliabilityLockOptions checks option validation against its documented
// rules: with arbitrary lease, wait, replica, retention, drift and node-timeout
// values, TryLock (under an already cancelled context, so a valid call stops
// before Redis) is ErrInvalid exactly when a per-call rule is broken, New and
// NewRedlock panic exactly when a rule of theirs is, and nothing is sent.
func FuzzReliabilityLockOptions(f *testing.F) {
	f.Add(int64(10000), int64(30000), 0, int64(0), int64(7*24*3600*1000), int64(2), int64(0))
	f.Add(int64(29), int64(0), 0, int64(0), int64(1000), int64(0), int64(0))
	f.Add(int64(30), int64(-1), 1, int64(0), int64(30), int64(-1), int64(-5))
	f.Add(int64(1000), int64(5), -1, int64(100), int64(999), int64(0), int64(10))
	f.Fuzz(func(t *testing.T, leaseMs, waitMs int64, replicas int, replicaMs, retentionMs, driftMs, nodeMs int64) {
		ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
		lease, wait, rt, ret, drift, node := ms(leaseMs), ms(waitMs), ms(replicaMs), ms(retentionMs), ms(driftMs), ms(nodeMs)
		badLease := lease < locks.MinLease
		callInvalid := badLease || wait < 0 || replicas < 0 || (replicas > 0 && rt <= 0)
		clientInvalid := badLease || ret < 0 || (ret != 0 && ret < lease)
		redlockInvalid := badLease || drift < 0 || node < 0 || lease-(lease/100+drift) <= 0
		w := tripwire(t)
		c := locks.New(w.rdb)
		defer c.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := c.TryLock(ctx, "opts", locks.Lease(lease), locks.WaitBudget(wait), locks.Replicas(replicas, rt))
		if got := errors.Is(err, locks.ErrInvalid); got != callInvalid {
			t.Fatalf("lease %v wait %v replicas %d/%v: %v (ErrInvalid %v, want %v)", lease, wait, replicas, rt, err, got, callInvalid)
		}
		if !callInvalid && !errors.Is(err, context.Canceled) {
			t.Fatalf("valid options under a cancelled context: %v, want context.Canceled", err)
		}
		if got := panics(func() { locks.New(w.rdb, locks.Lease(lease), locks.FenceRetention(ret)).Close() }); got != clientInvalid {
			t.Fatalf("New with lease %v retention %v: panicked %v, want %v", lease, ret, got, clientInvalid)
		}
		rlOpts := []locks.Option{locks.Lease(lease), locks.Drift(drift), locks.NodeTimeout(node)}
		if got := panics(func() { locks.NewRedlock([]redis.UniversalClient{w.rdb}, rlOpts...).Close() }); got != redlockInvalid {
			t.Fatalf("NewRedlock with lease %v drift %v node timeout %v: panicked %v, want %v", lease, drift, node, got, redlockInvalid)
		}
		if n := w.dials(); n != 0 {
			t.Fatalf("%d connections made", n)
		}
	})
}

// panics reports whether f panics.
func panics(f func()) (did bool) {
	defer func() { did = recover() != nil }()
	f()
	return false
}

// FuzzReliabilityCacheKey reads and invalidates an arbitrary key: an empty
// or oversize key is ErrInvalid; any other key loads once, then hits, then
// is invalidated.
func FuzzReliabilityCacheKey(f *testing.F) {
	for _, s := range []string{"", "k", "{", "}", "a}b", "user:1", "\x00", strings.Repeat("k", cacheguard.MaxKeyLen), strings.Repeat("k", cacheguard.MaxKeyLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		rdb := fuzzClient(t)
		g := cacheguard.New(rdb, cacheguard.Prefix("fzk:"), cacheguard.EarlyRefresh(0))
		defer g.Close()
		ctx := context.Background()
		loads := 0
		// The value is the key in hex: the JSON codec replaces invalid UTF-8,
		// so a raw key as the value would come back changed from a hit.
		want := fmt.Sprintf("v:%x", key)
		load := func(context.Context) (string, error) { loads++; return want, nil }
		bad := key == "" || len(key) > cacheguard.MaxKeyLen
		if err := g.Invalidate(ctx, key); errors.Is(err, cacheguard.ErrInvalid) != bad || (!bad && err != nil) {
			t.Fatalf("Invalidate(%q): %v", key, err)
		}
		for range 2 {
			v, err := cacheguard.Get(ctx, g, key, load)
			if bad {
				if !errors.Is(err, cacheguard.ErrInvalid) {
					t.Fatalf("Get(%q): %v, want ErrInvalid", key, err)
				}
				return
			}
			if err != nil || v != want {
				t.Fatalf("Get(%q) = %q, %v", key, v, err)
			}
		}
		if loads != 1 {
			t.Fatalf("Get(%q) twice loaded %d times, want 1", key, loads)
		}
	})
}

// trip is a listener that counts the connections made to it and serves none.
type trip struct {
	rdb *redis.Client
	mu  sync.Mutex // guards n
	n   int
}

func (w *trip) dials() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

// tripwire returns a client whose every dial is counted and refused.
func tripwire(t *testing.T) *trip {
	t.Helper()
	w := &trip{}
	w.rdb = redis.NewClient(&redis.Options{Addr: "tripwire:0", MaxRetries: -1,
		Dialer: func(context.Context, string, string) (net.Conn, error) {
			w.mu.Lock()
			w.n++
			w.mu.Unlock()
			return nil, errors.New("tripwire: no connection expected")
		}})
	t.Cleanup(func() { w.rdb.Close() })
	return w
}
