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

	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
)

// newCacheToken mints, lists and revokes the binary cache's read-only tokens.
func newCacheToken(g *globalFlags) *cobra.Command {
	var projects, note string
	var expires time.Duration
	cmd := &cobra.Command{
		Use:   "cache-token --projects a,b [--expires 720h] [--note TEXT]",
		Short: "Mint a read-only token of the binary cache for a set of projects",
		Long: `cache-token mints a token with which a Nix client reads the private store paths of the
projects given, until it expires: put it in a netrc-file as the password of the cache's host
(the login is ignored), or send it as a bearer token. It is printed once; only its hash is
stored. "cache-token list" lists the tokens, "cache-token revoke ID" revokes one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			names := splitList(projects)
			if len(names) == 0 {
				return errors.New("--projects is required: the projects whose private paths the token reads")
			}
			if expires <= 0 {
				return errors.New("--expires must be positive")
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				until := time.Now().Add(expires)
				id, token, err := cache.MintToken(ctx, pool, names, note, until)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "cache token %d for %s, expires %s\n", id, strings.Join(names, ", "), until.UTC().Format(time.RFC3339))
				fmt.Fprintln(cmd.OutOrStdout(), token)
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&projects, "projects", "", "comma-separated projects whose private paths the token reads")
	f.DurationVar(&expires, "expires", 720*time.Hour, "how long the token is valid")
	f.StringVar(&note, "note", "", "what the token is for, shown by list")
	cmd.AddCommand(newCacheTokenList(g), newCacheTokenRevoke(g))
	return cmd
}

func newCacheTokenList(g *globalFlags) *cobra.Command {
	return newTokenList(g, "List the binary cache's tokens (never the tokens themselves)",
		func(ctx context.Context, pool *pgxpool.Pool) ([]cache.TokenInfo, error) {
			return cache.ListTokens(ctx, pool)
		},
		printCacheTokens)
}

func newCacheTokenRevoke(g *globalFlags) *cobra.Command {
	return newTokenRevoke(g, "Revoke a binary cache token", "cache token", func(ctx context.Context, pool *pgxpool.Pool, id int64) error {
		return cache.RevokeToken(ctx, pool, id)
	})
}

// newTokenList is a tokens' "list" command: list reads them, print prints them as a table.
func newTokenList[T any](g *globalFlags, short string, list func(context.Context, *pgxpool.Pool) ([]T, error),
	print func(io.Writer, []T, time.Time)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				tokens, err := list(ctx, pool)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), tokens)
				}
				print(cmd.OutOrStdout(), tokens, time.Now())
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// newTokenRevoke is a tokens' "revoke ID" command.
func newTokenRevoke(g *globalFlags, short, what string, revoke func(context.Context, *pgxpool.Pool, int64) error) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				if err := revoke(ctx, pool, id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "revoked %s %d\n", what, id)
				return nil
			})
		},
	}
}

func printCacheTokens(w io.Writer, tokens []cache.TokenInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWHOSE\tPROJECTS\tEXPIRES\tSTATE\tNOTE")
	for _, t := range tokens {
		state := tokenState(t.RevokedAt, t.ExpiresAt, now)
		owner := t.Owner
		if owner == "" {
			owner = "admin"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", t.ID, owner, strings.Join(t.Projects, ","), t.ExpiresAt.UTC().Format(time.RFC3339), state, t.Note)
	}
	_ = tw.Flush()
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
