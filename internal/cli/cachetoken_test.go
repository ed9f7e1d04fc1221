package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/cache"
)

// cache-token list says whose each token is: an admin's (minted here) or a user's (minted in
// the web UI, "forge:login").
func TestPrintCacheTokensSaysWhose(t *testing.T) {
	now := time.Now()
	var out bytes.Buffer
	printCacheTokens(&out, []cache.TokenInfo{
		{ID: 2, Owner: "github:friend", Projects: []string{"secret"}, ExpiresAt: now.Add(time.Hour)},
		{ID: 1, Projects: []string{"a", "b"}, ExpiresAt: now.Add(-time.Hour), Note: "deploy"},
	}, now)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "WHOSE") ||
		strings.Join(strings.Fields(lines[1])[:3], " ") != "2 github:friend secret" ||
		strings.Join(strings.Fields(lines[2])[:3], " ") != "1 admin a,b" || !strings.Contains(lines[2], "expired") {
		t.Errorf("cache-token list:\n%s", out.String())
	}
}
