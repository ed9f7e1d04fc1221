package dbroles_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbroles"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

// rolesMu serialises Apply and GrantNode across tests: roles are the server's, not the
// database's, and concurrent CREATE ROLE or GRANT of the same role collide.
var rolesMu sync.Mutex

// testNodes are the login roles every test creates, with their node roles.
var testNodes = []dbroles.Node{
	{ID: "b1", Roles: []string{"builder"}, Systems: []string{system}, MaxJobs: 2},
	{ID: "b2", Roles: []string{"builder"}, Systems: []string{system}, MaxJobs: 2},
	{ID: "e1", Roles: []string{"evaluator"}},
	{ID: "e2", Roles: []string{"evaluator"}},
	{ID: "f1", Roles: []string{"frontend"}},
	{ID: "s1", Roles: []string{"signer"}},
	{ID: "c1", Roles: []string{"cache"}},
}

// testDB is a fresh database with the roles applied: the owner's pool, and a pool per node
// logged in as that node's role.
type testDB struct {
	url   string
	owner *pgxpool.Pool
	as    map[string]*pgxpool.Pool
}

func setup(t *testing.T) *testDB {
	t.Helper()
	ctx := testCtx(t)
	c := &testDB{url: dbtest.NewDB(t), as: map[string]*pgxpool.Pool{}}
	c.owner = dbtest.PoolAs(t, c.url, "")
	rolesMu.Lock()
	defer rolesMu.Unlock()
	if err := dbroles.Apply(ctx, c.owner); err != nil {
		t.Fatal(err)
	}
	for _, n := range testNodes {
		if err := dbroles.GrantNode(ctx, c.owner, n); err != nil {
			t.Fatal(err)
		}
		c.as[n.ID] = dbtest.PoolAs(t, c.url, n.ID)
		var user string
		if err := c.as[n.ID].QueryRow(ctx, `SELECT session_user`).Scan(&user); err != nil || user != n.ID {
			t.Fatalf("connected as %q (%v), want %s", user, err, n.ID)
		}
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// refused reports whether err is PostgreSQL's insufficient_privilege: a missing grant, a row
// security policy's WITH CHECK, or an owner-only command.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}
