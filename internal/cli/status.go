package cli

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/overview"
)

// newStatus is the overview an operator reads first: queue, builders, leaders, last GC.
func newStatus(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster at a glance: queue, ready and blocked jobs, builders, leaders, last GC",
		Long: `status reads one consistent snapshot of the database and prints, on one screen: live build
jobs by system and status, ready versus blocked pending jobs and how long the oldest ready job
has waited, queued and running evaluations, builders busy, idle, draining and dead with their
slots, the leader of each role and whether its lease is valid, and the last garbage collection
with the last successful one. --json prints the same as JSON.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				o, err := overview.Read(ctx, pool)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), o)
				}
				return o.WriteText(cmd.OutOrStdout())
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
