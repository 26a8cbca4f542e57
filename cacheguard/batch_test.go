package cacheguard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// roundTrips counts what a client sends to Redis: a pipeline is one round
// trip, as is a command; a new connection's set-up (HELLO, CLIENT SETINFO)
// is not counted.
type roundTrips struct{ n atomic.Int64 }

func setup(name string) bool { return name == "hello" || name == "client" }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !setup(cmd.Name()) {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && !setup(cmds[0].Name()) {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

// batchLoader loads items for keys, counting its calls and the keys it got.
type batchLoader struct {
	calls atomic.Int64
	keys  atomic.Int64
	skip  map[string]bool // keys that do not exist
	delay time.Duration
}

func (l *batchLoader) load(ctx context.Context, keys []string) (map[string]item, error) {
	l.calls.Add(1)
	l.keys.Add(int64(len(keys)))
	if l.delay > 0 {
		time.Sleep(l.delay) // stands for the database's work
	}
	out := map[string]item{}
	for i, k := range keys {
		if !l.skip[k] {
			out[k] = item{ID: i, Name: k}
		}
	}
	return out, nil
}

func batchKeys(t *testing.T, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = testKey(t, fmt.Sprint(i))
	}
	return keys
}

// A cold batch costs three round trips (read, leases, stores) and one loader
// call with every key; a warm one, one round trip and no load. Keys the
// loader leaves out are absent from the result, cached as absent.
func TestGetManyColdThenWarm(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	rt := &roundTrips{}
	rdb.AddHook(rt)
	g := cacheguard.New(rdb, cacheguard.EarlyRefresh(0))
	defer g.Close()
	// The server learns the scripts from the first calls (EVALSHA, then EVAL
	// once on NOSCRIPT): a batch of other keys first.
	if _, err := cacheguard.GetMany(ctx, g, batchKeys(t, 2), (&batchLoader{}).load); err != nil {
		t.Fatal(err)
	}
	keys := batchKeys(t, 100)
	rt.n.Store(0)
	l := &batchLoader{skip: map[string]bool{keys[7]: true}}
	got, err := cacheguard.GetMany(ctx, g, keys, l.load)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 99 || got[keys[3]].Name != keys[3] {
		t.Fatalf("cold batch: %d values", len(got))
	}
	if _, ok := got[keys[7]]; ok {
		t.Fatal("a key the loader left out is in the result")
	}
	if c, k := l.calls.Load(), l.keys.Load(); c != 1 || k != 100 {
		t.Fatalf("cold batch: %d loader calls for %d keys, want 1 for 100", c, k)
	}
	if n := rt.n.Load(); n > 3 {
		t.Fatalf("cold batch: %d round trips, want at most 3", n)
	}
	rt.n.Store(0)
	got, err = cacheguard.GetMany(ctx, g, keys, l.load)
	if err != nil || len(got) != 99 {
		t.Fatalf("warm batch: %d values, %v", len(got), err)
	}
	if c := l.calls.Load(); c != 1 {
		t.Fatalf("warm batch loaded (%d calls)", c)
	}
	if n := rt.n.Load(); n != 1 {
		t.Fatalf("warm batch: %d round trips, want 1", n)
	}
	// A single Get shares the batch's entries.
	var res cacheguard.Result
	if v, err := cacheguard.Get(ctx, g, keys[3], func(context.Context) (item, error) { return item{}, errors.New("loaded") }, cacheguard.ReportTo(&res)); err != nil || v.Name != keys[3] || res != cacheguard.Hit {
		t.Fatalf("Get of a batch key: %v, %v, %v", v, err, res)
	}
	if _, err := cacheguard.Get(ctx, g, keys[7], (&counter{}).load); !errors.Is(err, cacheguard.ErrNotFound) {
		t.Fatalf("Get of a key the batch found absent: %v, want ErrNotFound", err)
	}
}

// Batches of several processes (Guards with their own clients) over
// overlapping keys load each key once across all of them, each process with
// at most one loader call; the waiters get the values pushed.
func TestGetManyOneLoadPerKeyAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	keys := batchKeys(t, 40)
	l := &batchLoader{delay: 50 * time.Millisecond}
	const procs = 4
	var wg sync.WaitGroup
	errs := make([]error, procs)
	calls := make([]int64, procs)
	for p := range procs {
		g, _ := newGuard(t, cacheguard.EarlyRefresh(0))
		wg.Go(func() {
			mine := &batchLoader{delay: l.delay}
			part := keys[p*5 : p*5+25] // overlapping slices of the keys
			got, err := cacheguard.GetMany(ctx, g, part, func(ctx context.Context, ks []string) (map[string]item, error) {
				l.keys.Add(int64(len(ks)))
				return mine.load(ctx, ks)
			})
			if err == nil && len(got) != len(part) {
				err = fmt.Errorf("%d values for %d keys", len(got), len(part))
			}
			errs[p], calls[p] = err, mine.calls.Load()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n := l.keys.Load(); n != 40 {
		t.Fatalf("%d keys loaded across the processes, want each of the 40 once", n)
	}
	for p, c := range calls {
		if c > 1 {
			t.Fatalf("process %d called its loader %d times, want at most once", p, c)
		}
	}
}

// A failing load fails its keys (KeyErrors, matching the loader's error);
// the values found are returned beside it.
func TestGetManyPartialFailure(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	keys := batchKeys(t, 4)
	if _, err := cacheguard.GetMany(ctx, g, keys[:2], (&batchLoader{}).load); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("db down")
	got, err := cacheguard.GetMany(ctx, g, keys, func(context.Context, []string) (map[string]item, error) { return nil, boom })
	var ke cacheguard.KeyErrors
	if !errors.As(err, &ke) || !errors.Is(err, boom) || len(ke) != 2 || len(got) != 2 {
		t.Fatalf("GetMany = %d values, %v; want the 2 cached and KeyErrors for the other 2", len(got), err)
	}
}
