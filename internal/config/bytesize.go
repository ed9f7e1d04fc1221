package config

import (
	"fmt"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ByteSize is a size in bytes, written in TOML as an integer number of bytes
// or as a string with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
// GiB, TiB (powers of 1024); the unit is case-insensitive and may follow a
// space: "4GB", "64 MiB", "512".
//
// Decimal numbers are accepted when they come to a whole number of bytes
// ("1.5GB" is 1500000000, "0.5KiB" is 512, "0.5B" is rejected); negative
// sizes are always rejected.
type ByteSize int64

const (
	sizeKB ByteSize = 1000
	sizeMB          = 1000 * sizeKB
	sizeGB          = 1000 * sizeMB
	sizeTB          = 1000 * sizeGB

	sizeKiB ByteSize = 1 << 10
	sizeMiB          = sizeKiB << 10
	sizeGiB          = sizeMiB << 10
	sizeTiB          = sizeGiB << 10
)

// sizeUnits is ordered largest first within each family, for String.
var sizeUnits = []struct {
	name string
	size ByteSize
}{
	{"TiB", sizeTiB}, {"GiB", sizeGiB}, {"MiB", sizeMiB}, {"KiB", sizeKiB},
	{"TB", sizeTB}, {"GB", sizeGB}, {"MB", sizeMB}, {"KB", sizeKB},
	{"B", 1},
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)

func parseByteSize(s string) (ByteSize, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("invalid size %q: must not be negative", s)
	}
	m := sizeRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("invalid size %q (want e.g. \"4GB\", \"64 MiB\" or \"512\")", s)
	}
	unit := ByteSize(1)
	if m[2] != "" {
		found := false
		for _, u := range sizeUnits {
			if strings.EqualFold(m[2], u.name) {
				unit, found = u.size, true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("invalid size %q: unknown unit %q (known: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)", s, m[2])
		}
	}
	// big.Rat keeps "1.5GB" exact; float64 would round.
	n, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	n.Mul(n, new(big.Rat).SetInt64(int64(unit)))
	if !n.IsInt() {
		return 0, fmt.Errorf("invalid size %q: not a whole number of bytes", s)
	}
	if !n.Num().IsInt64() {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return ByteSize(n.Num().Int64()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *ByteSize) UnmarshalText(text []byte) error {
	v, err := parseByteSize(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// UnmarshalTOML implements toml.Unmarshaler, so that a TOML integer is taken
// as bytes and other types get a clear message.
func (b *ByteSize) UnmarshalTOML(v any) error {
	switch v := v.(type) {
	case int64:
		if v < 0 {
			return fmt.Errorf("invalid size %d: must not be negative", v)
		}
		*b = ByteSize(v)
		return nil
	case string:
		return b.UnmarshalText([]byte(v))
	}
	return fmt.Errorf("expected an integer or a size string such as \"4GB\", got %s", describe(v))
}

// MarshalText implements encoding.TextMarshaler; the output parses back.
func (b ByteSize) MarshalText() ([]byte, error) {
	return []byte(b.String()), nil
}

// String prints the size exactly, in the unit that gives the smallest number:
// "4GB", "64MiB", "1234B".
func (b ByteSize) String() string {
	if b <= 0 {
		return strconv.FormatInt(int64(b), 10) + "B"
	}
	best, bestN := "B", b
	for _, u := range sizeUnits {
		if b%u.size == 0 && b/u.size < bestN {
			best, bestN = u.name, b/u.size
		}
	}
	return strconv.FormatInt(int64(bestN), 10) + best
}

// describe names a decoded TOML value's type, and the value when it is
// scalar, for "expected X, got Y" messages.
func describe(v any) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("string %q", v)
	case int64:
		return fmt.Sprintf("integer %d", v)
	case float64:
		return "float " + strconv.FormatFloat(v, 'g', -1, 64)
	case bool:
		return fmt.Sprintf("boolean %t", v)
	case time.Time:
		return "datetime " + v.Format(time.RFC3339Nano)
	case map[string]any:
		return "table"
	case []map[string]any:
		return "array of tables"
	case []any:
		return "array"
	}
	return fmt.Sprintf("%T", v)
}
