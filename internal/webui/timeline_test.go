package webui

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// xmlNode is any element of a parsed SVG.
type xmlNode struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Nodes   []xmlNode  `xml:",any"`
	Text    string     `xml:",chardata"`
}

func (n xmlNode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// timelineBar is a bar of a rendered timeline.
type timelineBar struct {
	job        int64
	node, slot string
	href       string // of the link around it
	title      string
}

// parseTimeline parses the page's timeline SVG and returns its bars.
func parseTimeline(t *testing.T, body string) []timelineBar {
	t.Helper()
	start, end := strings.Index(body, "<svg"), strings.Index(body, "</svg>")
	if start < 0 || end < start {
		t.Fatalf("no SVG in the page:\n%s", body)
	}
	var svg xmlNode
	if err := xml.Unmarshal([]byte(body[start:end+len("</svg>")]), &svg); err != nil {
		t.Fatalf("the timeline is not well-formed XML: %v\n%s", err, body[start:end])
	}
	var bars []timelineBar
	var walk func(n xmlNode, lane xmlNode, href string)
	walk = func(n xmlNode, lane xmlNode, href string) {
		if n.XMLName.Local == "g" && n.attr("class") == "lane" {
			lane = n
		}
		if n.XMLName.Local == "a" {
			href = n.attr("href")
		}
		if n.attr("style") != "" {
			t.Errorf("<%s> has a style attribute, which the CSP blocks", n.XMLName.Local)
		}
		if n.XMLName.Local == "rect" && strings.HasPrefix(n.attr("class"), "build ") {
			id, err := strconv.ParseInt(n.attr("data-job"), 10, 64)
			if err != nil {
				t.Fatalf("bar without a job: %v", n.Attrs)
			}
			b := timelineBar{job: id, node: lane.attr("data-node"), slot: lane.attr("data-slot"), href: href}
			for _, c := range n.Nodes {
				if c.XMLName.Local == "title" {
					b.title = c.Text
				}
			}
			bars = append(bars, b)
		}
		for _, c := range n.Nodes {
			walk(c, lane, href)
		}
	}
	walk(svg, xmlNode{}, "")
	return bars
}

func TestTimelineHasABarPerBuildInItsBuildersLane(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	s := fx.newScenario()
	body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", s.eval), http.StatusOK)
	bars := parseTimeline(t, body)

	// Every claimed job of the closure, lib (no attribute) included; none twice.
	if len(bars) != len(s.nodeOf) {
		t.Errorf("%d bars, want one per claimed build (%d): %+v", len(bars), len(s.nodeOf), bars)
	}
	seen := map[int64]bool{}
	for _, b := range bars {
		if seen[b.job] {
			t.Errorf("build %d has two bars", b.job)
		}
		seen[b.job] = true
		if want := s.nodeOf[b.job]; b.node != want {
			t.Errorf("build %d is in the lane of %q, want %q", b.job, b.node, want)
		}
		failed := b.job == s.jobs["bad"] || b.job == s.jobs["lib"]
		if want := fmt.Sprintf("/ci/proj/build/%d", b.job); failed != (b.href == want) || (!failed && b.href != "") {
			t.Errorf("build %d (failed %v) links to %q", b.job, failed, b.href)
		}
	}
	// node-a ran ok and bad at once: two slots; node-b's builds did not overlap: one.
	slots := map[string]string{}
	for _, b := range bars {
		slots[fmt.Sprint(b.job)] = b.node + "/" + b.slot
	}
	for job, want := range map[string]string{"ok": "node-a/1", "bad": "node-a/2", "lib": "node-b/1", "busy": "node-b/1"} {
		if got := slots[fmt.Sprint(s.jobs[job])]; got != want {
			t.Errorf("%s is in lane %s, want %s", job, got, want)
		}
	}
	for _, want := range []string{"node-a · slot 2", "ok (ok): succeeded, 2m00s on node-a"} {
		if !strings.Contains(body, want) {
			t.Errorf("timeline lacks %q", want)
		}
	}
}

func TestTimelineShowsTheLatestBuildsOfABigEvaluation(t *testing.T) {
	t.Parallel()
	fx := newEvalFixture(t)
	e := fx.newEval(fx.project)
	const n = maxTimelineBars + 1
	fx.exec(`
WITH d AS (
    INSERT INTO derivations (drv_path, hash_part, name, system, nar_hash, nar_size)
    SELECT '/nix/store/' || lpad(i::text, 32, '0') || '-p' || i || '.drv', lpad(i::text, 32, '0'), 'p' || i,
           'x86_64-linux', 'sha256:0', 0
    FROM generate_series(1, $2) i
    RETURNING drv_path, name
), a AS (
    INSERT INTO eval_attrs (eval_id, attr, drv_path) SELECT $1, name, drv_path FROM d
)
INSERT INTO build_jobs (drv_path, system, status, claimed_by, claimed_at, finished_at)
SELECT drv_path, 'x86_64-linux', 'succeeded', 'node-' || (substr(name, 2)::int % 4),
       $3::timestamptz + substr(name, 2)::int * interval '1 second',
       $3::timestamptz + substr(name, 2)::int * interval '1 second' + interval '3 seconds'
FROM d`, e, n, jobEpoch)
	body := fx.get(fmt.Sprintf("/ci/proj/eval/%d", e), http.StatusOK)
	bars := parseTimeline(t, body)
	if len(bars) != maxTimelineBars {
		t.Fatalf("%d bars, want %d", len(bars), maxTimelineBars)
	}
	for _, b := range bars {
		if b.title == "p1 (p1): succeeded, 3s on node-1" {
			t.Errorf("the oldest build is shown: %+v", b)
		}
	}
	if want := fmt.Sprintf("The evaluation has %d builds: these are the latest %d.", n, maxTimelineBars); !strings.Contains(body, want) {
		t.Errorf("no %q", want)
	}
}

func TestLayoutTimelinePacksSlotsGreedily(t *testing.T) {
	t.Parallel()
	at := func(s int) time.Time { return jobEpoch.Add(time.Duration(s) * time.Second) }
	end := func(s int) *time.Time { e := at(s); return &e }
	for _, tc := range []struct {
		name   string
		builds []timelineBuild
		want   map[int64]string // job → node/slot
		lanes  int
	}{
		{"sequential builds share a slot", []timelineBuild{
			{ID: 1, Node: "a", Start: at(0), End: end(10)},
			{ID: 2, Node: "a", Start: at(10), End: end(20)},
			{ID: 3, Node: "a", Start: at(25), End: end(30)},
		}, map[int64]string{1: "a/1", 2: "a/1", 3: "a/1"}, 1},
		{"overlapping builds take the first free slot", []timelineBuild{
			{ID: 1, Node: "a", Start: at(0), End: end(30)},
			{ID: 2, Node: "a", Start: at(5), End: end(10)},
			{ID: 3, Node: "a", Start: at(8), End: end(40)},
			{ID: 4, Node: "a", Start: at(12), End: end(20)}, // slot 2 is free again
		}, map[int64]string{1: "a/1", 2: "a/2", 3: "a/3", 4: "a/2"}, 3},
		{"nodes have their own slots", []timelineBuild{
			{ID: 1, Node: "b", Start: at(0), End: end(30)},
			{ID: 2, Node: "a", Start: at(0), End: end(30)},
			{ID: 3, Node: "b", Start: at(1)}, // running
		}, map[int64]string{1: "b/1", 2: "a/1", 3: "b/2"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range tc.builds {
				tc.builds[i].Now, tc.builds[i].Name, tc.builds[i].Status = at(60), "x", status.JobSucceeded
			}
			tl := layoutTimeline(tc.builds, "p")
			if len(tl.Lanes) != tc.lanes {
				t.Errorf("%d lanes, want %d", len(tl.Lanes), tc.lanes)
			}
			got := map[int64]string{}
			for _, l := range tl.Lanes {
				for _, b := range l.Bars {
					got[b.ID] = fmt.Sprintf("%s/%d", l.Node, l.Slot)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("lanes %v, want %v", got, tc.want)
			}
		})
	}
	if tl := layoutTimeline(nil, "p"); tl != nil {
		t.Errorf("a timeline without builds: %+v", tl)
	}
}

func TestTimelineTicks(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		span  time.Duration
		first string
		next  string
	}{
		{3 * time.Second, "0", "1s"},
		{7 * time.Minute, "0", "1m00s"},
		{50 * time.Minute, "0", "10m00s"},
		{30 * time.Hour, "0", "6h00m"},
		{500 * time.Hour, "0", "4d"},
	} {
		ticks := timelineTicks(tc.span, 700)
		if len(ticks) < 2 || len(ticks) > 9 || ticks[0].Label != tc.first || ticks[1].Label != tc.next {
			t.Errorf("ticks of %v: %+v", tc.span, ticks)
		}
	}
}
