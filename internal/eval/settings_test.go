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
		{name: "retry policy and failure expiry", file: "failure-expiry = \"24h\"\n[retry]\nattempts = 3\nbackoff = \"30s\"\n",
			want: Settings{EvalTimeout: time.Hour, AllowIFD: true, PullRequests: PRMerged,
				Retry: RetryPolicy{Retries: 2, Backoff: 30 * time.Second}, FailureExpiry: 24 * time.Hour}},
		{name: "one attempt is no retry", file: "[retry]\nattempts = 1\n",
			want: Settings{EvalTimeout: time.Hour, AllowIFD: true, PullRequests: PRMerged}},
		{name: "failure expiry in days", file: "failure-expiry = \"7d\"\n",
			want: Settings{EvalTimeout: time.Hour, AllowIFD: true, PullRequests: PRMerged, FailureExpiry: 7 * 24 * time.Hour}},
		{name: "no attempt", file: "[retry]\nattempts = 0\n", wantErr: "retry.attempts: want 1 (no retry) to 100, got 0"},
		{name: "too many attempts", file: "[retry]\nattempts = 1000\n", wantErr: "retry.attempts: want 1 (no retry) to 100, got 1000"},
		{name: "attempts as a string", file: "[retry]\nattempts = \"2\"\n", wantErr: "retry.attempts"},
		{name: "bad backoff", file: "[retry]\nbackoff = \"soon\"\n", wantErr: `retry.backoff: want a duration such as "30s" or "0s", got "soon"`},
		{name: "negative backoff", file: "[retry]\nbackoff = \"-1s\"\n", wantErr: "retry.backoff"},
		{name: "unknown retry key", file: "[retry]\ntries = 2\n", wantErr: "unknown keys retry.tries"},
		{name: "bad failure expiry", file: "failure-expiry = \"never\"\n", wantErr: `failure-expiry: want a positive duration such as "24h" or "7d", got "never"`},
		{name: "short failure expiry", file: "failure-expiry = \"10s\"\n", wantErr: "failure-expiry: 10s is under the minimum of 1m0s"},
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
				got.AllowIFD != tt.want.AllowIFD || got.Retention != tt.want.Retention || got.PullRequests != tt.want.PullRequests ||
				got.Retry != tt.want.Retry || got.FailureExpiry != tt.want.FailureExpiry {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// The node's ceilings cut a project's retry policy: fewer retries, a shorter backoff; no
// retries at all mean no backoff either.
func TestRetryPolicyCap(t *testing.T) {
	tests := []struct {
		name       string
		p          RetryPolicy
		maxRetries int
		maxBackoff time.Duration
		want       RetryPolicy
	}{
		{"within", RetryPolicy{2, 30 * time.Second}, 3, time.Hour, RetryPolicy{2, 30 * time.Second}},
		{"retries cut", RetryPolicy{9, 30 * time.Second}, 3, time.Hour, RetryPolicy{3, 30 * time.Second}},
		{"backoff cut", RetryPolicy{2, 2 * time.Hour}, 3, time.Hour, RetryPolicy{2, time.Hour}},
		{"retries off", RetryPolicy{2, time.Minute}, 0, time.Hour, RetryPolicy{}},
		{"none asked", RetryPolicy{}, 3, time.Hour, RetryPolicy{}},
	}
	for _, tt := range tests {
		if got := tt.p.Cap(tt.maxRetries, tt.maxBackoff); got != tt.want {
			t.Errorf("%s: %+v.Cap(%d, %s) = %+v, want %+v", tt.name, tt.p, tt.maxRetries, tt.maxBackoff, got, tt.want)
		}
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
	if len(s.Attrs) == 0 || s.EvalTimeout == time.Hour || s.AllowIFD || s.Retention == 0 || s.PullRequests != PRHead ||
		s.Retry.Retries == 0 || s.Retry.Backoff == 0 || s.FailureExpiry == 0 {
		t.Errorf("the README's example does not set every key: %+v", s)
	}
}
