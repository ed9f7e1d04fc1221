package webui

import (
	"bytes"
	"encoding/xml"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

func TestChartScale(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ max, top, step int }{
		{0, 4, 1}, {3, 4, 1}, {4, 4, 1}, {5, 8, 2}, {8, 8, 2}, {9, 20, 5}, {20, 20, 5},
		{21, 40, 10}, {39, 40, 10}, {41, 80, 20}, {99, 200, 50}, {1234, 2000, 500},
	} {
		top, step := chartScale(c.max)
		if top != c.top || step != c.step || top < c.max {
			t.Errorf("chartScale(%d) = %d, %d; want %d, %d", c.max, top, step, c.top, c.step)
		}
	}
}

func TestActivityEnd(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 1, 14, 27, 31, 0, time.UTC)
	if got, want := activityEnd(at), time.Date(2026, 3, 1, 14, 30, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("activityEnd(%v) = %v, want %v", at, got, want)
	}
}

// chartJob is a job's history for the activity tests: times are offsets from the window's
// end; nil means never.
type chartJob struct {
	status                     status.JobStatus
	created, claimed, finished time.Duration
	wasClaimed, hasFinished    bool
}

// svgNode is any SVG element, as encoding/xml reads it.
type svgNode struct {
	XMLName xml.Name
	Attrs   []xml.Attr `xml:",any,attr"`
	Nodes   []svgNode  `xml:",any"`
	Text    string     `xml:",chardata"`
}

func (n svgNode) attr(name string) (string, bool) {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value, true
		}
	}
	return "", false
}

// walk calls f on n and every element under it.
func (n svgNode) walk(f func(svgNode)) {
	f(n)
	for _, c := range n.Nodes {
		c.walk(f)
	}
}

// parseSVGs parses every <svg> element of body with encoding/xml, keyed by its figure's id.
func parseSVGs(t *testing.T, body string) map[string]svgNode {
	t.Helper()
	out := map[string]svgNode{}
	for _, id := range []string{"chart-throughput", "chart-depth"} {
		fig := element(t, body, "figure", id)
		start := strings.Index(fig, "<svg")
		if start < 0 {
			t.Fatalf("figure %s has no svg", id)
		}
		var n svgNode
		if err := xml.Unmarshal([]byte(fig[start:]), &n); err != nil {
			t.Fatalf("figure %s: the SVG does not parse as XML: %v\n%s", id, err, fig[start:])
		}
		if n.XMLName.Local != "svg" || n.XMLName.Space != "http://www.w3.org/2000/svg" {
			t.Fatalf("figure %s: root element %v", id, n.XMLName)
		}
		n.walk(func(e svgNode) {
			if _, ok := e.attr("style"); ok {
				t.Errorf("figure %s: <%s> has a style attribute, which the CSP forbids", id, e.XMLName.Local)
			}
		})
		out[id] = n
	}
	return out
}

// svgBuckets reads the per-bucket numbers the charts carry: data-succeeded and data-failed of
// the throughput bars, data-depth of the depth points, by data-bucket.
func svgBuckets(t *testing.T, svgs map[string]svgNode) (succeeded, failed, depth map[int]int) {
	t.Helper()
	succeeded, failed, depth = map[int]int{}, map[int]int{}, map[int]int{}
	num := func(e svgNode, name string) int {
		v, ok := e.attr(name)
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			t.Fatalf("<%s> has %s=%q", e.XMLName.Local, name, v)
		}
		return n
	}
	svgs["chart-throughput"].walk(func(e svgNode) {
		if _, ok := e.attr("data-bucket"); ok && e.XMLName.Local == "g" {
			b := num(e, "data-bucket")
			succeeded[b], failed[b] = num(e, "data-succeeded"), num(e, "data-failed")
		}
	})
	svgs["chart-depth"].walk(func(e svgNode) {
		if _, ok := e.attr("data-bucket"); ok && e.XMLName.Local == "circle" {
			depth[num(e, "data-bucket")] = num(e, "data-depth")
		}
	})
	return succeeded, failed, depth
}

// TestActivity inserts jobs with random histories around a 6-hour window and checks the
// buckets, as read and as drawn, against a direct count.
func TestActivity(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	end := time.Now().Add(-time.Hour).Truncate(activityBucketWidth)
	rng := rand.New(rand.NewPCG(1, 2))
	minute := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo)) * time.Minute }
	var jobs []chartJob
	for i := 0; i < 300; i++ {
		j := chartJob{created: minute(-8*60, 30)}
		switch rng.IntN(6) {
		case 0:
			j.status = status.JobPending
		case 1:
			j.status, j.claimed, j.wasClaimed = status.JobBuilding, j.created+minute(0, 90), true
		case 2, 3:
			j.status, j.claimed, j.wasClaimed = status.JobSucceeded, j.created+minute(0, 90), true
			j.finished, j.hasFinished = j.claimed+minute(0, 60), true
		case 4:
			j.status, j.claimed, j.wasClaimed = status.JobFailed, j.created+minute(0, 90), true
			j.finished, j.hasFinished = j.claimed+minute(0, 60), true
		case 5:
			j.status, j.finished, j.hasFinished = []status.JobStatus{status.JobDepFailed, status.JobCancelled}[rng.IntN(2)], j.created+minute(0, 90), true
		}
		jobs = append(jobs, j)
	}
	// The edges: exactly on bucket boundaries, and at the window's edges.
	jobs = append(jobs,
		chartJob{status: status.JobSucceeded, created: -6 * time.Hour, claimed: -6 * time.Hour, wasClaimed: true, finished: -6 * time.Hour, hasFinished: true},
		chartJob{status: status.JobFailed, created: -7 * time.Hour, claimed: -10 * time.Minute, wasClaimed: true, finished: -time.Nanosecond * 1000, hasFinished: true},
		chartJob{status: status.JobSucceeded, created: -20 * time.Minute, claimed: -10 * time.Minute, wasClaimed: true, finished: 0, hasFinished: true},
		chartJob{status: status.JobPending, created: 0},
		chartJob{status: status.JobPending, created: -time.Microsecond},
	)
	for i, j := range jobs {
		at := func(d time.Duration, set bool) any {
			if !set {
				return nil
			}
			return end.Add(d)
		}
		d := fx.drv("j"+strconv.Itoa(i), "x86_64-linux")
		fx.exec(`INSERT INTO build_jobs (drv_path, system, status, claimed_by, created_at, claimed_at, finished_at)
VALUES ($1, 'x86_64-linux', $2, CASE WHEN $2 IN ('building', 'uploading') THEN 'b1' END, $3, $4, $5)`,
			d, j.status, end.Add(j.created), at(j.claimed, j.wasClaimed), at(j.finished, j.hasFinished))
	}

	// The direct count: pending at a bucket's end means created before it and neither claimed
	// nor finished before it; finished in a bucket means in [start, end).
	type bucket struct{ depth, succeeded, failed int }
	want := make([]bucket, activityBucketCount)
	for k := range want {
		lo := time.Duration(k-activityBucketCount) * activityBucketWidth
		hi := lo + activityBucketWidth
		for _, j := range jobs {
			if j.created < hi && !(j.wasClaimed && j.claimed < hi) && !(j.hasFinished && j.finished < hi) {
				want[k].depth++
			}
			if j.hasFinished && j.finished >= lo && j.finished < hi {
				switch j.status {
				case status.JobSucceeded:
					want[k].succeeded++
				case status.JobFailed:
					want[k].failed++
				}
			}
		}
	}

	a, err := loadActivity(fx.ctx, fx.pool, end)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Buckets) != activityBucketCount {
		t.Fatalf("%d buckets, want %d", len(a.Buckets), activityBucketCount)
	}
	for k, b := range a.Buckets {
		if w := end.Add(time.Duration(k-activityBucketCount) * activityBucketWidth); !b.Start.Equal(w) {
			t.Errorf("bucket %d starts at %v, want %v", k, b.Start, w)
		}
		if got := (bucket{b.Depth, b.Succeeded, b.Failed}); got != want[k] {
			t.Errorf("bucket %d: {depth succeeded failed} = %v, want %v", k, got, want[k])
		}
	}

	var buf bytes.Buffer
	if err := fx.u.pages["dashboard"].ExecuteTemplate(&buf, "activity", buildCharts(a)); err != nil {
		t.Fatal(err)
	}
	succeeded, failed, depth := svgBuckets(t, parseSVGs(t, buf.String()))
	if len(succeeded) != activityBucketCount || len(depth) != activityBucketCount {
		t.Fatalf("the charts have %d bars and %d points, want %d each", len(succeeded), len(depth), activityBucketCount)
	}
	for k, w := range want {
		if got := (bucket{depth[k], succeeded[k], failed[k]}); got != w {
			t.Errorf("drawn bucket %d: %v, want %v", k, got, w)
		}
	}
}

// TestDashboardCharts checks the dashboard draws the charts from the jobs of the last hours.
func TestDashboardCharts(t *testing.T) {
	t.Parallel()
	fx := newBrowseFixture(t)
	// Two hours ago is well inside the window whenever the page is read.
	for i, st := range []status.JobStatus{status.JobSucceeded, status.JobSucceeded, status.JobSucceeded, status.JobFailed, status.JobDepFailed} {
		fx.exec(`INSERT INTO build_jobs (drv_path, system, status, created_at, claimed_at, finished_at)
VALUES ($1, 'x86_64-linux', $2, now() - interval '3 hours', now() - interval '2 hours', now() - interval '2 hours')`,
			fx.drv("done"+strconv.Itoa(i), "x86_64-linux"), st)
	}
	for i := 0; i < 4; i++ {
		fx.job(fx.drv("wait"+strconv.Itoa(i), "x86_64-linux"), 0, 0, time.Now().Add(-4*time.Hour))
	}

	body := fx.getOK("/ci/")
	if i, j := strings.Index(body, `id="chart-throughput"`), strings.Index(body, `id="projects"`); i < 0 || j < i {
		t.Errorf("the charts are not above the projects table")
	}
	succeeded, failed, depth := svgBuckets(t, parseSVGs(t, body))
	total := func(m map[int]int) (n int) {
		for _, v := range m {
			n += v
		}
		return n
	}
	if s, f := total(succeeded), total(failed); s != 3 || f != 1 {
		t.Errorf("the chart shows %d succeeded and %d failed, want 3 and 1", s, f)
	}
	if d := depth[activityBucketCount-1]; d != 4 {
		t.Errorf("the queue depth now is %d, want 4", d)
	}
	// The bucket that ends 3 hours before the window does: the finished jobs had just been
	// created, and were claimed an hour later.
	if d := depth[activityBucketCount-1-18]; d != 9 {
		t.Errorf("the queue depth three hours ago is %d, want 9", d)
	}
	for _, s := range []string{"succeeded (3)", "failed (1)", "pending jobs (4 now)", "−6 h", ">now<"} {
		if !strings.Contains(body, s) {
			t.Errorf("the charts lack %q", s)
		}
	}
}
