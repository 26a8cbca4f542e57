package bench

import (
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
)

func TestIdealLoads(t *testing.T) {
	const s = int64(time.Second)
	for _, c := range []struct {
		name string
		keys []int32
		at   []int64
		want int
	}{
		{"none", nil, nil, 0},
		{"one window", []int32{1, 1, 1}, []int64{0, s / 2, s - 1}, 1},
		{"a request at the window's end needs a load", []int32{1, 1}, []int64{0, s}, 2},
		{"a window starts at the first request after the previous one", []int32{1, 1, 1, 1}, []int64{0, 1500 * s / 1000, 2 * s, 2600 * s / 1000}, 3},
		{"keys are counted apart, in any order", []int32{2, 1, 2, 1}, []int64{3 * s, 0, 0, s / 2}, 3},
	} {
		if got := idealLoads(c.keys, c.at, time.Second); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

func TestSchedule(t *testing.T) {
	// 100/s for 2s, no ramp: 200 requests 10ms apart.
	s := schedule(100, 0, 2*time.Second, 0)
	if len(s) != 200 || s[1]-s[0] != 10*time.Millisecond || s[199] != 1990*time.Millisecond {
		t.Errorf("no ramp: %d requests, first gap %v, last at %v", len(s), s[1]-s[0], s[len(s)-1])
	}
	// With a 1s ramp, half the full rate's requests are due by its end,
	// and the rate is full after it.
	s = schedule(100, time.Second, 2*time.Second, 0.5)
	n := 0
	for _, x := range s {
		if x < time.Second {
			n++
		}
	}
	if n < 49 || n > 51 || len(s) < 149 || len(s) > 151 {
		t.Errorf("1s ramp: %d requests in the ramp (want 50), %d in all (want 150)", n, len(s))
	}
	if g := s[len(s)-1] - s[len(s)-2]; g < 9*time.Millisecond || g > 11*time.Millisecond {
		t.Errorf("1s ramp: gap after the ramp %v, want 10ms", g)
	}
	for i := 1; i < len(s); i++ {
		if s[i] < s[i-1] {
			t.Fatalf("schedule goes back at %d: %v < %v", i, s[i], s[i-1])
		}
	}
}

func TestPeakIn(t *testing.T) {
	ms := int64(time.Millisecond)
	at := []int64{250 * ms, 0, 50 * ms, 99 * ms, 100 * ms, 180 * ms, 190 * ms}
	// [99ms, 199ms) holds 99, 100, 180 and 190.
	if got := peakIn(at, 100*time.Millisecond); got != 4 {
		t.Errorf("peak %d, want 4", got)
	}
}

func TestOverlapping(t *testing.T) {
	spans := []pgdb.Span{
		{Key: 1, Start: 0, End: 10},
		{Key: 1, Start: 5, End: 30},    // overlaps the first
		{Key: 1, Start: 20, End: 25},   // overlaps the second (which ends at 30)
		{Key: 1, Start: 30, End: 40},   // starts as the second ends: early (within 100 of it)
		{Key: 1, Start: 140, End: 150}, // 100 after the last end: on time
		{Key: 2, Start: 6, End: 8},     // another key
	}
	if ov, early := overlapping(spans, 100); ov != 2 || early != 1 {
		t.Errorf("overlapping %d, early %d; want 2 and 1", ov, early)
	}
}
