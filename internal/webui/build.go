package webui

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/klauspost/compress/zstd"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const (
	// maxAttempts is the queue's retry limit (a job fails for good after 3 transient failures:
	// queue/queries.go, retry_count < 3), shown as "Attempt n/3".
	maxAttempts = 3
	// buildLogMax is how much of a log the build page shows: its end.
	buildLogMax = 256 << 10
	// logFetchTimeout bounds reading an archived log from a cache node.
	logFetchTimeout = 10 * time.Second
	// maxLogCaches is how many cache nodes a log fetch tries before it gives up.
	maxLogCaches = 3
	// buildListLimit bounds the build page's lists (its evaluations, its dependents).
	buildListLimit = 25
)

// BuildJob is a build job as its page shows it.
type BuildJob struct {
	ID                               int64
	DrvPath, Name, System            string
	Status                           status.JobStatus
	Priority, Attempt, RetryCount    int
	ClaimedBy                        string
	ClaimedAt, StartedAt, FinishedAt *time.Time
	ExitCode                         *int
	Error, LogURL                    string
	CreatedAt                        time.Time
	Project                          string // the project the job was queued for; "" if none
	// Failures counts its build failures; RetryLimit and RetriesUsed are its retry policy's
	// retries and those spent since it was last reset; RetryAt, while a retry waits for its
	// backoff, is when it may be claimed.
	Failures, RetryLimit, RetriesUsed int
	RetryAt                           *time.Time
}

// Flaky says the build succeeded after a build failure of the same derivation.
func (j BuildJob) Flaky() bool { return j.Status == status.JobSucceeded && j.Failures > 0 }

// BuildAttempt is one claim of a build: a tab of its page.
type BuildAttempt struct {
	N                     int
	Node                  string
	StartedAt, FinishedAt *time.Time
	// Status is how the attempt ended (a status.AttemptStatus word), or the job's status for
	// the attempt under way or queued, which has no record yet.
	Status   string
	ExitCode *int
	Error    string
	LogKey   string // its own log's blob key; "" when it has none (or it expired)
	Current  bool   // the job's latest attempt: its log is the build's log
}

// Href is the tab's link.
func (a BuildAttempt) Href() string { return fmt.Sprintf("?attempt=%d#attempts", a.N) }

// BuildEval is an evaluation that has the build's derivation as an attribute.
type BuildEval struct {
	ID                            int64
	Project, Branch, Commit, Attr string
	Status                        status.EvalStatus
	CreatedAt                     time.Time
	CommitURL                     string // on the forge; "" if none
}

// BuildDependent is a build that takes the build's outputs as inputs.
type BuildDependent struct {
	ID     int64
	Name   string
	Status status.JobStatus
}

// BuildOutput is one of a build's outputs.
type BuildOutput struct {
	Name, Path string
	NarHash    string // what the cache serves; "" before a build
	// Quarantined: only pull requests built it, so anonymous cache users do not get it.
	Quarantined bool
	// NonReproducible is the NAR hash of the pull request's build that a trusted rebuild
	// (NarHash) did not reproduce; "" when none.
	NonReproducible string
}

// repoRef is where a listed row's project lives, to decide whether the viewer may see it.
type repoRef struct {
	private         bool
	forge, fullName string
}

// LogView is the log part of a build page.
type LogView struct {
	Text string
	// Stream is the live log's event stream (GET /api/builds/{id}/log) for a build that may
	// still write to it; "" for a finished build.
	Stream string
	// Raw is the archived log's address ("/log/<drv>"); "" when the build has none (yet).
	Raw string
	// Note says how much of the log Text is ("showing the last 256 KiB of 12.0 MiB").
	Note string
	// Missing says why there is no log to show; "" when there is one.
	Missing string
}

// BuildPage is a build page's data.
type BuildPage struct {
	Project     string // the project of the page's URL
	Job         BuildJob
	MaxAttempts int
	Evals       []BuildEval
	Dependents  []BuildDependent
	Outputs     []BuildOutput
	Log         LogView
	// Tries are the build's attempts, the first first, and Shown the one whose log Log is.
	// FirstFailed is the attempt whose failure the failed build still stands on (later
	// evaluations reuse the failure without building again); nil unless the build failed.
	Tries       []BuildAttempt
	Shown       int
	FirstFailed *BuildAttempt
	// Actions are who rebuilt or cancelled the build, newest first.
	Actions []AuditEntry
}

// Attempts is the job's "n/3", or just "n" past the retry limit (manual rebuilds keep counting).
func (p BuildPage) Attempts() string {
	if p.Job.Attempt > p.MaxAttempts {
		return fmt.Sprint(p.Job.Attempt)
	}
	return fmt.Sprintf("%d/%d", p.Job.Attempt, p.MaxAttempts)
}

// buildPageHandler serves GET /ci/{project}/build/{id}. Its log fetch is bounded by
// logFetchTimeout, not by the page's database timeout, so it gets the request's own context.
func (u *UI) buildPageHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logCtx := r.Context()
		u.page(func(w http.ResponseWriter, r *http.Request) (string, Page, error) {
			return u.buildPage(r, logCtx)
		}).ServeHTTP(w, r)
	})
}

func (u *UI) buildPage(r *http.Request, logCtx context.Context) (string, Page, error) {
	ctx := r.Context()
	id, err := pathID(r, "build")
	if err != nil {
		return "", Page{}, err
	}
	p := BuildPage{Project: r.PathValue("project"), MaxAttempts: maxAttempts}
	j := &p.Job
	var projectExists bool
	err = u.cfg.Pool.QueryRow(ctx, sqlBuildJob, id, p.Project).Scan(&j.ID, &j.DrvPath, &j.Name, &j.System, &j.Status,
		&j.Priority, &j.Attempt, &j.RetryCount, &j.ClaimedBy, &j.ClaimedAt, &j.StartedAt, &j.FinishedAt, &j.ExitCode,
		&j.Error, &j.LogURL, &j.CreatedAt, &j.Project, &projectExists, &j.Failures, &j.RetryLimit, &j.RetriesUsed, &j.RetryAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "", Page{}, notFound("no build %d", id)
	case err != nil:
		return "", Page{}, fmt.Errorf("read build %d: %w", id, err)
	case !projectExists:
		return "", Page{}, notFound("no project %s", p.Project)
	}
	// The URL's project is readable (the route checked it), but the job may be shown under
	// any project's URL: the job's own owners decide (access.Rule.MayReadJob).
	if ok, err := u.rule.MayReadJob(ctx, u.Caller(r), id); err != nil {
		return "", Page{}, err
	} else if !ok {
		return "", Page{}, notFound("no build %d", id)
	}
	// A derivation may be shared with other projects: list only what the viewer may see.
	rows, err := u.cfg.Pool.Query(ctx, sqlBuildEvals, j.DrvPath, buildListLimit)
	if err != nil {
		return "", Page{}, fmt.Errorf("evaluations of build %d: %w", id, err)
	}
	var e BuildEval
	var ref repoRef
	if _, err := pgx.ForEachRow(rows, []any{&e.ID, &e.Project, &e.Branch, &e.Commit, &e.Status, &e.Attr, &e.CreatedAt,
		&ref.private, &ref.forge, &ref.fullName}, func() error {
		if ok, err := u.canSee(r, ref.private, ref.forge, ref.fullName); err != nil || !ok {
			return err
		}
		if f, ok := u.cfg.Forges[ref.forge]; ok {
			owner, name, _ := strings.Cut(ref.fullName, "/")
			e.CommitURL = f.CommitURL(forge.Repo{Owner: owner, Name: name}, e.Commit)
		} else {
			e.CommitURL = ""
		}
		p.Evals = append(p.Evals, e)
		return nil
	}); err != nil {
		return "", Page{}, fmt.Errorf("evaluations of build %d: %w", id, err)
	}
	rows, err = u.cfg.Pool.Query(ctx, sqlBuildDependents, j.DrvPath, buildListLimit)
	if err != nil {
		return "", Page{}, fmt.Errorf("dependents of build %d: %w", id, err)
	}
	var d BuildDependent
	if _, err := pgx.ForEachRow(rows, []any{&d.ID, &d.Name, &d.Status, &ref.private, &ref.forge, &ref.fullName}, func() error {
		if ok, err := u.canSee(r, ref.private, ref.forge, ref.fullName); err != nil || !ok {
			return err
		}
		p.Dependents = append(p.Dependents, d)
		return nil
	}); err != nil {
		return "", Page{}, fmt.Errorf("dependents of build %d: %w", id, err)
	}

	rows, err = u.cfg.Pool.Query(ctx, sqlBuildOutputs, j.DrvPath)
	if err != nil {
		return "", Page{}, fmt.Errorf("outputs of build %d: %w", id, err)
	}
	var o BuildOutput
	if _, err := pgx.ForEachRow(rows, []any{&o.Name, &o.Path, &o.NarHash, &o.Quarantined, &o.NonReproducible}, func() error {
		p.Outputs = append(p.Outputs, o)
		return nil
	}); err != nil {
		return "", Page{}, fmt.Errorf("outputs of build %d: %w", id, err)
	}

	if err := u.readAttempts(ctx, r, &p); err != nil {
		return "", Page{}, err
	}
	if p.Actions, err = u.audit(ctx, "build", id); err != nil {
		return "", Page{}, err
	}

	lctx, cancel := context.WithTimeout(logCtx, logFetchTimeout)
	defer cancel()
	if shown := p.ShownAttempt(); shown != nil && !shown.Current {
		p.Log = u.attemptLogView(lctx, *j, *shown)
	} else {
		p.Log = u.logView(lctx, *j)
	}
	return "build", Page{Title: fmt.Sprintf("%s · build %d", j.Name, j.ID), Data: p}, nil
}

// readAttempts reads the build's attempts into p, with the attempt the page shows (?attempt=N,
// else the latest) and, for a failed build, the attempt that failed first.
func (u *UI) readAttempts(ctx context.Context, r *http.Request, p *BuildPage) error {
	j := &p.Job
	rows, err := u.cfg.Pool.Query(ctx, sqlBuildAttempts, j.ID)
	if err != nil {
		return fmt.Errorf("attempts of build %d: %w", j.ID, err)
	}
	var a BuildAttempt
	var st status.AttemptStatus
	if _, err := pgx.ForEachRow(rows, []any{&a.N, &a.Node, &a.StartedAt, &a.FinishedAt, &st, &a.ExitCode, &a.Error, &a.LogKey}, func() error {
		a.Status = string(st)
		p.Tries = append(p.Tries, a)
		a = BuildAttempt{} // fresh pointers for the next row's scan
		return nil
	}); err != nil {
		return fmt.Errorf("attempts of build %d: %w", j.ID, err)
	}
	switch {
	case j.Status.Claimed():
		// The running attempt is recorded when it ends.
		p.Tries = append(p.Tries, BuildAttempt{N: j.Attempt, Node: j.ClaimedBy, StartedAt: j.StartedAt, Status: string(j.Status)})
	case j.Status == status.JobPending && len(p.Tries) > 0:
		p.Tries = append(p.Tries, BuildAttempt{N: j.Attempt + 1, Status: string(j.Status)})
	}
	if len(p.Tries) == 0 {
		return nil
	}
	p.Tries[len(p.Tries)-1].Current = true
	p.Shown = p.Tries[len(p.Tries)-1].N
	if n, err := strconv.Atoi(r.URL.Query().Get("attempt")); err == nil && p.attempt(n) != nil {
		p.Shown = n
	}
	if j.Status == status.JobFailed {
		// The run of failures the build ends with: a retry that failed again does not
		// change where the failure started.
		for i := len(p.Tries) - 1; i >= 0 && status.AttemptStatus(p.Tries[i].Status).Failed(); i-- {
			p.FirstFailed = &p.Tries[i]
		}
	}
	return nil
}

// attempt is attempt n of the page's build, or nil.
func (p BuildPage) attempt(n int) *BuildAttempt {
	for i := range p.Tries {
		if p.Tries[i].N == n {
			return &p.Tries[i]
		}
	}
	return nil
}

// FlakyNote is "failed 1 of 2 attempts" for a flaky build, "" otherwise. The attempts are those
// that built (succeeded or failed), at least the failures and the success.
func (p BuildPage) FlakyNote() string {
	if !p.Job.Flaky() {
		return ""
	}
	built := 0
	for _, a := range p.Tries {
		if st := status.AttemptStatus(a.Status); st == status.AttemptSucceeded || st == status.AttemptFailed {
			built++
		}
	}
	built = max(built, p.Job.Failures+1)
	return fmt.Sprintf("failed %d of %d attempts", p.Job.Failures, built)
}

// ShownAttempt is the attempt whose log the page shows, or nil for a build without any.
func (p BuildPage) ShownAttempt() *BuildAttempt { return p.attempt(p.Shown) }

// attemptLogView reads the end of an earlier attempt's own log.
func (u *UI) attemptLogView(ctx context.Context, j BuildJob, a BuildAttempt) LogView {
	v := LogView{Raw: blob.LogPath(a.LogKey)}
	if v.Raw == "" {
		v.Missing = "This attempt's log was not kept: it uploaded none, or it is past retention.log_retention."
		return v
	}
	tail, err := u.logSource().Archived(ctx, v.Raw, buildLogMax)
	switch {
	case errors.Is(err, ErrNoLog):
		v.Raw = ""
		v.Missing = "This attempt's log was deleted: logs are kept for retention.log_retention (30 days by default)."
	case err != nil:
		u.log.Warn("attempt log unavailable", "build_id", j.ID, "attempt", a.N, "error", err)
		v.Missing = "The log could not be read from the cache right now."
	default:
		v.Text = tail.Text
		if tail.Truncated {
			v.Note = fmt.Sprintf("showing the last %s of %s", byteSize(buildLogMax), byteSize(tail.Size))
		}
	}
	return v
}

// logView reads the end of job's log for its page; a log that cannot be read is a note on the
// page, not a failed page.
func (u *UI) logView(ctx context.Context, j BuildJob) LogView {
	v := LogView{Raw: blob.LogPath(j.LogURL)}
	tail, err := u.logSource().Tail(ctx, j.ID, buildLogMax)
	switch {
	case errors.Is(err, ErrNoLog):
		v.Raw = ""
		v.Missing = "This build has no log."
		switch {
		case j.Status.Unfinished():
			v.Missing = "No output yet."
		case j.Status == status.JobSucceeded && j.LogURL == "":
			// A succeeded build always uploads its log; the garbage collector clears log_url
			// when it deletes one past log retention.
			v.Missing = "This build's log was deleted: logs are kept for retention.log_retention (30 days by default)."
		}
	case err != nil:
		u.log.Warn("build log unavailable", "build_id", j.ID, "error", err)
		v.Missing = "The log could not be read from the cache right now."
	default:
		v.Text = tail.Text
		if tail.Truncated {
			what := "of the log"
			if tail.Size > 0 {
				what = "of " + byteSize(tail.Size)
			}
			v.Note = fmt.Sprintf("showing the last %s %s", byteSize(buildLogMax), what)
			if tail.Live {
				v.Note = "showing the last lines (the full log is archived when the build ends)"
			}
		}
		if tail.Live {
			v.Raw = ""
		}
	}
	if j.Status.Unfinished() { // it may still write to its log
		v.Stream = fmt.Sprintf("/api/builds/%d/log", j.ID)
	}
	return v
}

// LogTail is the end of build jobID's log, at most max bytes, read as the build page reads it.
func (u *UI) LogTail(ctx context.Context, jobID int64, max int) (LogTail, error) {
	return u.logSource().Tail(ctx, jobID, max)
}

// logSource is where the build page reads logs from: the live tail in the database, the
// archive from a cache node.
func (u *UI) logSource() LogSource { return &cacheLogs{pool: u.cfg.Pool, client: logClient} }

// logClient fetches archived logs from cache nodes (bounded by the callers' contexts).
var logClient = &http.Client{Timeout: logFetchTimeout}

// LogSource reads the end of a build's log.
type LogSource interface {
	// Tail returns at most the last max bytes of job jobID's log: its live tail while it may
	// still run, the archived log once it finished. It returns an error wrapping ErrNoLog when
	// the job or its log does not exist.
	Tail(ctx context.Context, jobID int64, max int) (LogTail, error)
	// Archived returns at most the last max bytes of the archived log a cache serves at loc
	// ("/log/…"), an error wrapping ErrNoLog when it does not exist.
	Archived(ctx context.Context, loc string, max int) (LogTail, error)
}

// LogTail is the end of a log.
type LogTail struct {
	Text      string // valid UTF-8, terminal control sequences removed
	Size      int64  // the whole log's size in bytes (a live tail's own size)
	Truncated bool   // Text is not the whole log
	Live      bool   // the live tail of a build that may still run
}

// ErrNoLog means a build has no log (yet).
var ErrNoLog = errors.New("no log")

// cacheLogs is the LogSource of a node: build_log_tails for running builds, and the archive
// through GET /log/<drv> on a live cache node (any: they share the store) for finished ones.
type cacheLogs struct {
	pool   *pgxpool.Pool
	client *http.Client
}

func (c *cacheLogs) Tail(ctx context.Context, jobID int64, max int) (LogTail, error) {
	var st status.JobStatus
	var logURL string
	var live []byte
	err := c.pool.QueryRow(ctx, sqlBuildLogState, jobID).Scan(&st, &logURL, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return LogTail{}, fmt.Errorf("build %d: %w", jobID, ErrNoLog)
	}
	if err != nil {
		return LogTail{}, fmt.Errorf("read log state of build %d: %w", jobID, err)
	}
	if st.Unfinished() { // the log is still being written: its live tail is all there is
		if live == nil {
			return LogTail{}, fmt.Errorf("build %d: %w", jobID, ErrNoLog)
		}
		t := tailOf(live, int64(len(live)), max)
		t.Live = true
		return t, nil
	}
	loc := blob.LogPath(logURL)
	if loc == "" {
		return LogTail{}, fmt.Errorf("build %d: %w", jobID, ErrNoLog)
	}
	return c.Archived(ctx, loc, max)
}

func (c *cacheLogs) Archived(ctx context.Context, loc string, max int) (LogTail, error) {
	rows, err := c.pool.Query(ctx, sqlCacheEndpoints)
	if err != nil {
		return LogTail{}, fmt.Errorf("find cache nodes: %w", err)
	}
	endpoints, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return LogTail{}, fmt.Errorf("find cache nodes: %w", err)
	}
	if len(endpoints) == 0 {
		return LogTail{}, errors.New("no cache node is active")
	}
	var errs []error
	for _, ep := range endpoints[:min(len(endpoints), maxLogCaches)] {
		t, err := c.fetch(ctx, strings.TrimRight(ep, "/")+loc, max)
		if err == nil || errors.Is(err, ErrNoLog) || ctx.Err() != nil {
			return t, err
		}
		errs = append(errs, err)
	}
	return LogTail{}, errors.Join(errs...)
}

// fetch reads the end of the log at addr, decompressing it here if the cache sends it as
// stored (zstd): a log is read whole, so it crosses the network compressed.
func (c *cacheLogs) fetch(ctx context.Context, addr string, max int) (LogTail, error) {
	if u, err := url.Parse(addr); err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return LogTail{}, fmt.Errorf("cache node endpoint %q is not an http(s) URL", addr)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr, nil)
	if err != nil {
		return LogTail{}, err
	}
	req.Header.Set("Accept-Encoding", "zstd")
	resp, err := c.client.Do(req)
	if err != nil {
		return LogTail{}, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return LogTail{}, fmt.Errorf("GET %s: %w", addr, ErrNoLog)
	case resp.StatusCode != http.StatusOK:
		return LogTail{}, fmt.Errorf("GET %s: %s", addr, resp.Status)
	}
	var body io.Reader = resp.Body
	if strings.EqualFold(resp.Header.Get("Content-Encoding"), "zstd") {
		dec, err := zstd.NewReader(resp.Body, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<30))
		if err != nil {
			return LogTail{}, fmt.Errorf("GET %s: %w", addr, err)
		}
		defer dec.Close()
		body = dec
	}
	tb := &tailBuffer{max: max}
	if _, err := io.Copy(tb, body); err != nil {
		return LogTail{}, fmt.Errorf("GET %s: %w", addr, err)
	}
	return tailOf(tb.bytes(), tb.size, max), nil
}

// tailBuffer keeps the last max bytes written to it, and counts them all.
type tailBuffer struct {
	max  int
	buf  []byte
	size int64
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.size += int64(len(p))
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*t.max { // amortised: shift once per max bytes
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) bytes() []byte { return t.buf[max(0, len(t.buf)-t.max):] }

// tailOf is the end of a log of size bytes whose last bytes are b: at most max bytes, starting
// at a line if it was cut, cleaned up for the page.
func tailOf(b []byte, size int64, max int) LogTail {
	t := LogTail{Size: size, Truncated: int64(len(b)) < size}
	if len(b) > max {
		b, t.Truncated = b[len(b)-max:], true
	}
	if t.Truncated {
		if i := bytes.IndexByte(b, '\n'); i >= 0 && i < len(b)-1 {
			b = b[i+1:] // the first line is a fragment
		}
	}
	t.Text = cleanLog(b)
	return t
}

// ansiEscape matches terminal control sequences (colours, cursor movement).
var ansiEscape = regexp.MustCompile(`\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])`)

// cleanLog makes log bytes readable on a page: valid UTF-8, no terminal control sequences,
// and each line as a terminal ends up showing it (progress output redraws its line with '\r').
func cleanLog(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = ansiEscape.ReplaceAllString(s, "")
	s = strings.ReplaceAll(s, "\r\n", "\n")
	if !strings.Contains(s, "\r") {
		return s
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		l = strings.TrimRight(l, "\r")
		if j := strings.LastIndexByte(l, '\r'); j >= 0 {
			l = l[j+1:]
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}

// byteSize formats a size for people: "512 B", "256 KiB", "12.3 MiB".
func byteSize(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
}
