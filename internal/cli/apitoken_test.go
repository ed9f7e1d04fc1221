package cli

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/apitoken"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// api-token mints machine tokens (admin, or reading projects), lists them with the users'
// and revokes them at once.
func TestAPITokenCommands(t *testing.T) {
	url := dbtest.NewDB(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	queuetest.NewProject(t, pool, "app", 100)

	if _, err := runCLI(t, "api-token", "--name", "x", "--database-url", url); err == nil {
		t.Errorf("api-token without --admin or --projects: no error")
	}
	if _, err := runCLI(t, "api-token", "--name", "x", "--projects", "nope", "--database-url", url); err == nil {
		t.Errorf("api-token of a project that does not exist: no error")
	}
	out, err := runCLI(t, "api-token", "--name", "deploy", "--admin", "--database-url", url)
	if err != nil {
		t.Fatalf("api-token --admin: %v\n%s", err, out)
	}
	token := lastLine(out)
	id, ok, err := apitoken.Lookup(t.Context(), pool, token)
	if err != nil || !ok || !id.Admin || id.Name != "deploy" || !id.Machine() {
		t.Fatalf("the minted token looks up as %+v, %v, %v", id, ok, err)
	}
	out, err = runCLI(t, "api-token", "--name", "dash", "--projects", "app", "--expires", "1h", "--database-url", url)
	if err != nil {
		t.Fatalf("api-token --projects: %v\n%s", err, out)
	}
	reads, ok, _ := apitoken.Lookup(t.Context(), pool, lastLine(out))
	if !ok || reads.Admin || len(reads.Repos) != 1 {
		t.Fatalf("the project token looks up as %+v", reads)
	}
	out, err = runCLI(t, "api-token", "list", "--database-url", url)
	if err != nil || !strings.Contains(out, "machine  admin") || !strings.Contains(out, "read app") || strings.Contains(out, token) {
		t.Errorf("api-token list: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "api-token", "revoke", "1", "--database-url", url); err != nil {
		t.Fatalf("revoke: %v\n%s", err, out)
	}
	if _, ok, _ := apitoken.Lookup(t.Context(), pool, token); ok {
		t.Errorf("a revoked token still looks up")
	}
	if _, err := runCLI(t, "api-token", "revoke", "1", "--database-url", url); err == nil {
		t.Errorf("revoking a revoked token: no error")
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
