package db

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DBTX is what a query needs of PostgreSQL. *pgxpool.Pool, *pgxpool.Conn, pgx.Tx and *pgx.Conn
// all satisfy it, so a function that takes one runs on its own or inside its caller's
// transaction. Code that batches (SendBatch) or copies takes the concrete type it needs.
type DBTX interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Everything a caller may hand to a function that takes a DBTX.
var (
	_ DBTX = (*pgxpool.Pool)(nil)
	_ DBTX = (*pgxpool.Conn)(nil)
	_ DBTX = (pgx.Tx)(nil)
	_ DBTX = (*pgx.Conn)(nil)
)
