package nix

import (
	"errors"
	"fmt"
	"strings"
)

// StoreDir is the only store directory supported: binary caches and signatures name full paths,
// so a different prefix would make every fingerprint differ from the one Nix checks.
const StoreDir = "/nix/store"

const (
	// HashPartLen is the length of the nix32 hash part of a store path (160 bits).
	HashPartLen = 32
	// MaxNameLen is the longest name Nix accepts after the hash part.
	MaxNameLen = 211
	// base32Chars omits e, o, u and t so that hashes never spell words.
	base32Chars = "0123456789abcdfghijklmnpqrsvwxyz"
)

// StorePath is a parsed /nix/store/<hash>-<name> path.
type StorePath struct {
	Hash string // 32 nix32 characters
	Name string
}

// String returns the full path.
func (p StorePath) String() string { return StoreDir + "/" + p.Base() }

// Base returns "<hash>-<name>", the form used in narinfo References and Deriver.
func (p StorePath) Base() string { return p.Hash + "-" + p.Name }

// ParseStorePath parses and validates a full store path such as
// /nix/store/dwycdyjrq46n5jwam106ysjkclk3rvzv-hello. Paths inside a store path
// (…-hello/bin/hello) are rejected.
func ParseStorePath(p string) (StorePath, error) {
	base, ok := strings.CutPrefix(p, StoreDir+"/")
	if !ok {
		return StorePath{}, fmt.Errorf("parse store path %q: not in %s", p, StoreDir)
	}
	sp, err := parseBase(base)
	if err != nil {
		return StorePath{}, fmt.Errorf("parse store path %q: %w", p, err)
	}
	return sp, nil
}

// ParseStorePathBase parses the "<hash>-<name>" form (a store path without its directory).
func ParseStorePathBase(base string) (StorePath, error) {
	sp, err := parseBase(base)
	if err != nil {
		return StorePath{}, fmt.Errorf("parse store path %q: %w", base, err)
	}
	return sp, nil
}

func parseBase(base string) (StorePath, error) {
	if len(base) < HashPartLen+2 || base[HashPartLen] != '-' {
		return StorePath{}, errors.New("want <32-char hash>-<name>")
	}
	hash, name := base[:HashPartLen], base[HashPartLen+1:]
	if !ValidHashPart(hash) {
		return StorePath{}, fmt.Errorf("invalid hash part %q", hash)
	}
	if err := checkName(name); err != nil {
		return StorePath{}, err
	}
	return StorePath{Hash: hash, Name: name}, nil
}

// checkName applies Nix's store path name rules.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("name longer than %d characters", MaxNameLen)
	case name[0] == '.':
		return errors.New("name starts with '.'")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("+-._?=", c) >= 0) {
			return fmt.Errorf("invalid character %q in name", c)
		}
	}
	return nil
}

// ValidHashPart reports whether s is a well-formed store path hash part: 32 nix32 characters
// that decode to exactly 160 bits.
func ValidHashPart(s string) bool {
	if len(s) != HashPartLen {
		return false
	}
	_, err := DecodeBase32(s)
	return err == nil
}

// base32Len is the number of nix32 characters for n bytes.
func base32Len(n int) int { return (n*8-1)/5 + 1 }

// EncodeBase32 encodes b in Nix's base32. Unlike RFC 4648, Nix emits the last 5-bit group of
// the little-endian bit string first, so the result cannot be produced with encoding/base32.
func EncodeBase32(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	n := base32Len(len(b))
	out := make([]byte, 0, n)
	for k := n - 1; k >= 0; k-- {
		bit := k * 5
		i, j := bit/8, uint(bit%8)
		c := b[i] >> j
		if i+1 < len(b) {
			c |= b[i+1] << (8 - j)
		}
		out = append(out, base32Chars[c&0x1f])
	}
	return string(out)
}

// DecodeBase32 decodes Nix's base32. The byte length is implied by the string length; strings
// whose length matches no byte length, or whose top bits overflow it, are rejected so that each
// value has exactly one encoding.
func DecodeBase32(s string) ([]byte, error) {
	size := len(s) * 5 / 8
	if size == 0 || base32Len(size) != len(s) {
		return nil, fmt.Errorf("decode nix32: invalid length %d", len(s))
	}
	out := make([]byte, size)
	for k := 0; k < len(s); k++ {
		c := s[len(s)-1-k]
		d := strings.IndexByte(base32Chars, c)
		if d < 0 {
			return nil, fmt.Errorf("decode nix32: invalid character %q", c)
		}
		bit := k * 5
		i, j := bit/8, uint(bit%8)
		out[i] |= byte(d << j)
		carry := byte(d >> (8 - j))
		if i+1 < size {
			out[i+1] |= carry
		} else if carry != 0 {
			return nil, errors.New("decode nix32: excess bits")
		}
	}
	return out, nil
}
