package bench

import (
	"time"
)

// Positive is v, or def when v is zero or negative: a benchmark option left unset (or set
// nonsensically) takes its default.
func Positive[T int | int32 | int64 | float64](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Seed is s, or the clock's nanoseconds when s is 0: each run gets fresh data unless the user
// fixes a seed to repeat one.
func Seed(s uint64) uint64 {
	if s == 0 {
		return uint64(time.Now().UnixNano())
	}
	return s
}
