// Package dbroles confines each node to what its roles need in PostgreSQL:
// group roles with exactly the grants of the frontend, evaluator, signer, cache and builder
// code, row-level security so that a node writes only its own claims, log tails, nodes row and
// leases, and one login role per node named after its node id.
//
// It is optional hardening, applied by the schema owner with `harmonia-ci db roles --apply`;
// a deployment that connects every node as the owner works as before, because the owner
// bypasses row-level security. The SQL is in roles.sql.
package dbroles

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
)

//go:embed roles.sql
var rolesSQL string

// SQL is the script Apply runs: the group roles, their grants and the row-level security
// policies.
func SQL() string { return rolesSQL }

// Apply creates the group roles (if missing) and sets their grants and policies to exactly
// those of this version, in one transaction. It must run as the schema's owner with the right
// to create roles and to grant pg_signal_backend (a superuser, or CREATEROLE on PostgreSQL
// 15 and older). Run it again after every upgrade that adds a migration.
func Apply(ctx context.Context, conn beginner) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, rolesSQL)
		return err
	})
	if err != nil {
		return fmt.Errorf("apply database roles: %w", err)
	}
	return nil
}

// beginner starts transactions: a *pgx.Conn or a *pgxpool.Pool.
type beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// groups maps a node role to its group role in roles.sql.
var groups = map[string]string{
	"frontend":  "harmonia_frontend",
	"evaluator": "harmonia_evaluator",
	"signer":    "harmonia_signer",
	"cache":     "harmonia_cache",
	"builder":   "harmonia_builder",
}

// Group is the group role of a node role ("builder" → "harmonia_builder"), or "" for an
// unknown role.
func Group(role string) string { return groups[role] }
