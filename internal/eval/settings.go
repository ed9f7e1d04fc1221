package eval

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
)

// SettingsFile is the in-tree configuration a project may commit.
const SettingsFile = ".harmonia-ci.toml"

// Settings are a project's in-tree settings; .harmonia-ci.toml is the only place for them.
type Settings struct {
	Attrs       []string // attribute paths to evaluate
	EvalTimeout time.Duration
	AllowIFD    bool
	Retention   time.Duration // how long the garbage collector keeps the evaluation; 0: the server's default
	// PullRequests is what a pull request's evaluation evaluates: PRMerged or PRHead.
	PullRequests string
	// Retry is what a build failure of a job the evaluation needs gets ([retry]); the zero
	// policy retries nothing. The evaluator caps it (RetryPolicy.Cap).
	Retry RetryPolicy
	// FailureExpiry: a failed build the evaluation needs whose failure is older than this is
	// built again instead of taken as failed (failure-expiry); 0: a failure stays until rebuilt.
	FailureExpiry time.Duration
}

// RetryPolicy is how a build failure is retried: Retries more times, each after Backoff.
type RetryPolicy struct {
	Retries int
	Backoff time.Duration
}

// Cap cuts p to a node's ceilings ([build] max_retries and max_retry_backoff).
func (p RetryPolicy) Cap(maxRetries int, maxBackoff time.Duration) RetryPolicy {
	p.Retries = max(0, min(p.Retries, maxRetries))
	p.Backoff = max(0, min(p.Backoff, maxBackoff))
	if p.Retries == 0 {
		p.Backoff = 0
	}
	return p
}

// The bounds of .harmonia-ci.toml's retry settings: attempts beyond maxAttempts are refused
// outright (the node's max_retries cuts sooner), and a failure expiry under minFailureExpiry
// would build every failure again at each evaluation.
const (
	maxAttempts      = 100
	minFailureExpiry = time.Minute
)

// What a pull request's evaluation evaluates (pull-requests in .harmonia-ci.toml).
const (
	// PRMerged: the head merged into the base, what merging it would make the base.
	PRMerged = "merged"
	// PRHead: the head as it is.
	PRHead = "head"
)

type settingsFile struct {
	Attrs        *[]string `toml:"attrs"`
	EvalTimeout  *string   `toml:"eval-timeout"`
	AllowIFD     *bool     `toml:"allow-ifd"`
	Retention    *string   `toml:"retention"`
	PullRequests *string   `toml:"pull-requests"`
	Retry        *struct {
		Attempts *int    `toml:"attempts"`
		Backoff  *string `toml:"backoff"`
	} `toml:"retry"`
	FailureExpiry *string `toml:"failure-expiry"`
}

// ParseSettings reads .harmonia-ci.toml. Defaults: attrs ["checks"] for flakes, the whole
// attribute set otherwise (flake false: nil Attrs); allow-ifd true; eval-timeout the server's;
// pull-requests "merged"; no retry (retry.attempts 1) and no failure expiry.
func ParseSettings(b []byte, flake bool, defaultTimeout time.Duration) (Settings, error) {
	s := Settings{EvalTimeout: defaultTimeout, AllowIFD: true, PullRequests: PRMerged}
	if flake {
		s.Attrs = []string{"checks"}
	}
	var f settingsFile
	md, err := toml.NewDecoder(bytes.NewReader(b)).Decode(&f)
	if err != nil {
		return s, fmt.Errorf("%s: %w", SettingsFile, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		keys := make([]string, len(un))
		for i, k := range un {
			keys[i] = k.String()
		}
		return s, fmt.Errorf("%s: unknown keys %s (known: attrs, eval-timeout, allow-ifd, retention, pull-requests, failure-expiry, retry.attempts, retry.backoff)", SettingsFile, strings.Join(keys, ", "))
	}
	if f.Attrs != nil {
		if len(*f.Attrs) == 0 {
			return s, fmt.Errorf("%s: attrs is empty", SettingsFile)
		}
		for _, a := range *f.Attrs {
			if _, err := SplitAttrPath(a); err != nil {
				return s, fmt.Errorf("%s: attrs: %w", SettingsFile, err)
			}
		}
		s.Attrs = *f.Attrs
	}
	if f.EvalTimeout != nil {
		d, err := time.ParseDuration(*f.EvalTimeout)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("%s: eval-timeout: want a positive duration such as \"30m\", got %q", SettingsFile, *f.EvalTimeout)
		}
		s.EvalTimeout = d
	}
	if f.AllowIFD != nil {
		s.AllowIFD = *f.AllowIFD
	}
	if f.Retention != nil {
		d, err := config.ParseDuration(*f.Retention)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("%s: retention: want a positive duration such as \"90d\" or \"720h\", got %q", SettingsFile, *f.Retention)
		}
		if d < time.Hour {
			return s, fmt.Errorf("%s: retention: %s is under the minimum of 1h", SettingsFile, *f.Retention)
		}
		s.Retention = d
	}
	if f.PullRequests != nil {
		if *f.PullRequests != PRMerged && *f.PullRequests != PRHead {
			return s, fmt.Errorf("%s: pull-requests: want %q (the head merged into the base) or %q (the head alone), got %q",
				SettingsFile, PRMerged, PRHead, *f.PullRequests)
		}
		s.PullRequests = *f.PullRequests
	}
	if f.Retry != nil {
		if a := f.Retry.Attempts; a != nil {
			if *a < 1 || *a > maxAttempts {
				return s, fmt.Errorf("%s: retry.attempts: want 1 (no retry) to %d, got %d", SettingsFile, maxAttempts, *a)
			}
			s.Retry.Retries = *a - 1
		}
		if b := f.Retry.Backoff; b != nil {
			d, err := config.ParseDuration(*b)
			if err != nil || d < 0 {
				return s, fmt.Errorf("%s: retry.backoff: want a duration such as \"30s\" or \"0s\", got %q", SettingsFile, *b)
			}
			s.Retry.Backoff = d
		}
	}
	if f.FailureExpiry != nil {
		d, err := config.ParseDuration(*f.FailureExpiry)
		if err != nil || d <= 0 {
			return s, fmt.Errorf("%s: failure-expiry: want a positive duration such as \"24h\" or \"7d\", got %q", SettingsFile, *f.FailureExpiry)
		}
		if d < minFailureExpiry {
			return s, fmt.Errorf("%s: failure-expiry: %s is under the minimum of %s", SettingsFile, *f.FailureExpiry, minFailureExpiry)
		}
		s.FailureExpiry = d
	}
	return s, nil
}

// SplitAttrPath splits "a.b.\"c.d\"" into its components.
func SplitAttrPath(s string) ([]string, error) {
	if s == "" {
		return nil, fmt.Errorf("empty attribute path")
	}
	var parts []string
	var cur strings.Builder
	quoted, started := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case c == '"':
			quoted = !quoted
			started = true
		case c == '.' && !quoted:
			if !started && cur.Len() == 0 {
				return nil, fmt.Errorf("attribute path %q has an empty component", s)
			}
			parts = append(parts, cur.String())
			cur.Reset()
			started = false
		case c < 0x20 || c == 0x7f:
			return nil, fmt.Errorf("attribute path %q contains a control character", s)
		default:
			cur.WriteByte(c)
			started = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("attribute path %q has an unterminated quote", s)
	}
	if !started && cur.Len() == 0 {
		return nil, fmt.Errorf("attribute path %q has an empty component", s)
	}
	return append(parts, cur.String()), nil
}
