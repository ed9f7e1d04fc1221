package nix

import (
	"crypto/sha256"
	"fmt"
	"strings"
)

// sha256Nix32Len is the length of a nix32-encoded SHA-256 digest.
const sha256Nix32Len = 52

// FormatSHA256 renders a SHA-256 digest the way narinfo files and fingerprints spell it:
// "sha256:<nix32>".
func FormatSHA256(sum [sha256.Size]byte) string { return "sha256:" + EncodeBase32(sum[:]) }

// ParseSHA256 parses "sha256:<52 nix32 chars>". Nix accepts other spellings (hex, SRI) in some
// places, but it always writes this one, and the fingerprint must use exactly this one.
func ParseSHA256(s string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	rest, ok := strings.CutPrefix(s, "sha256:")
	if !ok {
		return sum, fmt.Errorf("parse hash %q: want sha256:<nix32>", s)
	}
	if len(rest) != sha256Nix32Len {
		return sum, fmt.Errorf("parse hash %q: want %d nix32 characters, got %d", s, sha256Nix32Len, len(rest))
	}
	b, err := DecodeBase32(rest)
	if err != nil {
		return sum, fmt.Errorf("parse hash %q: %w", s, err)
	}
	copy(sum[:], b)
	return sum, nil
}
