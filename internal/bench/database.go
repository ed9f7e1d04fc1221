package bench

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/pgembed"
)

// database is a benchmark's migrated PostgreSQL: a private, non-durable server in a directory
// of the benchmark's, or the one at a given URL.
type database struct {
	URL     string
	Pool    *pgxpool.Pool
	Version string // server_version, for the report
	srv     *pgembed.Server
}

// openDatabase connects to url, or with url "" starts a private server in dir allowing
// maxServerConns connections; the pool (poolConns connections, application name app) is
// migrated. Close stops what it started.
func openDatabase(ctx context.Context, url, dir string, maxServerConns int, app string, poolConns int32, logger *slog.Logger) (*database, error) {
	d := &database{URL: url}
	if url == "" {
		srv, err := pgembed.Start(ctx, pgembed.Options{Dir: dir, Durable: false, MaxConnections: maxServerConns, Logger: logger})
		if err != nil {
			return nil, err
		}
		d.srv, d.URL = srv, srv.URL("harmonia")
	}
	var err error
	if d.Pool, err = db.Connect(ctx, d.URL, db.PoolConfig{ApplicationName: app, MaxConns: poolConns}); err != nil {
		d.Close()
		return nil, err
	}
	if _, err = db.Migrate(ctx, d.Pool, "bench"); err == nil {
		err = d.Pool.QueryRow(ctx, `SELECT current_setting('server_version')`).Scan(&d.Version)
	}
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// Close closes the pool and stops a server openDatabase started.
func (d *database) Close() {
	if d.Pool != nil {
		d.Pool.Close()
	}
	_ = d.srv.Stop()
}
