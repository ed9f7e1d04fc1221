package webui

import (
	"fmt"
	"html/template"
	"net/url"
	"strconv"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// funcs are the helpers every template may use.
var funcs = template.FuncMap{
	"short":    shortSHA,
	"ago":      ago,
	"duration": duration,
	"between":  between,
	"status":   func(word any) string { return statusClass(fmt.Sprint(word)) }, // a typed status or a plain word
	"query":    func(k, v string) string { return url.Values{k: {v}}.Encode() },
	"pathesc":  url.PathEscape,
	"plus":     func(a, b int) int { return a + b },
	"itoa":     func(n int64) string { return strconv.FormatInt(n, 10) },
	"deref":    deref,
	// nowms is the render time, in Unix milliseconds: a live stream opened from the page
	// catches up on what changed since.
	"nowms":    func() int64 { return time.Now().UnixMilli() },
	"joinList": joinList, // browse.go
}

// deref is what a *string, *int64 or *status.EvalStatus points at, or its zero value.
func deref(v any) any {
	switch p := v.(type) {
	case *string:
		if p == nil {
			return ""
		}
		return *p
	case *status.EvalStatus:
		if p == nil {
			return status.EvalStatus("")
		}
		return *p
	case *int64:
		if p == nil {
			return int64(0)
		}
		return *p
	}
	return v
}

// shortSHA is a commit's first 12 characters.
func shortSHA(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

// ago says how long ago t was, coarsely ("3 min ago"); "" for a nil or zero time.
func ago(t any) string {
	tm, ok := timeOf(t)
	if !ok {
		return ""
	}
	d := time.Since(tm)
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%d days ago", int(d.Hours()/24))
	}
}

// duration formats a duration for people: "850ms", "12s", "4m05s", "2h03m".
func duration(d time.Duration) string {
	switch {
	case d <= 0:
		return ""
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.0fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

// between is the duration from a to b ("" unless both are set; b unset means now).
func between(a, b any) string {
	ta, ok := timeOf(a)
	if !ok {
		return ""
	}
	tb, ok := timeOf(b)
	if !ok {
		tb = time.Now()
	}
	return duration(tb.Sub(ta))
}

func timeOf(t any) (time.Time, bool) {
	switch v := t.(type) {
	case time.Time:
		return v, !v.IsZero()
	case *time.Time:
		if v == nil {
			return time.Time{}, false
		}
		return *v, !v.IsZero()
	}
	return time.Time{}, false
}

// statusClass is the CSS class of a status word: a job's or an evaluation's (the two share
// succeeded, failed and cancelled), or a forge's commit state.
func statusClass(word string) string {
	switch word {
	case string(status.JobSucceeded), string(forge.StateSuccess):
		return "ok"
	case string(status.JobFailed), string(status.JobDepFailed), string(forge.StateFailure), string(status.AttemptRetried):
		return "bad"
	case string(status.JobCancelled), string(status.EvalSkipped), string(forge.StateError), string(status.AttemptInterrupted):
		return "off"
	case string(status.JobBuilding), string(status.JobUploading), string(status.EvalRunning), "evaluating":
		return "busy"
	default:
		return "wait"
	}
}
