package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/harmonia-ci/harmonia-ci/internal/apiclient"
	"github.com/harmonia-ci/harmonia-ci/internal/config"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func newEvalCmd(g *globalFlags) *cobra.Command {
	var p eval.TriggerParams
	var wait, asJSON, again bool
	cmd := &cobra.Command{
		Use:   "eval PROJECT [--commit SHA] [--branch B] [--again] [--wait] [--json]",
		Short: "Queue an evaluation of a project's commit (default: the head of its branch)",
		Long: `Queue an evaluation of a project's commit. The same commit and branch twice is one
evaluation; a commit with the same tree as an evaluation that succeeded is recorded as
skipped, reusing its results. With --wait, follow it to the end and print its attributes.

With --again, an evaluation of the commit and branch that has finished (succeeded, failed,
cancelled or skipped) is run again under the same id, as after a failure outside the project
(Nix missing, a crash, a timeout): its attributes are dropped, the pending builds only it
needed are cancelled until it needs them again, and older unfinished evaluations of its branch
are superseded. One that is still queued or running is only followed; one that does not exist
is queued as without --again.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p.Project = args[0]
			var limit time.Duration
			if !wait {
				limit = 2 * time.Minute
			}
			return withDBFor(cmd, g, limit, func(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool) error {
				p.StateDir = cfg.StateDir
				e, created, err := eval.Trigger(ctx, pool, p)
				if err != nil {
					return err
				}
				verb, note := "already requested:", ""
				switch {
				case created && e.Status == status.EvalSkipped:
					verb = fmt.Sprintf("skipped (same tree as evaluation %d):", *e.ReusesEvalID)
				case created:
					verb = "queued"
				case again:
					if e, verb, note, err = evalAgain(ctx, pool, e); err != nil {
						return err
					}
				}
				if !asJSON {
					fmt.Fprintf(cmd.ErrOrStderr(), "%s evaluation %d of %s at %s on %s%s\n", verb, e.ID, e.Project, short(e.Commit), e.Branch, note)
				}
				if !wait {
					return showEval(ctx, cmd.OutOrStdout(), pool, e, false, asJSON)
				}
				if e, err = waitEval(ctx, pool, e.ID); err != nil {
					return err
				}
				if err := showEval(ctx, cmd.OutOrStdout(), pool, e, true, asJSON); err != nil {
					return err
				}
				return waitResult(e)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.Commit, "commit", "", "commit to evaluate (default: the head of the branch)")
	f.StringVar(&p.Branch, "branch", "", "branch (default: the project's branch)")
	f.BoolVar(&again, "again", false, "re-evaluate the commit's evaluation if it has finished")
	f.BoolVar(&wait, "wait", false, "wait for the evaluation to finish and print its attributes")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(newEvalCancel(g), newEvalShow(g), newEvalList(g))
	return cmd
}

// evalAgain re-evaluates e if it has finished; one still queued or running (or re-queued by
// someone else meanwhile) is left to run. It returns the evaluation and what happened: verb
// comes before "evaluation ID of …", note after it.
func evalAgain(ctx context.Context, pool *pgxpool.Pool, e evaluation.Evaluation) (_ evaluation.Evaluation, verb, note string, err error) {
	if e.Finished() {
		again, err := evaluation.Reevaluate(ctx, pool, e.ID)
		if err == nil {
			return again, "re-evaluating", wasNote(e), nil
		}
		if !errors.Is(err, evaluation.ErrNotFinished) {
			return e, "", "", err
		}
		if e, err = evaluation.Get(ctx, pool, e.ID); err != nil {
			return e, "", "", err
		}
	}
	return e, fmt.Sprintf("already %s, nothing to re-evaluate:", e.Status), "", nil
}

// wasNote says how the evaluation prev, now run again, had ended: " (was failed: …)".
func wasNote(prev evaluation.Evaluation) string {
	if prev.Error == "" {
		return fmt.Sprintf(" (was %s)", prev.Status)
	}
	return fmt.Sprintf(" (was %s: %s)", prev.Status, firstLine(prev.Error))
}

func newEvalCancel(g *globalFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a queued or running evaluation",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := g.remote()
			if err != nil {
				return err
			}
			if c != nil {
				return remoteAction(cmd, asJSON, func(ctx context.Context) (apiclient.ActionResult, error) {
					return c.CancelEvaluation(ctx, id)
				})
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				if err := evaluation.Cancel(ctx, pool, id, "cancelled by a user"); err != nil {
					return err
				}
				return printAction(cmd, fmt.Sprintf("cancelled evaluation %d", id), asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newEvalShow(g *globalFlags) *cobra.Command {
	var asJSON, wait, diff bool
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show an evaluation and its attributes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			c, err := g.remote()
			if err != nil {
				return err
			}
			if c != nil {
				return remoteEvalShow(cmd, c, id, wait, diff, asJSON)
			}
			var limit time.Duration
			if !wait {
				limit = 2 * time.Minute
			}
			return withDBFor(cmd, g, limit, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				e, err := evaluation.Get(ctx, pool, id)
				if err != nil {
					return err
				}
				show := showEval
				if diff {
					show = showDiff
				}
				if !wait {
					return show(ctx, cmd.OutOrStdout(), pool, e, true, asJSON)
				}
				if e, err = waitEval(ctx, pool, id); err != nil {
					return err
				}
				if err := show(ctx, cmd.OutOrStdout(), pool, e, true, asJSON); err != nil {
					return err
				}
				return waitResult(e)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the evaluation to finish")
	cmd.Flags().BoolVar(&diff, "diff", false, "show what changed against the evaluation before it (of its branch; a pull request's base)")
	return cmd
}

// showDiff prints what changed in e against the evaluation before it, instead of its
// attributes.
func showDiff(ctx context.Context, w io.Writer, pool *pgxpool.Pool, e evaluation.Evaluation, _, asJSON bool) error {
	d, err := evaluation.DiffOf(ctx, pool, e.ID)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(w, d)
	}
	if err := showEval(ctx, w, pool, e, false, false); err != nil {
		return err
	}
	return printDiff(w, d)
}

// printDiff prints a diff under its evaluation's heading: a summary line and a table of the
// changed attributes.
func printDiff(w io.Writer, d evaluation.Diff) error {
	if d.Against == 0 {
		fmt.Fprintln(w, "no earlier finished evaluation to compare with")
		return nil
	}
	summary := d.Summary()
	if summary == "" {
		summary = "nothing newly failing, fixed, new and failing, or removed"
	}
	fmt.Fprintf(w, "against evaluation %d: %s\n", d.Against, summary)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHANGE\tATTRIBUTE")
	for _, g := range []struct {
		what  string
		names []string
	}{
		{"newly failing", d.NewlyFailing}, {"fixed", d.NewlyFixed}, {"still failing", d.StillFailing},
		{"new, failing", d.AddedFailing}, {"new", d.Added}, {"removed", d.Removed},
	} {
		for _, n := range g.names {
			if g.what == "new" && slices.Contains(d.AddedFailing, n) {
				continue // listed as new, failing
			}
			fmt.Fprintf(tw, "%s\t%s\n", g.what, n)
		}
	}
	return tw.Flush()
}

func newEvalList(g *globalFlags) *cobra.Command {
	var asJSON bool
	var limit int
	cmd := &cobra.Command{
		Use:   "list [PROJECT]",
		Short: "List the newest evaluations",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			c, err := g.remote()
			if err != nil {
				return err
			}
			if c != nil {
				return remoteEvalList(cmd, c, name, limit, asJSON)
			}
			return withDB(cmd, g, func(ctx context.Context, _ *config.Config, pool *pgxpool.Pool) error {
				es, err := evaluation.List(ctx, pool, name, limit)
				if err != nil {
					return err
				}
				return printEvalList(cmd.OutOrStdout(), es, asJSON, dbEvalRow)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().IntVar(&limit, "limit", 25, "how many")
	return cmd
}

// waitEval follows an evaluation until it finishes.
func waitEval(ctx context.Context, pool *pgxpool.Pool, id int64) (evaluation.Evaluation, error) {
	for {
		e, err := evaluation.Get(ctx, pool, id)
		if err != nil || e.Finished() {
			return e, err
		}
		select {
		case <-ctx.Done():
			return e, fmt.Errorf("waiting for evaluation %d: %w", id, context.Cause(ctx))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// evalView is the JSON form of an evaluation with its attributes.
type evalView struct {
	evaluation.Evaluation
	Attrs []evaluation.AttrResult `json:"attrs"`
}

func showEval(ctx context.Context, w io.Writer, pool *pgxpool.Pool, e evaluation.Evaluation, withAttrs, asJSON bool) error {
	var attrs []evaluation.AttrResult
	if withAttrs {
		var err error // a skipped evaluation has a copy of the attributes it reuses
		if attrs, err = evaluation.Attrs(ctx, pool, e.ID); err != nil {
			return err
		}
	}
	if asJSON {
		if attrs == nil {
			attrs = []evaluation.AttrResult{}
		}
		return printJSON(w, evalView{Evaluation: e, Attrs: attrs})
	}
	writeEvalHead(w, evalHead{evalRow: dbEvalRow(e), nixVersion: e.NixVersion, evaluator: e.ClaimedBy, err: e.Error})
	if !withAttrs {
		return nil
	}
	rows := make([]attrRow, len(attrs))
	for i, a := range attrs {
		job := string(a.JobStatus)
		if job == "" && a.DrvPath != "" {
			job = "cached"
		}
		rows[i] = attrRow{attr: a.Attr, drv: a.DrvPath, evalErr: a.Error, job: job}
	}
	return writeAttrs(w, rows)
}

// dbEvalRow is an evaluation as `eval list` prints it.
func dbEvalRow(e evaluation.Evaluation) evalRow {
	return evalRow{id: e.ID, project: e.Project, branch: e.Branch, commit: e.Commit, status: string(e.Status), created: e.CreatedAt}
}

// waitResult is the exit status of a command that waited: failing when the evaluation did.
func waitResult(e evaluation.Evaluation) error {
	if e.Status == status.EvalFailed || e.Status == status.EvalCancelled {
		return fmt.Errorf("evaluation %d %s", e.ID, e.Status)
	}
	return nil
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, usageError{fmt.Errorf("evaluation id: want a positive number, got %q", s)}
	}
	return id, nil
}

func short(sha string) string {
	if len(sha) > 12 {
		return sha[:12]
	}
	return sha
}

func firstLine(s string) string {
	for i, c := range s {
		if c == '\n' {
			return s[:i]
		}
	}
	return s
}
