package stats

import (
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, c := range []struct{ q, want float64 }{{0, 1}, {0.5, 5}, {0.99, 10}, {1, 10}, {0.1, 1}, {0.11, 2}} {
		if got := Quantile(xs, c.q); got != c.want {
			t.Errorf("Quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("Quantile of no samples is not 0")
	}
}

func TestDurations(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	d := Durations(ds)
	if d.N != 100 || d.P50 != 50*time.Millisecond || d.P99 != 99*time.Millisecond || d.Max != 100*time.Millisecond {
		t.Errorf("Durations = %+v", d)
	}
}

func TestSummarise(t *testing.T) {
	s := Summarise([]float64{3, 1, 2, 10})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 10 || s.N != 4 {
		t.Errorf("Summarise = %+v", s)
	}
	if s := Summarise([]float64{7, 1, 3}); s.Median != 3 {
		t.Errorf("odd median = %v, want 3", s.Median)
	}
}
