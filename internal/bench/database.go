package bench

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
)

// Database is a benchmark's migrated PostgreSQL: a private, non-durable server in a directory
// of the benchmark's, or the one at a given URL.
type Database struct {
	URL     string
	Pool    *pgxpool.Pool
	Version string // server_version, for the report
	srv     *pgembed.Server
}

// DatabaseOptions says which PostgreSQL a benchmark uses and how it connects.
type DatabaseOptions struct {
	URL            string // an existing server; "" starts a private one in Dir
	Dir            string
	MaxServerConns int    // the private server's max_connections
	App            string // the pool's application name
	PoolConns      int32
	Logger         *slog.Logger
}

// OpenDatabase connects to o.URL, or with none starts a private server in o.Dir; the pool is
// migrated. Close stops what it started.
func OpenDatabase(ctx context.Context, o DatabaseOptions) (*Database, error) {
	d := &Database{URL: o.URL}
	if o.URL == "" {
		srv, err := pgembed.Start(ctx, pgembed.Options{Dir: o.Dir, Durable: false, MaxConnections: o.MaxServerConns, Logger: o.Logger})
		if err != nil {
			return nil, err
		}
		d.srv, d.URL = srv, srv.URL("harmonia")
	}
	var err error
	if d.Pool, err = db.Connect(ctx, d.URL, db.PoolConfig{ApplicationName: o.App, MaxConns: o.PoolConns}); err != nil {
		d.Close()
		return nil, err
	}
	if _, err = db.Migrate(ctx, d.Pool, "bench"); err == nil {
		err = d.Pool.QueryRow(ctx, sqlServerVersion).Scan(&d.Version)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the pool and stops a server OpenDatabase started.
func (d *Database) Close() {
	if d.Pool != nil {
		d.Pool.Close()
	}
	_ = d.srv.Stop()
}
