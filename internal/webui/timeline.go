package webui

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// The timeline of an evaluation's builds: an inline SVG with one lane per builder slot and a
// bar per build from its claim to its end. It uses presentation attributes (fill=), not style
// attributes, so the page's CSP (style-src 'self') lets it through.

// maxTimelineBars bounds the bars of one timeline: a bigger evaluation shows its latest builds.
const maxTimelineBars = 1000

// Timeline geometry, in SVG user units.
const (
	tlWidth   = 960
	tlLabelW  = 170 // the lane labels' column
	tlRight   = 10  // margin right of the plot
	tlAxisH   = 22  // the time ticks' row
	tlLaneH   = 18
	tlBarH    = 12
	tlMinBarW = 2 // a build of a few milliseconds still shows
	// tlLabelChars is as much of a node's name as fits the labels' column (its tooltip has it all).
	tlLabelChars = 18
)

// Timeline is what the template "timeline" draws.
type Timeline struct {
	Width, Height int
	Lanes         []Lane
	Ticks         []Tick
	Shown, Total  int // bars drawn; builds there were
	Start         time.Time
	Span          string // the x axis's length, for people
}

// Lane is one builder slot's row of bars.
type Lane struct {
	Node     string
	Slot     int // 1-based
	Label    string
	Y, TextY int // the row's top; its label's baseline
	LineY    int // the row's separator
	Bars     []Bar
}

// Bar is one build.
type Bar struct {
	ID         int64
	Class      string // "build" and the status class
	X, Y, W, H string
	Fill       string
	Title      string // the tooltip
	Href       string // set for a failed build: its page
}

// Tick is one time mark of the x axis.
type Tick struct {
	X     string
	Label string
}

// timelineBuild is one claimed job of the evaluation.
type timelineBuild struct {
	ID         int64
	Name, Attr string
	Status     status.JobStatus
	Node       string
	Start      time.Time
	End        *time.Time
	Total      int
	Now        time.Time // the database's clock: the end of running builds
	endOrNow   time.Time
}

// timeline reads and lays out the builds of evaluation evalID; nil when none was claimed yet.
func (u *UI) timeline(ctx context.Context, evalID int64, project string) (*Timeline, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlTimelineBuilds, evalID, maxTimelineBars)
	if err != nil {
		return nil, fmt.Errorf("timeline of evaluation %d: %w", evalID, err)
	}
	builds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (timelineBuild, error) {
		var b timelineBuild
		err := row.Scan(&b.ID, &b.Name, &b.Attr, &b.Status, &b.Node, &b.Start, &b.End, &b.Total, &b.Now)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("timeline of evaluation %d: %w", evalID, err)
	}
	return layoutTimeline(builds, project), nil
}

// layoutTimeline packs builds into lanes and places them; nil without builds.
//
// A node's builds are packed greedily: by start, each goes into the first slot of its node that
// is free when it starts, so a node running n builds at once shows n lanes.
func layoutTimeline(builds []timelineBuild, project string) *Timeline {
	if len(builds) == 0 {
		return nil
	}
	now := builds[0].Now
	start, end := builds[0].Start, time.Time{}
	for i := range builds {
		b := &builds[i]
		b.endOrNow = now
		if b.End != nil {
			b.endOrNow = *b.End
		}
		if b.endOrNow.Before(b.Start) {
			b.endOrNow = b.Start // clocks of different nodes may disagree
		}
		start = minTime(start, b.Start)
		end = maxTime(end, b.endOrNow)
	}
	slices.SortFunc(builds, func(a, b timelineBuild) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), a.Start.Compare(b.Start), cmp.Compare(a.ID, b.ID))
	})

	t := &Timeline{Width: tlWidth, Shown: len(builds), Total: builds[0].Total, Start: start}
	span := end.Sub(start)
	if span <= 0 {
		span = time.Second
	}
	t.Span = duration(span)
	plotW := float64(tlWidth - tlLabelW - tlRight)
	x := func(tm time.Time) float64 {
		return tlLabelW + plotW*float64(tm.Sub(start))/float64(span)
	}

	var slotEnds []time.Time // of the current node's slots
	node := ""
	for i := range builds {
		b := &builds[i]
		if i == 0 || b.Node != node {
			node, slotEnds = b.Node, slotEnds[:0]
		}
		slot := slices.IndexFunc(slotEnds, func(e time.Time) bool { return !e.After(b.Start) })
		if slot < 0 {
			slot = len(slotEnds)
			slotEnds = append(slotEnds, b.endOrNow)
			y := tlAxisH + len(t.Lanes)*tlLaneH
			t.Lanes = append(t.Lanes, Lane{
				Node: b.Node, Slot: slot + 1, Label: fmt.Sprintf("%s · slot %d", clip(b.Node, tlLabelChars), slot+1),
				Y: y, TextY: y + tlLaneH/2 + 4, LineY: y + tlLaneH,
			})
		}
		slotEnds[slot] = b.endOrNow
		lane := &t.Lanes[len(t.Lanes)-len(slotEnds)+slot]
		x0, x1 := x(b.Start), x(b.endOrNow)
		w := max(x1-x0, tlMinBarW)
		bar := Bar{
			ID: b.ID, Class: "build " + statusClass(string(b.Status)),
			X: fmtF(x0), Y: strconv.Itoa(lane.Y + (tlLaneH-tlBarH)/2), W: fmtF(w), H: strconv.Itoa(tlBarH),
			Fill: barFill(b.Status), Title: barTitle(b),
		}
		if b.Status == status.JobFailed {
			bar.Href = fmt.Sprintf("/ci/%s/build/%d", url.PathEscape(project), b.ID)
		}
		lane.Bars = append(lane.Bars, bar)
	}
	t.Height = tlAxisH + len(t.Lanes)*tlLaneH + 4
	t.Ticks = timelineTicks(span, plotW)
	return t
}

// timelineTicks marks the x axis at a round step giving at most 8 marks.
func timelineTicks(span time.Duration, plotW float64) []Tick {
	steps := []time.Duration{
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
	}
	step := steps[len(steps)-1]
	for _, s := range steps {
		if span/s <= 8 {
			step = s
			break
		}
	}
	for span/step > 8 {
		step *= 2
	}
	var ticks []Tick
	for d := time.Duration(0); d <= span; d += step {
		label := duration(d)
		switch {
		case d == 0:
			label = "0"
		case step >= 24*time.Hour:
			label = fmt.Sprintf("%dd", d/(24*time.Hour))
		}
		ticks = append(ticks, Tick{X: fmtF(tlLabelW + plotW*float64(d)/float64(span)), Label: label})
	}
	return ticks
}

// barFill is a bar's colour by the build's status (the stylesheet's palette).
func barFill(s status.JobStatus) string {
	switch {
	case s == status.JobSucceeded:
		return "#1a7f37"
	case s.Failed():
		return "#cf222e"
	case s.Claimed():
		return "#d4a72c"
	case s == status.JobCancelled:
		return "#8c959f"
	default:
		return "#57606a"
	}
}

// barTitle is a bar's tooltip: "attr (name): status, duration on node".
func barTitle(b *timelineBuild) string {
	name := b.Name
	if b.Attr != "" {
		name = b.Attr + " (" + b.Name + ")"
	}
	d := duration(b.endOrNow.Sub(b.Start))
	if d == "" {
		d = "0s"
	}
	return fmt.Sprintf("%s: %s, %s on %s", name, b.Status, d, b.Node)
}

// clip cuts s to n runes, marking the cut with "…".
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func fmtF(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
