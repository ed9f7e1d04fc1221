package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// watchInterval is how often `watch` and `eval show --wait` ask the server.
const watchInterval = 2 * time.Second

func newWatch(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "watch EVAL",
		Short: "Follow an evaluation and its builds to the end; exit 0 only if everything succeeded",
		Long: `watch follows an evaluation over HTTP (--server) until it and every build it needs have
finished: on a terminal one line of counts by status, redrawn in place; otherwise a line each
time the counts change. It exits 0 only when the evaluation and every attribute succeeded, 1
when anything failed (the failed attributes are named; ` + "`failures EVAL`" + ` shows their logs).
With --json, progress goes to stderr and the finished evaluation, as the API gives it, to stdout.`,
	}
	remoteOnly(g, cmd, parseID, 0, func(ctx context.Context, c *apiclient.Client, id int64) error {
		progress := cmd.OutOrStdout()
		if asJSON {
			progress = cmd.ErrOrStderr()
		}
		e, err := watchEval(ctx, c, id, progress, isTerminal(progress))
		if err != nil {
			return err
		}
		failed, err := c.Failures(ctx, id)
		if err != nil {
			return err
		}
		if asJSON {
			if e, err = c.Evaluation(ctx, id, true); err != nil {
				return err
			}
			if err := printJSON(cmd.OutOrStdout(), e); err != nil {
				return err
			}
		}
		return watchResult(e, failed)
	})
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the finished evaluation as JSON")
	return cmd
}

// watchEval asks for evaluation id until it and its builds have finished, showing each answer
// on progress: redrawn in place on a terminal, a line per change otherwise.
func watchEval(ctx context.Context, c *apiclient.Client, id int64, progress io.Writer, tty bool) (apiv1.EvaluationDetail, error) {
	last := ""
	for {
		e, err := c.Evaluation(ctx, id, false)
		if err == nil {
			line := progressLine(e)
			switch {
			case tty:
				fmt.Fprintf(progress, "\r\033[K%s", line)
			case line != last:
				fmt.Fprintln(progress, line)
			}
			last = line
			if watchDone(e) {
				break
			}
			err = apiclient.Sleep(ctx, watchInterval)
		}
		if err != nil {
			if tty && last != "" {
				fmt.Fprintln(progress)
			}
			return e, err
		}
	}
	if tty {
		fmt.Fprintln(progress)
	}
	return c.Evaluation(ctx, id, false)
}

// watchDone: the evaluation has ended and so has every build it needs.
func watchDone(e apiv1.EvaluationDetail) bool {
	if !e.Status.Terminal() {
		return false
	}
	for _, s := range status.UnfinishedJobs() {
		if e.Builds[s] > 0 {
			return false
		}
	}
	return true
}

// progressLine is the evaluation's status and its builds counted by status.
func progressLine(e apiv1.EvaluationDetail) string {
	var counts []string
	for _, s := range status.AllJobs() {
		if n := e.Builds[s]; n > 0 {
			counts = append(counts, fmt.Sprintf("%d %s", n, s))
		}
	}
	builds := "no builds"
	if len(counts) > 0 {
		builds = "builds: " + strings.Join(counts, ", ")
	}
	return fmt.Sprintf("evaluation %d of %s on %s at %s: %s; %s", e.ID, e.Project, e.Branch, short(e.Commit), e.Status, builds)
}

// watchResult is nil when everything succeeded, else a failedError that names what failed.
func watchResult(e apiv1.EvaluationDetail, failed apiv1.FailureList) error {
	if e.Status == status.EvalFailed || e.Status == status.EvalCancelled {
		msg := fmt.Sprintf("evaluation %d %s", e.ID, e.Status)
		if e.Error != "" {
			msg += ": " + firstLine(e.Error)
		}
		return failedError{msg}
	}
	if len(failed.Failures) > 0 {
		names := make([]string, 0, len(failed.Failures))
		for _, f := range failed.Failures {
			names = append(names, f.Name+" ("+f.Status+")")
		}
		return failedError{fmt.Sprintf("evaluation %d: %d failed: %s; see `harmonia-ci failures %d`",
			e.ID, len(names), strings.Join(names, ", "), e.ID)}
	}
	for _, s := range []status.JobStatus{status.JobFailed, status.JobDepFailed, status.JobCancelled} {
		if n := e.Builds[s]; n > 0 {
			return failedError{fmt.Sprintf("evaluation %d: %d builds %s", e.ID, n, s)}
		}
	}
	return nil
}

func newFailures(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "failures EVAL",
		Short: "Each failed attribute of an evaluation, with the end of its log",
		Long: `failures lists, over HTTP (--server), the attributes of an evaluation that did not evaluate
or whose build failed or dep-failed, each with the last 4 KiB of the failed build's log (for a
dep-failed one, its failed dependency's). --json prints the API's failures object.`,
	}
	remoteOnly(g, cmd, parseID, 2*time.Minute, func(ctx context.Context, c *apiclient.Client, id int64) error {
		fl, err := c.Failures(ctx, id)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(cmd.OutOrStdout(), fl)
		}
		return writeFailures(cmd.OutOrStdout(), fl)
	})
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeFailures prints each failure: a heading, then its log tail.
func writeFailures(w io.Writer, fl apiv1.FailureList) error {
	if len(fl.Failures) == 0 {
		_, err := fmt.Fprintf(w, "evaluation %d (%s): no failed attributes\n", fl.EvaluationID, fl.Status)
		return err
	}
	for _, f := range fl.Failures {
		head := fmt.Sprintf("=== %s: %s", f.Name, f.Status)
		if f.BuildID != nil {
			head += fmt.Sprintf(" (build %d)", *f.BuildID)
		}
		fmt.Fprintln(w, head)
		for _, e := range []string{f.EvalError, f.BuildError} {
			if e != "" {
				fmt.Fprintf(w, "error: %s\n", strings.TrimPrefix(firstLine(e), "error: "))
			}
		}
		if f.LogTail != "" {
			if f.LogBuildID != nil && (f.BuildID == nil || *f.LogBuildID != *f.BuildID) {
				fmt.Fprintf(w, "log of build %d, which it depends on:\n", *f.LogBuildID)
			}
			fmt.Fprint(w, f.LogTail)
			if !strings.HasSuffix(f.LogTail, "\n") {
				fmt.Fprintln(w)
			}
		}
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
	}
	return nil
}

func newLog(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "log JOB",
		Short: "Print a build's log, following a running build's until it finishes",
		Long: `log prints, over HTTP (--server), a finished build's log, or follows a running one's as it
is written until the build ends. It exits 0 when the build succeeded, 1 when it did not.`,
	}
	return remoteOnly(g, cmd, parseJobID, 0, func(ctx context.Context, c *apiclient.Client, id int64) error {
		end, err := c.Log(ctx, id, cmd.OutOrStdout())
		if err != nil {
			return err
		}
		if end.Status != status.JobSucceeded {
			msg := fmt.Sprintf("build %d %s", id, end.Status)
			if end.Error != "" {
				msg += ": " + firstLine(end.Error)
			}
			return failedError{msg}
		}
		return nil
	})
}

// remoteOnly makes cmd a command that works over HTTP only, on one id (checked by parse): run
// gets the client and a context that ends at a signal or after limit (0: none).
func remoteOnly(g *globalFlags, cmd *cobra.Command, parse func(string) (int64, error), limit time.Duration,
	run func(ctx context.Context, c *apiclient.Client, id int64) error) *cobra.Command {
	cmd.Args = cobra.ExactArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		id, err := parse(args[0])
		if err != nil {
			return err
		}
		c, err := g.requireRemote(cmd)
		if err != nil {
			return err
		}
		ctx, cancel := remoteContext(cmd, limit)
		defer cancel()
		return run(ctx, c, id)
	}
	return cmd
}
