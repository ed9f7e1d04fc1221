package dbroles_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbroles"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
)

// frontendOnly are the tables only frontends may read: the web UI's sessions (a row is half a
// login), the admins' bindings, and the credentials of old repository URLs (handed only to the
// evaluator holding an evaluation), and the API tokens' users and lifetimes.
var frontendOnly = []string{"admin_logins", "web_sessions", "repository_credentials", "api_tokens"}

// TestEveryTableCovered fails when a migration adds a table roles.sql does not know: nodes
// could not even read it. The frontend-only tables are readable by frontends and no one else.
func TestEveryTableCovered(t *testing.T) {
	c := setup(t)
	rows, err := c.owner.Query(testCtx(t), `
SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
  AND NOT has_table_privilege('harmonia_node', c.oid, 'SELECT')
  AND c.relname <> ALL($1::text[])`, frontendOnly)
	if err != nil {
		t.Fatal(err)
	}
	missing, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Fatalf("roles.sql grants nothing on %v: add them", missing)
	}
	for _, table := range frontendOnly {
		for role, want := range map[string]int64{"harmonia_frontend": 1, "harmonia_node": 0, "harmonia_evaluator": 0,
			"harmonia_signer": 0, "harmonia_cache": 0, "harmonia_builder": 0} {
			if got := queuetest.QueryInt(t, c.owner, `SELECT has_table_privilege($1, $2, 'SELECT')::int`, role, table); got != want {
				t.Errorf("%s may read %s: %d, want %d", role, table, got, want)
			}
		}
	}
}

// TestApplyConverges applies the roles again over a changed state: grants made by hand are
// taken back, and policies are not duplicated.
func TestApplyConverges(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	queuetest.Exec(t, c.owner, `GRANT INSERT ON signing_keys TO harmonia_builder`)
	queuetest.Exec(t, c.owner, `CREATE POLICY harmonia_stale ON build_jobs FOR UPDATE TO harmonia_builder USING (true)`)
	policies := func() int64 {
		return queuetest.QueryInt(t, c.owner, `SELECT count(*) FROM pg_policies WHERE schemaname = current_schema()`)
	}
	before := policies()
	rolesMu.Lock()
	err := dbroles.Apply(ctx, c.owner)
	rolesMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if after := policies(); after != before-1 {
		t.Fatalf("%d policies after applying again, want %d", after, before-1)
	}
	if queuetest.QueryInt(t, c.owner, `SELECT has_table_privilege('harmonia_builder', 'signing_keys', 'INSERT')::int`) != 0 {
		t.Fatal("a grant made by hand survived")
	}
}

// TestGrantNode changes a node's roles and checks the login role's memberships, and a builder's
// grant, follow.
func TestGrantNode(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	groups := func(id string) []string {
		rows, err := c.owner.Query(ctx, `
SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles u ON u.oid = m.member
WHERE u.rolname = $1 ORDER BY 1`, id)
		if err != nil {
			t.Fatal(err)
		}
		gs, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return gs
	}
	verifier, err := dbroles.ScramVerifier("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	grant := func(id string) string {
		var g string
		if err := c.owner.QueryRow(ctx, `
SELECT COALESCE((SELECT format('%s %s %s', systems, features, max_jobs) FROM node_grants WHERE id = $1), '')`, id).Scan(&g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, step := range []struct {
		roles     []string
		want      []string
		wantGrant string
	}{
		{[]string{"builder", "evaluator"}, []string{"harmonia_builder", "harmonia_evaluator"}, "{x86_64-linux,aarch64-linux} {kvm} 3"},
		{[]string{"evaluator"}, []string{"harmonia_evaluator"}, ""},
		{[]string{"cache", "signer"}, []string{"harmonia_cache", "harmonia_signer"}, ""},
	} {
		rolesMu.Lock()
		err := dbroles.GrantNode(ctx, c.owner, dbroles.Node{ID: "Node-7.x", Roles: step.roles, PasswordVerifier: verifier,
			Systems: []string{"x86_64-linux", "aarch64-linux"}, Features: []string{"kvm"}, MaxJobs: 3})
		rolesMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if got := groups("Node-7.x"); !slices.Equal(got, step.want) {
			t.Fatalf("roles %v: member of %v, want %v", step.roles, got, step.want)
		}
		if got := grant("Node-7.x"); got != step.wantGrant {
			t.Fatalf("roles %v: grant %q, want %q", step.roles, got, step.wantGrant)
		}
	}
	var stored string
	if err := c.owner.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = 'Node-7.x'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != verifier {
		t.Fatalf("stored password %q, want the verifier", stored)
	}
	for _, bad := range []dbroles.Node{
		{ID: "x; DROP TABLE nodes", Roles: []string{"builder"}},
		{ID: "-x", Roles: []string{"builder"}},
		{ID: "x", Roles: []string{"superuser"}},
		{ID: "x", Roles: nil},
		{ID: "x", Roles: []string{"builder"}, MaxJobs: 1},                        // no systems
		{ID: "x", Roles: []string{"builder"}, Systems: []string{"x86_64-linux"}}, // no slots
		{ID: "x", Roles: []string{"builder"}, PasswordVerifier: "secret' SUPERUSER '"},
		{ID: "harmonia", Roles: []string{"builder"}},        // the tests' superuser and owner
		{ID: "harmonia_signer", Roles: []string{"builder"}}, // a group
		{ID: "pg_signal_backend", Roles: []string{"builder"}},
	} {
		if err := dbroles.GrantNode(ctx, c.owner, bad); err == nil {
			t.Errorf("GrantNode(%+v) accepted", bad)
		}
	}
}

// TestMigratePendingAsNode: a node whose role does not own the schema refuses to start on a
// schema that needs migrating, and says who must migrate it.
func TestMigratePendingAsNode(t *testing.T) {
	c := setup(t)
	queuetest.Exec(t, c.owner, `DELETE FROM schema_migrations WHERE version = (SELECT max(version) FROM schema_migrations)`)
	_, err := db.Migrate(testCtx(t), c.as["b1"], "b1")
	if err == nil || !strings.Contains(err.Error(), "run `harmonia-ci migrate` as the database owner") {
		t.Fatalf("migrate as b1 with a pending migration: %v", err)
	}
	// A database with no schema at all (PostgreSQL 15 and later give PUBLIC no CREATE on public).
	empty := dbtest.PoolAs(t, dbtest.NewEmptyDB(t), "b1")
	_, err = db.Migrate(testCtx(t), empty, "b1")
	if err == nil || !strings.Contains(err.Error(), "run `harmonia-ci migrate` as the database owner") {
		t.Fatalf("migrate as b1 on an empty database: %v", err)
	}
}

// TestEndExpiredLeaderSession: a standing frontend or signer may end the session of a leader
// whose lease ran out (the elector's preemption, pg_terminate_backend); a builder may not end
// anyone's.
func TestEndExpiredLeaderSession(t *testing.T) {
	c := setup(t)
	ctx := testCtx(t)
	for _, step := range []struct {
		as      string
		allowed bool
	}{{"b1", false}, {"f1", true}, {"s1", true}} {
		// A session of its own each time: the previous one may have been ended.
		victim, err := pgx.ConnectConfig(ctx, c.as["e1"].Config().ConnConfig.Copy())
		if err != nil {
			t.Fatal(err)
		}
		var ended bool
		err = c.as[step.as].QueryRow(ctx, `SELECT pg_terminate_backend($1)`, victim.PgConn().PID()).Scan(&ended)
		victim.Close(ctx)
		switch {
		case step.allowed && (err != nil || !ended):
			t.Errorf("as %s: ended=%v err=%v", step.as, ended, err)
		case !step.allowed && !refused(err):
			t.Errorf("as %s: ended=%v err=%v, want a permission error", step.as, ended, err)
		}
	}
}
