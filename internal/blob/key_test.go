package blob_test

import (
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
)

const (
	h32 = "0123456789abcdfghijklmnpqrsvwxyz"
	h52 = "0123456789abcdfghijklmnpqrsvwxyz0123456789abcdfghijk"
)

func TestValidKey(t *testing.T) {
	for _, k := range []string{
		"nix-cache-info",
		h32 + ".narinfo",
		h32 + ".ls",
		"nar/" + h52 + ".nar.zst",
		"nar/" + h52 + ".nar",
		"log/" + h32 + "-hello-2.12.1.drv",
		"log/" + h32 + "-a+b_c?d=e.drv",
		"log/" + h32 + "-hello-2.12.1.drv.1",
		"log/" + h32 + "-hello.drv.123456789",
		"realisations/" + h32 + "!out.doi",
		"realisations/" + h32 + "!dev.doi",
	} {
		if err := blob.ValidKey(k); err != nil {
			t.Errorf("ValidKey(%q) = %v, want nil", k, err)
		}
	}
	for _, c := range []struct{ key, why string }{
		{"", "empty key"},
		{"../x", "path segment"},
		{"/abs", "absolute path"},
		{"/" + h32 + ".narinfo", "absolute path"},
		{"nar/../../etc/passwd", "path segment"},
		{"nar/./" + h52 + ".nar.zst", "path segment"},
		{"nar/" + h32 + ".nar.zst", "not 52 nix32"},
		{"nar/" + h52 + "0.nar.zst", "not 52 nix32"},
		{"nar/" + h52 + ".nar.xz", "nar/<filehash>.nar.zst"},
		{"nar/" + strings.Replace(h52, "0", "e", 1) + ".nar.zst", "not 52 nix32"}, // 'e' is not nix32
		{"nar/sub/" + h52 + ".nar.zst", "too many path segments"},
		{"log/notadrv", "log/<hash>-<name>.drv"},
		{"log/" + h32 + ".drv", "log/<hash>-<name>.drv"},
		{"log/" + h32 + "-.drv", "name"},
		{"log/" + h32 + "-.hidden.drv", "starts with '.'"},
		{"log/" + h32 + "-a b.drv", "name contains"},
		{"log/" + h32 + "-" + strings.Repeat("a", 208) + ".drv", "over 211"},
		{"log/" + strings.ToUpper(h32) + "-x.drv", "not 32 nix32"},
		{"log/" + h32 + "-x.drv.0", "log/<hash>-<name>.drv"},
		{"log/" + h32 + "-x.drv.01", "log/<hash>-<name>.drv"},
		{"log/" + h32 + "-x.drv.1.2", "log/<hash>-<name>.drv"},
		{"log/" + h32 + "-x.drv.-1", "log/<hash>-<name>.drv"},
		{"log/" + h32 + "-x.drv.1234567890", "log/<hash>-<name>.drv"},
		{"a//b", "empty path segment"},
		{"nar//" + h52 + ".nar.zst", "empty path segment"},
		{"nar/", "empty path segment"},
		{"x/" + h32 + ".narinfo", "unknown prefix"},
		{"tmp/foo", "unknown prefix"},
		{h32 + ".narinfo.tmp", "not nix-cache-info"},
		{h32[:31] + ".narinfo", "not 32 nix32"},
		{"nix-cache-info/x", "unknown prefix"},
		{"realisations/" + h32 + ".doi", "realisations/<hash>!<out>.doi"},
		{"realisations/" + h32 + "!.doi", "output name"},
		{"realisations/" + h32 + "!out", "realisations/<hash>!<out>.doi"},
		{"nar\\" + h52 + ".nar.zst", "backslash"},
	} {
		err := blob.ValidKey(c.key)
		if err == nil {
			t.Errorf("ValidKey(%q) = nil, want an error about %q", c.key, c.why)
			continue
		}
		if !strings.Contains(err.Error(), c.why) {
			t.Errorf("ValidKey(%q) = %q, want it to mention %q", c.key, err, c.why)
		}
	}
}

func TestIsNAR(t *testing.T) {
	for _, c := range []struct {
		key  string
		want bool
	}{
		{"nar/" + h52 + ".nar.zst", true},
		{h32 + ".narinfo", false},
		{h32 + ".ls", false},
		{"log/" + h32 + "-nar.drv", false},
		{"realisations/" + h32 + "!nar.doi", false},
		{"nix-cache-info", false},
	} {
		if got := blob.IsNAR(c.key); got != c.want {
			t.Errorf("IsNAR(%q) = %v, want %v", c.key, got, c.want)
		}
	}
}

// A log's blob key is served by the cache under /log/: each segment escaped, anything that
// is not a plain log key refused.
func TestLogPath(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ key, want string }{
		{"log/abc-hello.drv", "/log/abc-hello.drv"},
		{"log/abc-hello.drv.2", "/log/abc-hello.drv.2"},
		{"log/abc-what?.drv", "/log/abc-what%3F.drv"},
		{"log/", ""},
		{"nar/abc.nar.zst", ""},
		{"log/../abc.narinfo", ""},
		{"log/a//b", ""},
		{"log/a\\b", ""},
		{"", ""},
	} {
		if got := blob.LogPath(tt.key); got != tt.want {
			t.Errorf("LogPath(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}
