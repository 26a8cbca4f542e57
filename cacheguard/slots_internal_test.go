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
	if s.take(context.Background(), true) != true {
		t.Fatal("a free slot was not taken")
	}
	got := make(chan string, 3)
	wait := func(name string, ctx context.Context, background bool) {
		go func() {
			if s.take(ctx, background) {
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
