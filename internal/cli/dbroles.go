package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/dbroles"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
)

// newDBCmd groups the database owner's commands: per-role PostgreSQL roles.
func newDBCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{
		Use:   "db",
		Short: "Database administration: per-role PostgreSQL roles (run as the database owner)",
	}
	c.AddCommand(newDBRoles(g), newDBGrantNode(g))
	return c
}

func newDBRoles(g *globalFlags) *cobra.Command {
	var apply bool
	cmd := &cobra.Command{
		Use:   "roles [--apply]",
		Short: "Create the group roles of the node roles and confine each to what it needs",
		Long: `roles prints, or with --apply runs, the SQL that creates the group roles harmonia_node,
harmonia_frontend, harmonia_evaluator, harmonia_signer, harmonia_cache and harmonia_builder, gives each
exactly the grants its code needs, and turns on row-level security so that a node writes only its
own claims, log tails, nodes row and leases. Run it as the owner of the schema (which must also be
able to create roles and grant pg_signal_backend: a superuser, or CREATEROLE up to PostgreSQL 15),
after ` + "`harmonia-ci migrate`" + ` and again after every upgrade; it converges on exactly these grants.
Then give each node a login role with ` + "`harmonia-ci db grant-node`" + ` and its own database URL.
Nodes that still connect as the owner are unaffected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !apply {
				fmt.Fprint(cmd.OutOrStdout(), dbroles.SQL())
				fmt.Fprintln(cmd.ErrOrStderr(), "harmonia-ci: printed only; run with --apply to apply it")
				return nil
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				if err := dbroles.Apply(ctx, pool); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "database roles applied")
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "apply the SQL instead of printing it")
	return cmd
}

func newDBGrantNode(g *globalFlags) *cobra.Command {
	var passwordFile string
	cmd := &cobra.Command{
		Use:   "grant-node NODE_ID --roles builder[,evaluator] [--password-file FILE]",
		Short: "Create or update the login role a node connects to PostgreSQL as",
		Long: `grant-node creates (or updates) the login role NODE_ID, named after the node id, a member of
exactly the group roles of the given node roles (see ` + "`harmonia-ci db roles`" + `). The node must then
connect as that role: row-level security compares claims and node rows with the session's user.
A builder's login may declare, and so claim for, no more than the systems, features and
max_jobs of the configuration given here ([node] systems, features, max_jobs): run grant-node
with the builder's own configuration, and again when it changes.
With --password-file the role's password is set to the file's first line; only its SCRAM-SHA-256
verifier is sent to the server. Without it the password is left as it is (none for a new role:
use peer or certificate authentication).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("roles") {
				return errors.New("--roles is required: the node roles the node runs (frontend, evaluator, signer, cache, builder)")
			}
			var verifier string
			if passwordFile != "" {
				password, err := readPasswordFile(passwordFile)
				if err != nil {
					return err
				}
				if verifier, err = dbroles.ScramVerifier(password); err != nil {
					return fmt.Errorf("--password-file: %w", err)
				}
			}
			return withDB(cmd, g, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				n := dbroles.Node{ID: args[0], Roles: cfg.Node.Roles, PasswordVerifier: verifier,
					Systems: cfg.Node.Systems, Features: cfg.Node.Features, MaxJobs: cfg.Node.MaxJobs}
				if err := dbroles.GrantNode(ctx, pool, n); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "login role %s: %s\n", n.ID, strings.Join(n.Roles, ","))
				if slices.Contains(n.Roles, config.RoleBuilder) {
					fmt.Fprintf(cmd.OutOrStdout(), "  builds at most: systems %s, features %s, max_jobs %d\n",
						strings.Join(n.Systems, ","), strings.Join(n.Features, ","), n.MaxJobs)
				}
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&passwordFile, "password-file", "", "set the role's password from this file (its first line)")
	return cmd
}

// readPasswordFile reads a password from the first line of a secret file, which other users
// must not be able to read.
func readPasswordFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("--password-file: %w", err)
	}
	if err := nix.CheckSecretMode(path, fi.Mode()); err != nil {
		return "", fmt.Errorf("--password-file: %w", err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--password-file: %w", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	line = strings.TrimSuffix(line, "\r")
	if line == "" {
		return "", fmt.Errorf("--password-file %s: the first line is empty", path)
	}
	return line, nil
}
