package db

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one embedded schema change.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %q: name must be NNNN_name.sql", e.Name())
		}
		sql, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(sql)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("two migrations with version %d", ms[i].Version)
		}
	}
	return ms, nil
}

// MigrateResult says what a Migrate call did.
type MigrateResult struct {
	Applied []int // versions this call applied
	Current int   // schema version afterwards
}

// Migrate applies every pending migration. It holds a session advisory lock on a dedicated
// connection while it works, so nodes starting together migrate exactly once: the others wait,
// then find nothing to do. nodeID is recorded with each applied version.
func Migrate(ctx context.Context, pool *pgxpool.Pool, nodeID string) (MigrateResult, error) {
	var res MigrateResult
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	conn, err := DedicatedConn(ctx, pool, "harmonia-ci migrate")
	if err != nil {
		return res, fmt.Errorf("migrate: %w", err)
	}
	// Closing the session releases the lock whatever happens below.
	defer conn.Close(context.WithoutCancel(ctx))

	if _, err := conn.Exec(ctx, sqlMigrateLock, LockClass, LockMigrate); err != nil {
		return res, fmt.Errorf("migrate: take migration lock: %w", err)
	}
	// Looked up before it is created: CREATE TABLE IF NOT EXISTS needs the CREATE privilege on
	// the schema even when the table exists, which a node's restricted role (see
	// internal/dbroles) does not have.
	var exists bool
	if err := conn.QueryRow(ctx, sqlMigrationsTableExists).Scan(&exists); err != nil {
		return res, fmt.Errorf("migrate: look for schema_migrations: %w", err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, sqlMigrationsTableCreate); err != nil {
			if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" {
				return res, fmt.Errorf("migrate: the database has no schema yet and this database role may not create it: run `harmonia-ci migrate` as the database owner: %w", err)
			}
			return res, fmt.Errorf("migrate: create schema_migrations: %w", err)
		}
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, sqlMigrationsApplied)
	if err != nil {
		return res, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return res, fmt.Errorf("migrate: read applied versions: %w", err)
	}
	for _, v := range versions {
		applied[v] = true
		res.Current = max(res.Current, v)
	}
	latest := ms[len(ms)-1].Version
	if res.Current > latest {
		return res, fmt.Errorf("migrate: database schema version %d is newer than this binary knows (%d): upgrade harmonia-ci", res.Current, latest)
	}
	var pending []string
	for _, m := range ms {
		if !applied[m.Version] {
			pending = append(pending, fmt.Sprintf("%04d_%s", m.Version, m.Name))
		}
	}
	if len(pending) > 0 {
		// Only the schema's owner can change it. A node connecting as a restricted role starts
		// when the schema is current and otherwise says who must migrate it.
		var owner bool
		if err := conn.QueryRow(ctx, sqlMigrationsOwned).Scan(&owner); err != nil {
			return res, fmt.Errorf("migrate: check schema ownership: %w", err)
		}
		if !owner {
			return res, fmt.Errorf("migrate: migrations pending (%s) and this database role does not own the schema: run `harmonia-ci migrate` as the database owner", strings.Join(pending, ", "))
		}
	}
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlMigrationRecord,
				m.Version, m.Name, nodeID)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("migrate: apply %04d_%s: %w", m.Version, m.Name, err)
		}
		res.Applied = append(res.Applied, m.Version)
		res.Current = m.Version
	}
	if _, err := conn.Exec(ctx, sqlMigrateUnlock, LockClass, LockMigrate); err != nil {
		return res, fmt.Errorf("migrate: release migration lock: %w", err)
	}
	return res, nil
}
