package cli

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// The text output both paths share, the database's and the HTTP API's: each converts its own
// records into these rows, so a command prints the same table either way.

// evalRow is one line of `eval list`.
type evalRow struct {
	id                              int64
	project, branch, commit, status string
	created                         time.Time
}

// printEvalList prints evaluations as JSON, as they are, or as the table of rows row makes.
func printEvalList[E any](w io.Writer, es []E, asJSON bool, row func(E) evalRow) error {
	if asJSON {
		return printJSON(w, es)
	}
	rows := make([]evalRow, len(es))
	for i, e := range es {
		rows[i] = row(e)
	}
	return writeEvalList(w, rows)
}

func writeEvalList(w io.Writer, rows []evalRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROJECT\tBRANCH\tCOMMIT\tSTATUS\tCREATED")
	for _, e := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", e.id, e.project, e.branch, short(e.commit), e.status,
			e.created.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// evalHead is what `eval show` says of an evaluation above its attributes.
type evalHead struct {
	evalRow
	nixVersion, evaluator, err string
}

func writeEvalHead(w io.Writer, e evalHead) {
	fmt.Fprintf(w, "evaluation %d of %s at %s on %s: %s\n", e.id, e.project, short(e.commit), e.branch, e.status)
	if e.nixVersion != "" {
		fmt.Fprintf(w, "evaluated by Nix %s on %s\n", e.nixVersion, e.evaluator)
	}
	if e.err != "" {
		fmt.Fprintf(w, "error: %s\n", e.err)
	}
}

// attrRow is one attribute: its derivation (or its evaluation error) and its build's status.
type attrRow struct {
	attr, drv, evalErr, job string
}

func writeAttrs(w io.Writer, rows []attrRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTRIBUTE\tDERIVATION\tJOB")
	for _, a := range rows {
		drv, job := a.drv, a.job
		if a.evalErr != "" {
			drv, job = "error: "+strings.TrimPrefix(firstLine(a.evalErr), "error: "), "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", a.attr, drv, job)
	}
	return tw.Flush()
}

// fieldWriter prints "key  value" lines, leaving out empty values.
type fieldWriter struct{ tw *tabwriter.Writer }

func newFieldWriter(w io.Writer) fieldWriter {
	return fieldWriter{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
}

func (f fieldWriter) row(k, v string) {
	if v != "" {
		fmt.Fprintf(f.tw, "%s\t%s\n", k, v)
	}
}

func (f fieldWriter) flush() error { return f.tw.Flush() }

// jobFields is what `job show` says of a build.
type jobFields struct {
	id                            int64
	drv, project, status, builder string
	attempt, retries, priority    int
	duration                      *time.Duration
	exitCode                      *int
	err, log                      string
	// failures: the build failures a flaky build succeeded after (0: not flaky); retryAt: when
	// a pending job's retry under its project's policy may run (nil: none waiting).
	failures int
	retryAt  *time.Time
}

func (j jobFields) write(f fieldWriter) {
	f.row("job", strconv.FormatInt(j.id, 10))
	f.row("derivation", j.drv)
	f.row("project", j.project)
	f.row("status", j.status)
	f.row("attempt", strconv.Itoa(j.attempt))
	f.row("retries", strconv.Itoa(j.retries))
	f.row("priority", strconv.Itoa(j.priority))
	f.row("builder", j.builder)
	if j.duration != nil {
		f.row("duration", duration(*j.duration))
	}
	if j.exitCode != nil {
		f.row("exit code", strconv.Itoa(*j.exitCode))
	}
	f.row("error", j.err)
	if j.failures > 0 {
		f.row("flaky", fmt.Sprintf("succeeded after %d build failure(s) of the same derivation", j.failures))
	}
	if j.retryAt != nil {
		f.row("retry", "not before "+j.retryAt.UTC().Format(time.RFC3339)+" (a build failure, retried by the project's policy)")
	}
	f.row("log", j.log)
}

// duration is d rounded for people.
func duration(d time.Duration) string { return d.Round(time.Millisecond).String() }
