package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
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
			c, err := g.remote()
			if err != nil {
				return err
			}
			if c != nil {
				return remoteJobShow(cmd, c, id, asJSON)
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				j, err := queue.GetJob(ctx, pool, id)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), j)
				}
				f := newFieldWriter(cmd.OutOrStdout())
				jf := jobFields{id: j.ID, drv: j.DrvPath, project: j.Project, status: string(j.Status), attempt: j.Attempt,
					retries: j.RetryCount, priority: j.Priority, builder: j.ClaimedBy, exitCode: j.ExitCode, err: j.ErrorMessage}
				if j.StartedAt != nil && j.FinishedAt != nil {
					d := j.FinishedAt.Sub(*j.StartedAt)
					jf.duration = &d
				}
				jf.failures, jf.retryAt = j.Failures, j.RetryAt
				if !j.Flaky() {
					jf.failures = 0
				}
				if j.Status != status.JobPending {
					jf.retryAt = nil
				}
				if j.LogURL != "" {
					jf.log = "/" + j.LogURL
				}
				jf.write(f)
				for _, a := range j.Attempts {
					v := string(a.Status)
					if a.Node != "" {
						v += " on " + a.Node
					}
					if a.StartedAt != nil {
						v += " in " + duration(a.FinishedAt.Sub(*a.StartedAt))
					}
					if a.Error != "" {
						v += ": " + strings.SplitN(a.Error, "\n", 2)[0]
					}
					if a.LogKey != "" {
						v += " (/" + a.LogKey + ")"
					}
					f.row("attempt "+strconv.Itoa(a.Attempt), v)
				}
				return f.flush()
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
		}, (*apiclient.Client).RebuildBuild)
	cancel := jobAction(g, "cancel ID",
		"Cancel a pending or running job (a running build is killed within a heartbeat)",
		func(ctx context.Context, pool *pgxpool.Pool, id int64) (string, error) {
			if err := queue.Cancel(ctx, pool, id); errors.Is(err, queue.ErrStale) {
				return "", fmt.Errorf("job %d has already finished", id)
			} else if err != nil {
				return "", err
			}
			return fmt.Sprintf("cancelled job %d", id), nil
		}, (*apiclient.Client).CancelBuild)
	cmd.AddCommand(show, rebuild, cancel)
	return cmd
}

// jobAction is a command that does one thing to an existing job and prints what it did: with
// the database, do; over HTTP, the server's action remote.
func jobAction(g *globalFlags, use, short string, do func(ctx context.Context, pool *pgxpool.Pool, id int64) (string, error),
	remote func(c *apiclient.Client, ctx context.Context, id int64) (apiclient.ActionResult, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseJobID(args[0])
			if err != nil {
				return err
			}
			c, err := g.remote()
			if err != nil {
				return err
			}
			if c != nil {
				return remoteAction(cmd, asJSON, func(ctx context.Context) (apiclient.ActionResult, error) {
					return remote(c, ctx, id)
				})
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				if _, err := queue.GetJob(ctx, pool, id); err != nil {
					return err
				}
				msg, err := do(ctx, pool, id)
				if err != nil {
					return err
				}
				return printAction(cmd, msg, asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func parseJobID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError{fmt.Errorf("job id: want a positive number, got %q", s)}
	}
	return id, nil
}
