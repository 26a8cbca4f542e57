package cacheguard

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// loadSlots: a freed slot goes to the first waiting load callers wait for,
// then to the first background one; a wait that ends leaves the queue and
// takes no slot; a slot nobody waits for is free again.
func TestLoadSlotsQueue(t *testing.T) {
	s := newLoadSlots(1)
	if held, ok, _ := s.take(context.Background(), true, nil); !held || !ok {
		t.Fatal("a free slot was not taken")
	}
	got := make(chan string, 3)
	wait := func(name string, ctx context.Context, background bool) {
		go func() {
			if _, ok, _ := s.take(ctx, background, nil); ok {
				got <- name
			} else {
				got <- name + " gave up"
			}
		}()
	}
	waiting := func(n int) {
		redistest.Eventually(t, 5*time.Second, fmt.Sprintf("%d loads wait", n), func() bool { return s.waiting() == n })
	}
	wait("background", context.Background(), true)
	waiting(1)
	ctx, cancel := context.WithCancel(context.Background())
	wait("cancelled", ctx, false)
	waiting(2)
	wait("waited for", context.Background(), false)
	waiting(3)
	cancel()
	if g := <-got; g != "cancelled gave up" {
		t.Fatalf("first to return: %q, want the cancelled wait", g)
	}
	waiting(2)
	for _, want := range []string{"waited for", "background"} {
		s.give()
		if g := <-got; g != want {
			t.Fatalf("slot went to %q, want %q", g, want)
		}
	}
	s.give()
	if s.free != 1 || s.waiting() != 0 {
		t.Fatalf("free %d, waiting %d after the last load: want 1, 0", s.free, s.waiting())
	}
	if (*loadSlots)(nil).waiting() != 0 {
		t.Fatal("no bound: loads wait")
	}
}

// A load whose flight a loader's Get joined (promote) runs without a slot:
// promoted while it waits, it leaves the queue; promoted before it asks, it
// does not queue. Neither takes or frees a slot.
func TestLoadSlotsPromote(t *testing.T) {
	s := newLoadSlots(1)
	if held, ok, _ := s.take(context.Background(), false, nil); !held || !ok {
		t.Fatal("a free slot was not taken")
	}
	mk := func() *flight { return &flight{t: &task[entry, *outcome]{}} }
	a, b, other := mk(), mk(), mk()
	type res struct{ held, ok bool }
	got := make(chan res, 1)
	go func() {
		held, ok, _ := s.take(context.Background(), true, []*flight{other, a})
		got <- res{held, ok}
	}()
	redistest.Eventually(t, 5*time.Second, "the load waits", func() bool { return s.waiting() == 1 })
	s.promote(a.t)
	if r := <-got; r.held || !r.ok {
		t.Fatalf("promoted while waiting: held %v, ok %v; want false, true", r.held, r.ok)
	}
	s.promote(b.t)
	if held, ok, _ := s.take(context.Background(), false, []*flight{b}); held || !ok {
		t.Fatalf("promoted before it asked: held %v, ok %v; want false, true", held, ok)
	}
	if s.waiting() != 0 || s.free != 0 {
		t.Fatalf("waiting %d, free %d: want 0, 0 (the first load still holds the slot)", s.waiting(), s.free)
	}
	s.give()
	if s.free != 1 {
		t.Fatalf("free %d after the slot's holder ended, want 1", s.free)
	}
	(*loadSlots)(nil).promote(a.t) // no bound: nothing to do
}
