package bench

import (
	"slices"
	"time"
)

// Stat summarises durations in milliseconds.
type Stat struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	Mean float64 `json:"mean"`
}

// Summarize is the Stat of ms, the zero Stat for none.
func Summarize(ms []float64) Stat {
	if len(ms) == 0 {
		return Stat{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	return Stat{N: len(s), P50: Quantile(s, 0.5), P90: Quantile(s, 0.9), Mean: sum / float64(len(s))}
}

// Quantile of sorted s, interpolated.
func Quantile(s []float64, q float64) float64 {
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

// PercentileMs is the p-th percentile (0-100, nearest rank below) of ds in milliseconds.
func PercentileMs(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return Ms(s[i])
}

// Ms is d in milliseconds, to the microsecond.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// MinOf is the least of xs, 0 for none.
func MinOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Min(xs)
}

// PerSecond is n ÷ seconds, 0 when no time passed.
func PerSecond(n, seconds float64) float64 {
	if seconds <= 0 {
		return 0
	}
	return n / seconds
}
