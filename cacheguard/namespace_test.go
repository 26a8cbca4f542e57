package cacheguard_test

import (
	"context"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// Two value types cached under one key never share a flight or an entry: a
// Get[string] that arrives while a Get[item] of the key loads runs its own
// load (it does not get the item's bytes to decode), and both values stay
// cached side by side.
func TestTypesNeverShareAFlightOrEntry(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	key := testKey(t)
	l := newGated("item")
	errc := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, g, key, l.load)
		errc <- err
	}()
	<-l.entered
	type answer struct {
		s   string
		err error
	}
	got := make(chan answer, 1)
	go func() {
		s, err := cacheguard.Get(ctx, g, key, func(context.Context) (string, error) { return "text", nil })
		got <- answer{s, err}
	}()
	// Once the Get[string] has missed (and joined a flight, its own or the
	// item's), the item's load may finish.
	eventually(t, 10*time.Second, "the Get[string] to miss", func() bool { return g.Stats().Misses == 2 })
	close(l.release)
	if a := <-got; a.err != nil || a.s != "text" {
		t.Fatalf("Get[string] while Get[item] loads: %q, %v; want its own load", a.s, a.err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var res cacheguard.Result
	if v, err := cacheguard.Get(ctx, g, key, l.load, cacheguard.ReportTo(&res)); err != nil || v.Name != "item" || res != cacheguard.Hit {
		t.Fatalf("Get[item]: %v, %v, %v; want a hit", v, err, res)
	}
	if s, err := cacheguard.Get(ctx, g, key, func(context.Context) (string, error) { return "again", nil }, cacheguard.ReportTo(&res)); err != nil || s != "text" || res != cacheguard.Hit {
		t.Fatalf("Get[string]: %q, %v, %v; want a hit", s, err, res)
	}
	if st := g.Stats(); st.DecodeErrors != 0 {
		t.Fatalf("%d decode errors", st.DecodeErrors)
	}
	// One name invalidates both.
	if err := g.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := cacheguard.Get(ctx, g, key, l.load, cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Miss {
		t.Fatalf("Get[item] after Invalidate: %v, %v; want a miss", err, res)
	}
	if _, err := cacheguard.Get(ctx, g, key, func(context.Context) (string, error) { return "new", nil }, cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Miss {
		t.Fatalf("Get[string] after Invalidate: %v, %v; want a miss", err, res)
	}
}

// Keys that would break the hash tag (a leading "}", braces anywhere) keep
// an entry's keys in one slot on a cluster: the value is cached, not loaded
// again and again through fail-open.
func TestClusterKeysWithBraces(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t)
	g := cacheguard.New(cl.Client())
	defer g.Close()
	for _, key := range []string{"}", "}x", "}}", "a}b", "{a}", "{}", "a{b", "~x", "{", "}repos:42"} {
		c := &counter{name: key}
		var res cacheguard.Result
		if v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res)); err != nil || v.Name != key || res != cacheguard.Miss {
			t.Fatalf("%q: first Get = %v, %v, %v", key, v, err, res)
		}
		if v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res)); err != nil || v.Name != key || res != cacheguard.Hit {
			t.Fatalf("%q: second Get = %v, %v, %v; want a hit", key, v, err, res)
		}
		if err := g.Invalidate(ctx, key); err != nil {
			t.Fatalf("%q: Invalidate: %v", key, err)
		}
		if _, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res)); err != nil || res != cacheguard.Miss {
			t.Fatalf("%q: Get after Invalidate = %v, %v; want a miss", key, err, res)
		}
	}
	if st := g.Stats(); st.FailOpenLoads != 0 || st.RedisErrors != 0 {
		t.Fatalf("stats %+v: keys failed open", st)
	}
}
