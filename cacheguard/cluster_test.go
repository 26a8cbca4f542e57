package cacheguard_test

import (
	"context"
	"testing"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// On a Redis Cluster the scripts touch one slot per key (hash tags) and the
// wake-up is a shard channel (SPUBLISH): a waiter of another Guard still gets
// the holder's value pushed, and Invalidate spans slots.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t)
	ra, rb := cl.Client(), cl.Client()
	a := cacheguard.New(ra)
	defer a.Close()
	b := cacheguard.New(rb)
	defer b.Close()

	keys := []string{testKey(t, "one"), testKey(t, "two"), testKey(t, "three")}
	for _, key := range keys {
		holder := newGated("cluster")
		errc := make(chan error, 1)
		go func() {
			_, err := cacheguard.Get(ctx, a, key, holder.load)
			errc <- err
		}()
		<-holder.entered
		waiting := watchWaiting(rb)
		other := &counter{name: "other"}
		got := make(chan item, 1)
		var res cacheguard.Result
		go func() {
			v, _ := cacheguard.Get(ctx, b, key, other.load, cacheguard.ReportTo(&res))
			got <- v
		}()
		<-waiting
		close(holder.release)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if v := <-got; v.Name != "cluster" || res != cacheguard.Coalesced || other.n.Load() != 0 {
			t.Fatalf("%s: b got %v (%v), other loads %d; want the holder's value", key, v, res, other.n.Load())
		}
	}
	if err := a.Invalidate(ctx, keys...); err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		var res cacheguard.Result
		if v, err := cacheguard.Get(ctx, b, key, (&counter{name: "again"}).load, cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Miss || v.Name != "again" {
			t.Fatalf("%s survived Invalidate: %v, %v, %v", key, v, err, res)
		}
	}
}
