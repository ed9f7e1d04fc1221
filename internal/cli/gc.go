package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/gc"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
)

func newGC(g *globalFlags) *cobra.Command {
	var (
		dryRun  bool
		list    bool
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "gc [--dry-run [--list]]",
		Short: "Collect garbage now, or show what a collection would delete",
		Long: `gc asks the GC leader (a node with the signer role) to collect garbage now and waits for
the collection to finish: evaluations past their retention, the jobs and derivations only they
needed, logs past log_retention, and every cache object nothing live points at.

With --dry-run nothing is deleted: this command computes, with this node's configuration (its
database and cache store), what a collection would delete, and prints it (--list: every object).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDBFor(cmd, g, timeout, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				w := cmd.OutOrStdout()
				if !dryRun {
					rep, err := gc.Request(ctx, pool, time.Second)
					if errors.Is(err, context.DeadlineExceeded) {
						return fmt.Errorf("the collection did not finish within --timeout %s (it goes on; see harmonia-ci status)", timeout)
					}
					if err != nil {
						return err
					}
					rep.Print(w)
					return nil
				}
				logger := newLoggerAt(cfg, os.Stderr, slog.LevelWarn)
				store, err := node.OpenStore(cfg, logger)
				if err != nil {
					return err
				}
				r := cfg.Retention
				c, err := gc.New(gc.Config{Store: store, Retention: r.Default.Duration, MaxRetention: r.Max.Duration,
					LogRetention: r.LogRetention.Duration, Grace: r.Grace.Duration, Logger: logger}, pool)
				if err != nil {
					return err
				}
				rep, err := c.DryRun(ctx)
				if err != nil {
					return err
				}
				rep.Print(w)
				if list {
					for _, k := range rep.Keys {
						fmt.Fprintf(w, "%s\t%d\t%s\n", k.Key, k.Size, k.ModTime.UTC().Format(time.RFC3339))
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "delete nothing; print what a collection would delete")
	cmd.Flags().BoolVar(&list, "list", false, "with --dry-run: list every object that would be deleted (key, size, modified)")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "give up waiting after this long")
	return cmd
}
