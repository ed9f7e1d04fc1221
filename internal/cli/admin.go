package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/node"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// withDB runs fn against the configured database (or the embedded one, attached to or started
// for the duration of the command).
func withDB(cmd *cobra.Command, g *globalFlags, fn func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error) error {
	return withDBFor(cmd, g, 2*time.Minute, fn)
}

// withDBFor is withDB with a time limit for the whole command; 0 means none (until a signal).
func withDBFor(cmd *cobra.Command, g *globalFlags, limit time.Duration, fn func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error) error {
	if err := g.dbOnly(cmd); err != nil {
		return err
	}
	cfg, err := g.load(cmd)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if limit > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, limit)
		defer cancel()
	}
	logger := newLoggerAt(cfg, os.Stderr, slog.LevelWarn)
	pool, closeDB, err := node.OpenDatabase(ctx, cfg, logger, false)
	if err != nil {
		return err
	}
	defer closeDB()
	return fn(ctx, cfg, pool)
}

func newMigrate(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply pending database migrations and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				res, err := db.Migrate(ctx, pool, cfg.Node.ID)
				if err != nil {
					return err
				}
				if len(res.Applied) == 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "schema is up to date (version %d)\n", res.Current)
					return nil
				}
				fmt.Fprintf(cmd.OutOrStdout(), "applied migrations %v; schema version %d\n", res.Applied, res.Current)
				return nil
			})
		},
	}
}

func newNodes(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				nodes, err := cluster.ListNodes(ctx, pool)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), nodes)
				}
				printNodes(cmd.OutOrStdout(), nodes)
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newClusterCmd(g *globalFlags) *cobra.Command {
	c := &cobra.Command{Use: "cluster", Short: "Inspect the cluster"}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Show nodes and leaders",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				st, err := cluster.ReadStatus(ctx, pool)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), st)
				}
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "Nodes: %d active, %d draining, %d joining, %d dead\n\n",
					st.Counts[status.NodeActive], st.Counts[status.NodeDraining],
					st.Counts[status.NodeJoining], st.Counts[status.NodeDead])
				printNodes(w, st.Nodes)
				fmt.Fprintln(w)
				printLeaders(w, st.Leaders)
				return nil
			})
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(status)
	return c
}

func newDrain(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "drain [NODE_ID]",
		Short: "Ask a node (default: this one) to finish its work and leave the cluster",
		Long: `drain sets the node's draining flag in the database. The node takes no new work from its
next heartbeat on, finishes what it is doing (up to its drain timeout), resigns any
leadership, deregisters and exits 0.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withDB(cmd, g, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				id := cfg.Node.ID
				if len(args) == 1 {
					id = args[0]
				}
				if err := cluster.RequestDrain(ctx, pool, id); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "drain requested for node %s; it stops taking work at its next heartbeat\n", id)
				return nil
			})
		},
	}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printNodes(w io.Writer, nodes []cluster.NodeStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tROLES\tJOBS\tLAST SEEN\tENDPOINT\tVERSION\tNIX")
	for _, n := range nodes {
		shown := string(n.Status)
		if n.Draining && n.Status != status.NodeDraining {
			shown += " (draining)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s ago\t%s\t%s\t%s\n", n.ID, shown, strings.Join(n.Roles, ","),
			n.CurrentJobs, n.MaxJobs, ago(n.LastSeenSecondsAgo), n.Endpoint, n.Version, n.NixInfo)
	}
	if len(nodes) == 0 {
		fmt.Fprintln(tw, "(no nodes)")
	}
	tw.Flush()
}

func printLeaders(w io.Writer, leaders []cluster.LeaderStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ROLE\tLEADER\tEPOCH\tLEASE UNTIL")
	for _, l := range leaders {
		leader := l.NodeID
		if !l.Valid {
			leader = "(none; last " + l.NodeID + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", l.Role, leader, l.Epoch, l.LeaseUntil.UTC().Format(time.RFC3339))
	}
	if len(leaders) == 0 {
		fmt.Fprintln(tw, "(no leader elected yet)")
	}
	tw.Flush()
}

func ago(seconds float64) string {
	d := time.Duration(seconds * float64(time.Second))
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String()
}
