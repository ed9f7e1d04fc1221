package dbroles

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// nodeIDPattern is the nodes table's CHECK on ids: a node id is also a valid role name.
var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Node is a node's login role.
type Node struct {
	ID    string   // the node id, which is also the role's name
	Roles []string // its node roles; the login role is a member of exactly their groups
	// PasswordVerifier, if not empty, is stored as the role's password (see ScramVerifier);
	// empty leaves the password as it is (none for a new role: peer or certificate auth).
	PasswordVerifier string
	// A builder's grant: the most its nodes row may declare, and so the most it may claim.
	// Required for a builder, ignored otherwise.
	Systems  []string
	Features []string
	MaxJobs  int
}

// GrantNode creates or updates the login role of one node: LOGIN, a member of exactly the
// groups of its roles, and the password verifier if one is given. The groups must exist
// (Apply).
func GrantNode(ctx context.Context, conn beginner, n Node) error {
	if !nodeIDPattern.MatchString(n.ID) {
		return fmt.Errorf("grant node %q: node ids are 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit", n.ID)
	}
	if len(n.Roles) == 0 {
		return fmt.Errorf("grant node %s: no roles", n.ID)
	}
	want := map[string]bool{}
	for _, r := range n.Roles {
		g := Group(r)
		if g == "" {
			return fmt.Errorf("grant node %s: unknown role %q (frontend, evaluator, signer, cache, builder)", n.ID, r)
		}
		want[g] = true
	}
	if want[Group("builder")] && (len(n.Systems) == 0 || n.MaxJobs < 1) {
		return fmt.Errorf("grant node %s: a builder needs the systems it builds and its max_jobs (at least 1)", n.ID)
	}
	if n.Features == nil {
		n.Features = []string{}
	}
	if n.PasswordVerifier != "" && !verifierPattern.MatchString(n.PasswordVerifier) {
		return fmt.Errorf("grant node %s: not a SCRAM-SHA-256 verifier", n.ID)
	}
	role := pgx.Identifier{n.ID}.Sanitize()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var exists, other bool
		if err := tx.QueryRow(ctx, sqlRoleCheck, n.ID).Scan(&exists, &other); err != nil {
			return err
		}
		if other {
			return fmt.Errorf("role %s exists and is not a node's login role (privileged, a group, or an owner of objects here): choose another node id", n.ID)
		}
		verb := "ALTER"
		if !exists {
			verb = "CREATE"
		}
		if _, err := tx.Exec(ctx, verb+" ROLE "+role+" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE INHERIT NOBYPASSRLS"); err != nil {
			return err
		}
		if n.PasswordVerifier != "" {
			// The verifier is base64, '$' and ':' (verifierPattern): nothing to escape. A
			// verifier, not the password, so the password never reaches the server's logs.
			if _, err := tx.Exec(ctx, "ALTER ROLE "+role+" PASSWORD '"+n.PasswordVerifier+"'"); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, sqlRoleGroups, n.ID)
		if err != nil {
			return err
		}
		have, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, g := range have {
			if !want[g] {
				if _, err := tx.Exec(ctx, "REVOKE "+pgx.Identifier{g}.Sanitize()+" FROM "+role); err != nil {
					return err
				}
			}
		}
		for _, g := range slices.Sorted(maps.Keys(want)) {
			if slices.Contains(have, g) {
				continue
			}
			if _, err := tx.Exec(ctx, "GRANT "+pgx.Identifier{g}.Sanitize()+" TO "+role); err != nil {
				return err
			}
		}
		if !want[Group("builder")] {
			_, err := tx.Exec(ctx, sqlRevokeBuilds, n.ID)
			return err
		}
		_, err = tx.Exec(ctx, sqlGrantBuilds, n.ID, n.Systems, n.Features, n.MaxJobs)
		return err
	})
	if err != nil {
		return fmt.Errorf("grant node %s (%s): %w", n.ID, strings.Join(n.Roles, ","), err)
	}
	return nil
}
