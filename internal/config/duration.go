package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Duration is a time.Duration written in TOML as a Go duration string ("30s",
// "1h30m") or as a whole number of days ("7d"), which Go's syntax lacks but
// retention-style settings want. Negative values parse; Validate rejects them
// where a field must be positive.
type Duration struct{ time.Duration }

// maxDays keeps N*24h within int64 nanoseconds.
const maxDays = int64(1<<63-1) / int64(24*time.Hour)

// ParseDuration parses a duration as the configuration writes it ("30s", "1h30m", "7d").
func ParseDuration(s string) (time.Duration, error) {
	d, err := parseDuration(s)
	return d.Duration, err
}

func parseDuration(s string) (Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n > maxDays || n < -maxDays {
			return Duration{}, fmt.Errorf("invalid duration %q (days must be a whole number, e.g. \"7d\")", s)
		}
		return Duration{time.Duration(n) * 24 * time.Hour}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return Duration{}, fmt.Errorf("invalid duration %q (want e.g. \"30s\", \"1h30m\" or \"7d\")", s)
	}
	return Duration{d}, nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := parseDuration(string(text))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// UnmarshalTOML implements toml.Unmarshaler. It takes precedence over
// UnmarshalText so that a bare TOML integer gets a clear message instead of
// being stringified and failing as a unitless duration.
func (d *Duration) UnmarshalTOML(v any) error {
	s, ok := v.(string)
	if !ok {
		return fmt.Errorf("expected a duration string such as \"30s\", got %s", describe(v))
	}
	return d.UnmarshalText([]byte(s))
}

// MarshalText implements encoding.TextMarshaler; the output parses back.
func (d Duration) MarshalText() ([]byte, error) {
	return []byte(d.String()), nil
}

// String is time.Duration's form without zero trailing units: "4h", not "4h0m0s".
func (d Duration) String() string {
	s := d.Duration.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
