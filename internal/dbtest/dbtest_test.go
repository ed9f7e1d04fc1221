package dbtest_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestParallelTestsGetSeparateMigratedDatabases(t *testing.T) {
	var mu sync.Mutex
	names := map[string]string{} // subtest -> current_database()
	t.Run("group", func(t *testing.T) {
		for _, sub := range []string{"a", "b"} {
			t.Run(sub, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				pool := dbtest.NewPool(t)
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil || n == 0 {
					t.Fatalf("schema_migrations: count=%d err=%v", n, err)
				}
				var name string
				if err := pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				names[sub] = name
				mu.Unlock()
			})
		}
	})
	if names["a"] == "" || names["a"] == names["b"] {
		t.Fatalf("databases: %v, want two different ones", names)
	}
}

func TestRowsDoNotLeakBetweenDatabases(t *testing.T) {
	ctx := context.Background()
	a, b := dbtest.NewPool(t), dbtest.NewPool(t)
	for _, pool := range []*pgxpool.Pool{a, b} {
		if _, err := pool.Exec(ctx, `CREATE TABLE probe (v text)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Exec(ctx, `INSERT INTO probe VALUES ('only in a')`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, `SELECT count(*) FROM probe`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows in b: %d err=%v, want 0", n, err)
	}
	if err := a.QueryRow(ctx, `SELECT count(*) FROM probe`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows in a: %d err=%v, want 1", n, err)
	}
}

func TestServerURLSeesTemplateAndTestDatabases(t *testing.T) {
	ctx := context.Background()
	url := dbtest.NewDB(t)
	conn, err := pgx.Connect(ctx, dbtest.ServerURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil || db != "postgres" {
		t.Fatalf("ServerURL database = %q err=%v", db, err)
	}
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname IN ($1, 'harmonia_template')`, cfg.Database).Scan(&n); err != nil || n != 2 {
		t.Fatalf("found %d of the test and template databases, err=%v", n, err)
	}
}
