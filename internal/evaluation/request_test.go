package evaluation_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
)

func TestSupersedesBranches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		branch string
		want   bool
	}{
		{"main", true},
		{"feature/x", true},
		{"staging-next", true},
		{"trying-things", true},
		{"gh-readonly-queue", true},
		{"gh-readonly-queue/main/pr-1-0123456789abcdef", false},
		{"gh-readonly-queue/release/pr-22-cafe", false},
		{"staging", false},
		{"trying", false},
		{"staging.tmp", false},
		{"staging.tmp42", false},
		{"trying.tmp", false},
	} {
		if got := evaluation.Supersedes(c.branch); got != c.want {
			t.Errorf("Supersedes(%q) = %v, want %v", c.branch, got, c.want)
		}
	}
}

func TestSupersedes(t *testing.T) {
	for branch, want := range map[string]bool{
		"main": true, "master": true, "release/1.0": true, "feature/x": true, "refs/pull/4/merge": true,
		"gh-readonly-queue/main/pr-12-abc": false, "staging": false, "trying": false, "staging.tmp": false,
	} {
		if got := evaluation.Supersedes(branch); got != want {
			t.Errorf("Supersedes(%q) = %v, want %v", branch, got, want)
		}
	}
}
