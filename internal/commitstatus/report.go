package commitstatus

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// The commit status contexts harmonia-ci reports: one for the evaluation, one combined status
// for all its builds (never one per attribute, which would exhaust GitHub's 1000 statuses per
// commit on large projects).
const (
	ContextEval  = "harmonia-ci/nix-eval"
	ContextBuild = "harmonia-ci/nix-build"
)

// Report is the pair of statuses an evaluation's commit should show. A context whose State is
// "" has nothing to say yet (nix-build before the evaluation has finished). Its JSON is what
// evaluations.last_status and reported_status hold.
type Report struct {
	Eval  Line `json:"eval"`
	Build Line `json:"build"`
}

// Line is one context's status.
type Line struct {
	State       forge.State `json:"state,omitempty"`
	Description string      `json:"description,omitempty"`
	TargetURL   string      `json:"url,omitempty"`
}

func (l Line) status(context string) forge.Status {
	return forge.Status{Context: context, State: l.State, Description: l.Description, TargetURL: l.TargetURL}
}

func (l Line) final() bool {
	return l.State == forge.StateSuccess || l.State == forge.StateFailure || l.State == forge.StateError
}

// Final reports whether the report will not change unless someone acts (a rebuild or a
// re-evaluation): the evaluation has finished and so have its builds, or it has none.
func (r Report) Final() bool {
	return r.Eval.final() && (r.Build.final() || r.Build.State == "")
}

func (r Report) encode() string {
	b, _ := json.Marshal(r)
	return string(b)
}

func decodeReport(s *string) Report {
	var r Report
	if s != nil {
		_ = json.Unmarshal([]byte(*s), &r) // a malformed value counts as nothing reported
	}
	return r
}

// lines pairs the contexts with their lines, in reporting order.
func (r *Report) lines() []struct {
	context string
	line    *Line
} {
	return []struct {
		context string
		line    *Line
	}{{ContextEval, &r.Eval}, {ContextBuild, &r.Build}}
}

// evalState is what compute needs of an evaluation.
type evalState struct {
	ID         int64
	Status     status.EvalStatus
	Error      string
	ReusesEval *int64
	Project    string
	// Its attributes' build jobs.
	Attrs, AttrErrors                   int
	Total, Succeeded, Failed, Cancelled int
	Pending                             int
	FirstFailedJob                      int64 // 0 if none
	// Flaky counts the succeeded builds that failed before without a change.
	Flaky int
	// Against the evaluation before it, once its builds are done (evaluation.Diff): attributes
	// newly failing (new ones that fail included) and fixed.
	NewlyFailing, NewlyFixed               int
	Forge, FullName, Commit                string
	InstallationID                         int64
	LastStatus                             *string
	ReportedStatus                         *string
	ReportAttempts                         int
	ProjectEnabled, ForgeProjectConfigured bool
}

// Links builds the web UI's URLs statuses point at.
type Links struct {
	// Base is the public URL of the frontends, without a trailing slash.
	Base string
}

// Eval is an evaluation's page.
func (l Links) Eval(project string, id int64) string {
	return l.Base + "/ci/" + url.PathEscape(project) + "/eval/" + strconv.FormatInt(id, 10)
}

// Build is a build's page.
func (l Links) Build(project string, jobID int64) string {
	return l.Base + "/ci/" + url.PathEscape(project) + "/build/" + strconv.FormatInt(jobID, 10)
}

// compute derives the report from the evaluation's state.
func compute(s evalState, links Links) Report {
	evalURL := links.Eval(s.Project, s.ID)
	var r Report
	switch s.Status {
	case status.EvalQueued, status.EvalRunning:
		r.Eval = Line{forge.StatePending, "queued", evalURL}
		if s.Status == status.EvalRunning {
			r.Eval.Description = "evaluating"
		}
		// Evaluated again (re-evaluation, a push back to this commit): the commit's old
		// nix-build status no longer holds.
		if decodeReport(s.LastStatus).Build.State != "" {
			r.Build = Line{forge.StatePending, "waiting for the evaluation", evalURL}
		}
	case status.EvalFailed:
		r.Eval = Line{forge.StateFailure, oneLine("evaluation failed: " + strings.TrimSpace(s.Error)), evalURL}
	case status.EvalCancelled:
		why := "cancelled"
		switch {
		case strings.HasPrefix(s.Error, evaluation.ConflictPrefix):
			why = oneLine(s.Error) // a pull request that does not merge into its base
		case strings.Contains(s.Error, "superseded"):
			why = "superseded by a newer commit"
		}
		r.Eval = Line{forge.StateError, why, evalURL}
	case status.EvalSucceeded, status.EvalSkipped:
		switch {
		case s.AttrErrors > 0:
			r.Eval = Line{forge.StateFailure, fmt.Sprintf("%d of %d attributes failed to evaluate", s.AttrErrors, s.Attrs), evalURL}
		case s.Status == status.EvalSkipped && s.ReusesEval != nil:
			r.Eval = Line{forge.StateSuccess, fmt.Sprintf("same tree as evaluation %d: %s", *s.ReusesEval, plural(s.Attrs, "attribute")), evalURL}
		default:
			r.Eval = Line{forge.StateSuccess, "evaluated " + plural(s.Attrs, "attribute"), evalURL}
		}
		r.Build = buildLine(s, links, evalURL)
	}
	return r
}

// maxProgressSteps bounds the pending nix-build descriptions of one evaluation.
const maxProgressSteps = 50

func buildLine(s evalState, links Links, evalURL string) Line {
	done := s.Succeeded + s.Failed + s.Cancelled
	switch {
	case s.Total == 0:
		return Line{forge.StateSuccess, "nothing to build", evalURL}
	case s.Pending > 0:
		// Progress moves in steps of a 50th of the builds: each step is a forge call, and
		// GitHub keeps at most 1000 statuses per commit.
		step := (s.Total + maxProgressSteps - 1) / maxProgressSteps
		d := fmt.Sprintf("%d/%d builds complete", done-done%step, s.Total)
		if failed := s.Failed - s.Failed%step; failed > 0 {
			d += fmt.Sprintf(", %d failed", failed)
		} else if s.Failed > 0 {
			d += ", some failed" // fewer than a step
		}
		return Line{forge.StatePending, d, evalURL}
	case s.Failed > 0:
		u := evalURL
		if s.FirstFailedJob != 0 {
			u = links.Build(s.Project, s.FirstFailedJob)
		}
		return Line{forge.StateFailure, fmt.Sprintf("%d/%d builds failed", s.Failed, s.Total) + changes(s), u}
	case s.Cancelled > 0:
		return Line{forge.StateError, fmt.Sprintf("%d/%d builds cancelled", s.Cancelled, s.Total), evalURL}
	default:
		return Line{forge.StateSuccess, fmt.Sprintf("%d/%d builds complete", s.Total, s.Total) + changes(s), evalURL}
	}
}

// changes is what changed against the evaluation before s, and its flaky builds, for a final
// description: "" or " (2 newly failing, 1 fixed, 1 flaky)".
func changes(s evalState) string {
	var parts []string
	if s.NewlyFailing > 0 {
		parts = append(parts, fmt.Sprintf("%d newly failing", s.NewlyFailing))
	}
	if s.NewlyFixed > 0 {
		parts = append(parts, fmt.Sprintf("%d fixed", s.NewlyFixed))
	}
	if s.Flaky > 0 {
		parts = append(parts, fmt.Sprintf("%d flaky", s.Flaky))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// oneLine keeps a description to its first line, short enough for every forge.
func oneLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 120 {
		cut := 117
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut-- // never in the middle of a character
		}
		s = s[:cut] + "..."
	}
	return s
}
