package rcmd

import (
	"testing"
	"time"
)

// TestStretchRelaxes: a stretched command timeout halves every Relax and
// never goes under the one the Runner was made with.
func TestStretchRelaxes(t *testing.T) {
	r := New(nil, 100*time.Millisecond)
	r.stretch.Store(int64(800 * time.Millisecond))
	r.stretchedAt.Store(int64(time.Hour))
	for _, c := range []struct{ at, want time.Duration }{
		{time.Hour, 800 * time.Millisecond},
		{time.Hour + Relax - 1, 800 * time.Millisecond},
		{time.Hour + Relax, 400 * time.Millisecond},
		{time.Hour + 2*Relax, 200 * time.Millisecond},
		{time.Hour + 3*Relax, 100 * time.Millisecond},
		{time.Hour + 1000*Relax, 100 * time.Millisecond},
	} {
		if got := r.timeoutAt(c.at); got != c.want {
			t.Errorf("at stretch + %v: %v, want %v", c.at-time.Hour, got, c.want)
		}
	}
}
