package nix

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestBase32KnownVectors(t *testing.T) {
	tests := []struct {
		in   []byte
		want string
	}{
		{[]byte{0}, "00"},
		{[]byte{1}, "01"},
		{[]byte{0xff}, "7z"},
		{[]byte{0x1f}, "0z"},
		{[]byte{0x20}, "10"},
		// printf x | sha256sum, converted by `nix hash to-base32`.
		{mustHex(t, "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"), "10a83a91g1r50bdw8g4hn47m7j7m6angpabwc80l9c16nx11cw9d"},
	}
	for _, tt := range tests {
		if got := EncodeBase32(tt.in); got != tt.want {
			t.Errorf("EncodeBase32(%x) = %q, want %q", tt.in, got, tt.want)
		}
		got, err := DecodeBase32(tt.want)
		if err != nil || !bytes.Equal(got, tt.in) {
			t.Errorf("DecodeBase32(%q) = %x, %v; want %x", tt.want, got, err, tt.in)
		}
	}
}

func mustHex(t *testing.T, s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBase32RoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 64; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		s := EncodeBase32(b)
		if len(s) != base32Len(n) {
			t.Fatalf("len(EncodeBase32(%d bytes)) = %d, want %d", n, len(s), base32Len(n))
		}
		got, err := DecodeBase32(s)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("round trip of %x: got %x, %v", b, got, err)
		}
	}
}

func TestBase32MatchesNix(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var hexes, want []string
	for i := 0; i < 5; i++ {
		var b [32]byte
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		hexes = append(hexes, hex.EncodeToString(b[:]))
		want = append(want, EncodeBase32(b[:]))
	}
	out := runNix(t, "nix", append([]string{"hash", "to-base32", "--type", "sha256"}, hexes...)...)
	if got := strings.Fields(out); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("nix hash to-base32 %v\n got %v\nwant %v", hexes, got, want)
	}
	for i, s := range want {
		sum, err := ParseSHA256("sha256:" + s)
		if err != nil || hex.EncodeToString(sum[:]) != hexes[i] {
			t.Fatalf("ParseSHA256(%q) = %x, %v; want %s", s, sum, err, hexes[i])
		}
	}
}

func TestDecodeBase32Rejects(t *testing.T) {
	for _, s := range []string{
		"",
		"0",   // 5 bits: no whole byte
		"000", // 15 bits: length of no byte count
		"0e",  // 'e' is not in the alphabet
		"80",  // 0x100 overflows one byte
		"10a83a91g1r50bdw8g4hn47m7j7m6angpabwc80l9c16nx11cw9D", // upper case
		"z0a83a91g1r50bdw8g4hn47m7j7m6angpabwc80l9c16nx11cw9d", // top bits overflow 256
	} {
		if b, err := DecodeBase32(s); err == nil {
			t.Errorf("DecodeBase32(%q) = %x, want error", s, b)
		}
	}
}

func TestParseStorePath(t *testing.T) {
	const h = "dwycdyjrq46n5jwam106ysjkclk3rvzv"
	long := strings.Repeat("a", MaxNameLen)
	tests := []struct {
		in      string
		name    string
		wantErr bool
	}{
		{in: "/nix/store/" + h + "-hello-2.12", name: "hello-2.12"},
		{in: "/nix/store/" + h + "-a+b-c._?=", name: "a+b-c._?="},
		{in: "/nix/store/" + h + "-A", name: "A"},
		{in: "/nix/store/" + h + "-" + long, name: long},
		{in: "/nix/store/" + h + "-" + long + "a", wantErr: true},
		{in: "/nix/store/" + h + "-", wantErr: true},
		{in: "/nix/store/" + h, wantErr: true},
		{in: "/nix/store/" + h + "-.hidden", wantErr: true},
		{in: "/nix/store/" + h + "-has space", wantErr: true},
		{in: "/nix/store/" + h + "-a/b", wantErr: true},
		{in: "/nix/store/" + h + "-ünicode", wantErr: true},
		{in: "/nix/store/" + strings.Replace(h, "d", "e", 1) + "-x", wantErr: true}, // 'e' not nix32
		{in: "/nix/store/" + h[1:] + "-x", wantErr: true},
		{in: "/nix/store/" + h + "x-x", wantErr: true},
		{in: "/gnu/store/" + h + "-x", wantErr: true},
		{in: "nix/store/" + h + "-x", wantErr: true},
		{in: "/nix/store//" + h + "-x", wantErr: true},
	}
	for _, tt := range tests {
		sp, err := ParseStorePath(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("ParseStorePath(%q) = %+v, want error", tt.in, sp)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseStorePath(%q): %v", tt.in, err)
			continue
		}
		if sp.Hash != h || sp.Name != tt.name || sp.String() != tt.in {
			t.Errorf("ParseStorePath(%q) = %+v (%s)", tt.in, sp, sp)
		}
		if b, err := ParseStorePathBase(sp.Base()); err != nil || b != sp {
			t.Errorf("ParseStorePathBase(%q) = %+v, %v", sp.Base(), b, err)
		}
	}
}

func TestValidHashPart(t *testing.T) {
	sum := sha256.Sum256([]byte("x"))
	for s, want := range map[string]bool{
		"dwycdyjrq46n5jwam106ysjkclk3rvzv":  true,
		"00000000000000000000000000000000":  true,
		EncodeBase32(sum[:20]):              true,
		"dwycdyjrq46n5jwam106ysjkclk3rvz":   false,
		"dwycdyjrq46n5jwam106ysjkclk3rvzvv": false,
		"ewycdyjrq46n5jwam106ysjkclk3rvzv":  false,
		"Dwycdyjrq46n5jwam106ysjkclk3rvzv":  false,
		"":                                  false,
	} {
		if got := ValidHashPart(s); got != want {
			t.Errorf("ValidHashPart(%q) = %v, want %v", s, got, want)
		}
	}
}
