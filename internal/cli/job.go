package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func newJobCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "job",
		Short: "Show, rebuild or cancel build jobs",
	}
	var asJSON bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a build job",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				j, err := queue.GetJob(ctx, pool, id)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), j)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				row := func(k, v string) {
					if v != "" {
						fmt.Fprintf(tw, "%s\t%s\n", k, v)
					}
				}
				row("job", strconv.FormatInt(j.ID, 10))
				row("derivation", j.DrvPath)
				row("project", j.Project)
				row("status", string(j.Status))
				row("attempt", strconv.Itoa(j.Attempt))
				row("retries", strconv.Itoa(j.RetryCount))
				row("priority", strconv.Itoa(j.Priority))
				row("builder", j.ClaimedBy)
				if j.StartedAt != nil && j.FinishedAt != nil {
					row("duration", j.FinishedAt.Sub(*j.StartedAt).Round(time.Millisecond).String())
				}
				if j.ExitCode != nil {
					row("exit code", strconv.Itoa(*j.ExitCode))
				}
				row("error", j.ErrorMessage)
				if j.Flaky() {
					row("flaky", fmt.Sprintf("succeeded after %d build failure(s) of the same derivation", j.Failures))
				}
				if j.Status == status.JobPending && j.RetryAt != nil {
					row("retry", "not before "+j.RetryAt.UTC().Format(time.RFC3339)+" (a build failure, retried by the project's policy)")
				}
				if j.LogURL != "" {
					row("log", "/"+j.LogURL)
				}
				for _, a := range j.Attempts {
					v := string(a.Status)
					if a.Node != "" {
						v += " on " + a.Node
					}
					if a.StartedAt != nil {
						v += " in " + a.FinishedAt.Sub(*a.StartedAt).Round(time.Millisecond).String()
					}
					if a.Error != "" {
						v += ": " + strings.SplitN(a.Error, "\n", 2)[0]
					}
					if a.LogKey != "" {
						v += " (/" + a.LogKey + ")"
					}
					row("attempt "+strconv.Itoa(a.Attempt), v)
				}
				return tw.Flush()
			})
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rebuild := jobAction(g, "rebuild ID",
		"Queue a failed, dep-failed or cancelled job again at priority 100 (an operator's boost), with its dep-failed dependents",
		func(ctx context.Context, pool *pgxpool.Pool, id int64) (string, error) {
			n, err := queue.Rebuild(ctx, pool, id, queue.PriorityBoost)
			if err != nil {
				return "", err
			}
			if n == 0 {
				return "", fmt.Errorf("job %d is not failed, dep-failed or cancelled: nothing to rebuild", id)
			}
			return fmt.Sprintf("queued job %d again (%d jobs reset)", id, n), nil
		})
	cancel := jobAction(g, "cancel ID",
		"Cancel a pending or running job (a running build is killed within a heartbeat)",
		func(ctx context.Context, pool *pgxpool.Pool, id int64) (string, error) {
			if err := queue.Cancel(ctx, pool, id); errors.Is(err, queue.ErrStale) {
				return "", fmt.Errorf("job %d has already finished", id)
			} else if err != nil {
				return "", err
			}
			return fmt.Sprintf("cancelled job %d", id), nil
		})
	cmd.AddCommand(show, rebuild, cancel)
	return cmd
}

// jobAction is a command that does one thing to an existing job and prints what it did.
func jobAction(g *globalFlags, use, short string, do func(ctx context.Context, pool *pgxpool.Pool, id int64) (string, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				if _, err := queue.GetJob(ctx, pool, id); err != nil {
					return err
				}
				msg, err := do(ctx, pool, id)
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), msg)
				return nil
			})
		},
	}
}

func parseJobID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("job id: want a positive number, got %q", s)
	}
	return id, nil
}
