package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/apitoken"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
)

// newAPIToken mints, lists and revokes the HTTP API's machine tokens (users mint their own in
// the web UI; list and revoke here cover both).
func newAPIToken(g *globalFlags) *cobra.Command {
	var name, projects string
	var admin bool
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "api-token --name NAME [--expires 720h] (--admin | --projects a,b)",
		Short: "Mint a machine token of the HTTP API",
		Long: `api-token mints a token with which a script uses the HTTP API without a user
(Authorization: Bearer TOKEN), until it expires: --admin may do anything the admin token may;
--projects reads those projects (their private data included) and acts on nothing. It is
printed once; only its hash is stored. Users mint their own personal tokens in the web UI
(/ci/tokens). "api-token list" lists every API token, "api-token revoke ID" revokes one at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := splitList(projects)
			if admin == (len(names) > 0) {
				return errors.New("give either --admin or --projects")
			}
			if expires <= 0 {
				return errors.New("--expires must be positive")
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				m, err := apitoken.MintMachine(ctx, pool, name, time.Now().Add(expires), admin, names)
				if err != nil {
					return err
				}
				what := "admin"
				if !admin {
					what = "reading " + strings.Join(names, ", ")
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "API token %d %q, %s, expires %s\n", m.ID, name, what, m.ExpiresAt.UTC().Format(time.RFC3339))
				fmt.Fprintln(cmd.OutOrStdout(), m.Token)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "what the token is for, shown by list and in the record of its actions")
	f.DurationVar(&expires, "expires", 720*time.Hour, "how long the token is valid")
	f.BoolVar(&admin, "admin", false, "the token may do anything the admin token may")
	f.StringVar(&projects, "projects", "", "comma-separated projects the token reads")
	cmd.AddCommand(newAPITokenList(g), newAPITokenRevoke(g))
	return cmd
}

// maxTokensListed bounds api-token list.
const maxTokensListed = 1000

func newAPITokenList(g *globalFlags) *cobra.Command {
	return newTokenList(g, "List the HTTP API's tokens, users' and machines' (never the tokens themselves)",
		func(ctx context.Context, pool *pgxpool.Pool) ([]apitoken.Info, error) {
			return apitoken.List(ctx, pool, "", 0, maxTokensListed)
		}, printAPITokens)
}

func newAPITokenRevoke(g *globalFlags) *cobra.Command {
	return newTokenRevoke(g, "Revoke an API token (a user's or a machine's); refused from its next request", "API token",
		func(ctx context.Context, pool *pgxpool.Pool, id int64) error {
			return apitoken.Revoke(ctx, pool, id, "", 0)
		})
}

func printAPITokens(w io.Writer, tokens []apitoken.Info, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWHOSE\tMAY\tEXPIRES\tLAST USED\tSTATE\tNAME")
	for _, t := range tokens {
		owner, may := t.Owner, "as its user"
		switch {
		case owner != "":
		case t.Admin:
			owner, may = "machine", "admin"
		default:
			owner, may = "machine", "read "+strings.Join(t.Projects, ",")
		}
		used := "never"
		if t.LastUsedAt != nil {
			used = t.LastUsedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, owner, may, t.ExpiresAt.UTC().Format(time.RFC3339), used,
			tokenState(t.RevokedAt, t.ExpiresAt, now), t.Name)
	}
	_ = tw.Flush()
}

// tokenState is a token's state as the lists print it: live, revoked or expired.
func tokenState(revokedAt *time.Time, expiresAt, now time.Time) string {
	switch {
	case revokedAt != nil:
		return "revoked"
	case !expiresAt.After(now):
		return "expired"
	}
	return "live"
}
