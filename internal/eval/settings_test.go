package eval

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseSettings(t *testing.T) {
	tests := []struct {
		name    string
		file    string
		flake   bool
		want    Settings
		wantErr string
	}{
		{name: "flake defaults", flake: true, want: Settings{Attrs: []string{"checks"}, EvalTimeout: time.Hour, AllowIFD: true, PullRequests: PRMerged}},
		{name: "file defaults", want: Settings{EvalTimeout: time.Hour, AllowIFD: true, PullRequests: PRMerged}},
		{name: "all keys", file: "attrs = [\"checks\", 'packages.\"x.y\"']\neval-timeout = \"30m\"\nallow-ifd = false\nretention = \"30d\"\npull-requests = \"head\"\n",
			want: Settings{Attrs: []string{"checks", `packages."x.y"`}, EvalTimeout: 30 * time.Minute, AllowIFD: false, Retention: 30 * 24 * time.Hour, PullRequests: PRHead}},
		{name: "pull requests merged", file: "pull-requests = \"merged\"\n", want: Settings{EvalTimeout: time.Hour, AllowIFD: true, PullRequests: PRMerged}},
		{name: "bad pull requests", file: "pull-requests = \"base\"\n", wantErr: `pull-requests: want "merged" (the head merged into the base) or "head" (the head alone), got "base"`},
		{name: "unknown key", file: "atrs = [\"x\"]\n", wantErr: "unknown keys atrs"},
		{name: "bad timeout", file: "eval-timeout = \"soon\"\n", wantErr: `eval-timeout: want a positive duration such as "30m", got "soon"`},
		{name: "negative timeout", file: "eval-timeout = \"-1m\"\n", wantErr: "eval-timeout"},
		{name: "empty attrs", file: "attrs = []\n", wantErr: "attrs is empty"},
		{name: "bad retention", file: "retention = \"forever\"\n", wantErr: `retention: want a positive duration such as "90d" or "720h", got "forever"`},
		{name: "short retention", file: "retention = \"5m\"\n", wantErr: "retention: 5m is under the minimum of 1h"},
		{name: "bad attr path", file: "attrs = [\"a..b\"]\n", wantErr: "empty component"},
		{name: "wrong type", file: "allow-ifd = \"no\"\n", wantErr: SettingsFile},
		{name: "not toml", file: "attrs = [\n", wantErr: SettingsFile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSettings([]byte(tt.file), tt.flake, time.Hour)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Attrs, tt.want.Attrs) || got.EvalTimeout != tt.want.EvalTimeout ||
				got.AllowIFD != tt.want.AllowIFD || got.Retention != tt.want.Retention || got.PullRequests != tt.want.PullRequests {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSplitAttrPath(t *testing.T) {
	tests := []struct {
		in      string
		want    []string
		wantErr bool
	}{
		{in: "checks", want: []string{"checks"}},
		{in: "checks.x86_64-linux.foo", want: []string{"checks", "x86_64-linux", "foo"}},
		{in: `packages."a.b".c`, want: []string{"packages", "a.b", "c"}},
		{in: `"quoted \" inside"`, want: []string{`quoted " inside`}},
		{in: `""`, want: []string{""}},
		{in: "", wantErr: true},
		{in: "a..b", wantErr: true},
		{in: ".a", wantErr: true},
		{in: "a.", wantErr: true},
		{in: `"open`, wantErr: true},
		{in: "a\nb", wantErr: true},
	}
	for _, tt := range tests {
		got, err := SplitAttrPath(tt.in)
		if tt.wantErr {
			if err == nil {
				t.Errorf("SplitAttrPath(%q) = %q, want an error", tt.in, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("SplitAttrPath(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// The README's example of a .harmonia-ci.toml is one the evaluator accepts, with every key.
func TestReadmeShowsSettings(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "A repository may commit a `.harmonia-ci.toml`:\n\n```toml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("README.md has no .harmonia-ci.toml example")
	}
	s, err := ParseSettings([]byte(block), true, time.Hour)
	if err != nil {
		t.Fatalf("the README's example: %v", err)
	}
	if len(s.Attrs) == 0 || s.EvalTimeout == time.Hour || s.AllowIFD || s.Retention == 0 || s.PullRequests != PRHead {
		t.Errorf("the README's example does not set every key: %+v", s)
	}
}
