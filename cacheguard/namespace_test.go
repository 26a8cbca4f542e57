package cacheguard_test

import (
	"context"
	"hash/fnv"
	"strconv"
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

// tagSetID is the id a tag set has in the representation (cacheguard/tags.go:
// FNV-64a of each sorted name and a 0 byte, in base 36).
func tagSetID(tags ...string) string {
	h := fnv.New64a()
	for _, t := range tags { // sorted and unique here
		h.Write([]byte(t))
		h.Write([]byte{0})
	}
	return strconv.FormatUint(h.Sum64(), 36)
}

// A Variant whose name looks like a tag set's part of the representation
// ("#<id>", "a|#<id>") never shares an entry or a flight with the call that
// has those Tags: the Redis field, the lease and the flight were one, so each
// call reloaded the other's value (or got it). An ordinary Variant's field is
// named as before, so that existing entries are read.
func TestVariantNeverNamesATagSet(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t)
	tag := testKey(t, "tag")
	id := tagSetID(tag)
	for _, tc := range []struct {
		name            string
		variant, tagged []cacheguard.CallOption
	}{
		{"#id", []cacheguard.CallOption{cacheguard.Variant("#" + id)}, []cacheguard.CallOption{cacheguard.Tags(tag)}},
		{"a|#id", []cacheguard.CallOption{cacheguard.Variant("a|#" + id)}, []cacheguard.CallOption{cacheguard.Variant("a"), cacheguard.Tags(tag)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t)
			l := newGated("variant")
			errc := make(chan error, 1)
			go func() {
				_, err := cacheguard.Get(ctx, g, key, l.load, tc.variant...)
				errc <- err
			}()
			<-l.entered
			// While the variant's load is held, the tagged call loads on its
			// own (joining the variant's flight, it would wait for the
			// release: bounded here by a short budget).
			tagged := &counter{name: "tagged"}
			opts := append([]cacheguard.CallOption{cacheguard.WaitBudget(2 * time.Second)}, tc.tagged...)
			if v, err := cacheguard.Get(ctx, g, key, tagged.load, opts...); err != nil || v.Name != "tagged" {
				t.Errorf("tagged call while the variant loads: %v, %v; want its own load", v, err)
			}
			close(l.release)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			// Each is a hit of its own entry, alternately.
			for i := range 4 {
				opts, want := tc.variant, "variant"
				if i%2 == 1 {
					opts, want = tc.tagged, "tagged"
				}
				var res cacheguard.Result
				again := &counter{name: "again"}
				v, err := cacheguard.Get(ctx, g, key, again.load, append(opts, cacheguard.ReportTo(&res))...)
				if err != nil || v.Name != want || res != cacheguard.Hit {
					t.Errorf("call %d: %v, %v, %v; want a hit of %q", i, v, err, res, want)
				}
			}
		})
	}
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "v"}).load, cacheguard.Variant("GET example.com"), cacheguard.Tags(tag)); err != nil {
		t.Fatal(err)
	}
	if field := itemField + "|GET example.com|#" + id; !rdb.HExists(ctx, valueKey(key), field).Val() {
		t.Errorf("no field %q: an ordinary Variant's name changed", field)
	}
}
