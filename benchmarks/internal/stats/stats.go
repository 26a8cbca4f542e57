// Package stats summarises benchmark samples: quantiles of one run and the
// median with min–max over repetitions.
package stats

import (
	"math"
	"slices"
	"time"
)

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of xs by the nearest-rank
// method; xs need not be sorted. It returns 0 for no samples.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return quantileSorted(s, q)
}

func quantileSorted(s []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// Dist is the distribution of one run's latencies.
type Dist struct {
	N             int
	P50, P99, Max time.Duration
}

// Durations summarises latencies.
func Durations(ds []time.Duration) Dist { return SortDurations(slices.Clone(ds)) }

// SortDurations is Durations sorting ds in place.
func SortDurations(s []time.Duration) Dist {
	if len(s) == 0 {
		return Dist{}
	}
	slices.Sort(s)
	at := func(q float64) time.Duration {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Dist{N: len(s), P50: at(0.50), P99: at(0.99), Max: s[len(s)-1]}
}

// Summary is a value measured once per repetition: its median, min and max.
type Summary struct {
	Median, Min, Max float64
	N                int
}

// Summarise returns the median, min and max of one value over repetitions.
func Summarise(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Summary{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// Ms converts a duration to float milliseconds.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
