package cli

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/signer"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// progress is what `run` shows while it waits.
type progress struct {
	evalStatus status.EvalStatus
	attrs      int
	counts     map[status.JobStatus]int
}

func (p progress) total() int {
	n := 0
	for _, c := range p.counts {
		n += c
	}
	return n
}

func (p progress) active() int {
	n := 0
	for _, s := range status.UnfinishedJobs() {
		n += p.counts[s]
	}
	return n
}

func (p progress) line(elapsed time.Duration, bar bool) string {
	el := elapsed.Truncate(time.Second).String()
	if p.evalStatus.Unfinished() {
		if bar {
			return fmt.Sprintf("evaluating… %d attributes, %d jobs so far  %s", p.attrs, p.total(), el)
		}
		return fmt.Sprintf("evaluating: %d attributes, %d jobs so far (%s)", p.attrs, p.total(), el)
	}
	var done, failed, running int
	for s, n := range p.counts {
		switch {
		case s == status.JobSucceeded:
			done += n
		case s.Terminal(): // failed, dep-failed or cancelled: not built
			failed += n
		case s.Claimed():
			running += n
		}
	}
	total := p.total()
	text := fmt.Sprintf("%d/%d built, %d running, %d failed", done, total, running, failed)
	if !bar {
		return text + " (" + el + ")"
	}
	const width = 30
	filled := 0
	if total > 0 {
		filled = (done + failed) * width / total
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "] " + text + "  " + el
}

// isTerminal reports whether w is a character device (a terminal), where the progress line is
// redrawn in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// follow shows progress until the evaluation is over and none of its jobs is pending or running.
func (r *runner) follow(ctx context.Context, pool *pgxpool.Pool, id int64, start time.Time) (evaluation.Evaluation, error) {
	bar := isTerminal(r.errOut)
	var last string
	lastPrint := time.Time{}
	defer func() {
		if bar && last != "" {
			fmt.Fprint(r.errOut, "\r\033[K")
		}
	}()
	for {
		e, err := evaluation.Get(ctx, pool, id)
		if err != nil {
			return e, err
		}
		counts, err := evaluation.JobCounts(ctx, pool, id)
		if err != nil {
			return e, err
		}
		attrs, err := evaluation.Attrs(ctx, pool, id)
		if err != nil {
			return e, err
		}
		p := progress{evalStatus: e.Status, attrs: len(attrs), counts: counts}
		if e.Finished() && p.active() == 0 {
			return e, nil
		}
		line := p.line(time.Since(start), bar)
		switch {
		case bar:
			fmt.Fprint(r.errOut, "\r\033[K"+line)
			last = line
		case stripElapsed(line) != stripElapsed(last) || time.Since(lastPrint) > 30*time.Second:
			fmt.Fprintln(r.errOut, line)
			last, lastPrint = line, time.Now()
		}
		select {
		case <-ctx.Done():
			return e, fmt.Errorf("interrupted: evaluation %d goes on in the cluster if one runs (harmonia-ci up)", id)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func stripElapsed(line string) string {
	if i := strings.LastIndex(line, " ("); i >= 0 {
		return line[:i]
	}
	return line
}

// summary prints the table of attributes and where the results are, and fails when anything did.
func (r *runner) summary(ctx context.Context, pool *pgxpool.Pool, e evaluation.Evaluation, elapsed time.Duration) error {
	attrs, err := evaluation.Attrs(ctx, pool, e.ID)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(r.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTRIBUTE\tSTATUS\tDURATION\tSTORE PATH")
	failed := 0
	for _, a := range attrs {
		shown, dur, path := string(a.JobStatus), "-", "-"
		switch {
		case a.Error != "":
			shown = "eval-error"
		case a.JobStatus == "":
			shown = "cached"
		}
		built := a.Error == "" && (a.JobStatus == status.JobSucceeded || a.JobStatus == "")
		if a.StartedAt != nil && a.FinishedAt != nil {
			dur = a.FinishedAt.Sub(*a.StartedAt).Round(10 * time.Millisecond).String()
		}
		if len(a.Outputs) > 0 && built {
			path = strings.Join(a.Outputs, " ")
		}
		if !built {
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Attr, shown, dur, path)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range attrs {
		switch {
		case a.Error != "":
			fmt.Fprintf(r.out, "\n%s: evaluation error: %s\n", a.Attr, firstLine(a.Error))
		case a.JobStatus == status.JobFailed && a.JobError != "":
			fmt.Fprintf(r.out, "\n%s: %s\n", a.Attr, firstLine(a.JobError))
		}
	}
	if e.Error != "" {
		fmt.Fprintf(r.out, "\nevaluation %s: %s\n", e.Status, e.Error)
	}

	keys, err := signer.TrustedKeys(ctx, pool)
	if err != nil {
		return err
	}
	cacheURL := r.cacheURL()
	fmt.Fprintf(r.out, "\n%d attributes in %s\n", len(attrs), elapsed.Round(100*time.Millisecond))
	fmt.Fprintf(r.out, "cache:      %s\n", cacheURL)
	fmt.Fprintf(r.out, "public key: %s\n", strings.Join(keys, " "))
	fmt.Fprintf(r.out, "substitute: nix-store --realise PATH --option substituters %s --option trusted-public-keys '%s'\n",
		cacheURL, strings.Join(keys, " "))

	switch {
	case e.Status == status.EvalFailed || e.Status == status.EvalCancelled:
		return fmt.Errorf("evaluation %d %s", e.ID, e.Status)
	case failed > 0:
		return fmt.Errorf("%d of %d attributes failed", failed, len(attrs))
	}
	return nil
}

// cacheURL is where Nix substitutes from once run has exited: the local cache directory itself
// (a file:// binary cache), or the S3 bucket.
func (r *runner) cacheURL() string {
	c := r.cfg.Cache
	if c.Store == "s3" {
		q := url.Values{"endpoint": {c.S3.Endpoint}, "region": {c.S3.Region}}
		return "s3://" + c.S3.Bucket + "?" + q.Encode()
	}
	dir := c.Dir
	if dir == "" {
		dir = filepath.Join(r.cfg.StateDir, "cache")
	}
	return "file://" + dir
}
