package webui

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// The dashboard's charts cover the last 6 hours in 10-minute buckets (sqlActivity's window).
const (
	activityBucketWidth = 10 * time.Minute
	activityBucketCount = 36
)

// ActivityBucket is one 10-minute bucket of recent activity.
type ActivityBucket struct {
	Start     time.Time
	Depth     int // jobs pending at the bucket's end
	Succeeded int // builds that finished in the bucket
	Failed    int
}

// Activity is the cluster's recent activity, oldest bucket first. The last bucket ends at End,
// the first 10-minute boundary after the time it was read, so it is still filling.
type Activity struct {
	End     time.Time
	Buckets []ActivityBucket
}

// loadActivity reads the activity of the activityBucketCount buckets before end (a bucket boundary).
func loadActivity(ctx context.Context, q db.DBTX, end time.Time) (Activity, error) {
	a := Activity{End: end}
	rows, err := q.Query(ctx, sqlActivity, end)
	if err != nil {
		return a, fmt.Errorf("read activity: %w", err)
	}
	a.Buckets, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (ActivityBucket, error) {
		var i int
		var b ActivityBucket
		err := row.Scan(&i, &b.Depth, &b.Succeeded, &b.Failed)
		b.Start = end.Add(time.Duration(i-activityBucketCount) * activityBucketWidth)
		return b, err
	})
	if err != nil {
		return a, fmt.Errorf("read activity: %w", err)
	}
	return a, nil
}

// activityEnd is the end of the window that holds now: the next bucket boundary.
func activityEnd(now time.Time) time.Time {
	return now.Truncate(activityBucketWidth).Add(activityBucketWidth)
}

// Chart geometry, in SVG user units: the plot sits inside the margins, which hold the legend
// (top), the value axis (left) and the time axis (bottom).
const (
	chartWidth        = 560
	chartHeight       = 210
	chartMarginLeft   = 44
	chartMarginRight  = 12
	chartMarginTop    = 30
	chartMarginBottom = 24
	chartPlotWidth    = chartWidth - chartMarginLeft - chartMarginRight
	chartPlotHeight   = chartHeight - chartMarginTop - chartMarginBottom
	chartPlotBottom   = chartMarginTop + chartPlotHeight
	chartSlotWidth    = float64(chartPlotWidth) / activityBucketCount
)

// Chart colours, as presentation attributes: the page's CSP allows no inline styles.
const (
	chartSucceededColor = "#2da44e"
	chartFailedColor    = "#cf222e"
	chartDepthColor     = "#0969da"
)

// ChartTick is a labelled position on an axis.
type ChartTick struct {
	Pos   float64 // y for the value axis, x for the time axis
	Label string
}

// ChartBar is one bucket of the throughput chart: a succeeded segment with a failed one on top.
type ChartBar struct {
	Index                 int
	X, Width              float64
	OKY, OKHeight         float64
	FailedY, FailedHeight float64
	Succeeded, Failed     int
	Title                 string
}

// ChartPoint is one bucket of the queue depth chart.
type ChartPoint struct {
	Index int
	X, Y  float64
	Depth int
	Title string
}

// Charts is what the dashboard draws: throughput (builds finished per bucket) and queue depth.
type Charts struct {
	Width, Height            int
	PlotLeft, PlotRight      float64
	PlotTop, PlotBottom      float64
	PlotHeight, TickEnd      float64 // TickEnd: where the time axis's tick marks end
	TimeTicks                []ChartTick
	Bars                     []ChartBar
	BarTicks                 []ChartTick
	Points                   []ChartPoint
	DepthTicks               []ChartTick
	DepthLine                string // polyline points
	DepthArea                string // polygon points: the line closed along the bottom
	Succeeded, Failed, Depth int    // totals over the window, and the depth now
	SucceededColor           string
	FailedColor              string
	DepthColor               string
}

// chartScale returns an axis maximum at or above max and its step: four steps of 1, 2 or 5
// times a power of ten, so the gridlines fall on round numbers.
func chartScale(max int) (top, step int) {
	if max <= 4 {
		return 4, 1
	}
	raw := float64(max) / 4
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			step = int(m * p)
			break
		}
	}
	return 4 * step, step
}

// chartRound keeps one decimal: enough for an SVG coordinate, and short.
func chartRound(f float64) float64 { return math.Round(f*10) / 10 }

// chartY is the y of value v on an axis whose top value is top.
func chartY(v, top int) float64 {
	return chartRound(float64(chartPlotBottom) - float64(v)/float64(top)*float64(chartPlotHeight))
}

func chartValueTicks(top, step int) []ChartTick {
	var ticks []ChartTick
	for v := 0; v <= top; v += step {
		ticks = append(ticks, ChartTick{Pos: chartY(v, top), Label: strconv.Itoa(v)})
	}
	return ticks
}

// buildCharts lays out a's two charts.
func buildCharts(a Activity) Charts {
	c := Charts{
		Width: chartWidth, Height: chartHeight,
		PlotLeft: chartMarginLeft, PlotRight: chartWidth - chartMarginRight, PlotTop: chartMarginTop, PlotBottom: chartPlotBottom,
		PlotHeight: chartPlotHeight, TickEnd: chartPlotBottom + 4,
		SucceededColor: chartSucceededColor, FailedColor: chartFailedColor, DepthColor: chartDepthColor,
	}
	maxBuilds, maxDepth := 0, 0
	for _, b := range a.Buckets {
		maxBuilds = max(maxBuilds, b.Succeeded+b.Failed)
		maxDepth = max(maxDepth, b.Depth)
		c.Succeeded += b.Succeeded
		c.Failed += b.Failed
	}
	if n := len(a.Buckets); n > 0 {
		c.Depth = a.Buckets[n-1].Depth
	}
	buildTop, buildStep := chartScale(maxBuilds)
	depthTop, depthStep := chartScale(maxDepth)
	c.BarTicks = chartValueTicks(buildTop, buildStep)
	c.DepthTicks = chartValueTicks(depthTop, depthStep)

	var line []string
	for i, b := range a.Buckets {
		x := chartMarginLeft + float64(i)*chartSlotWidth
		span := b.Start.UTC().Format("15:04") + "–" + b.Start.Add(activityBucketWidth).UTC().Format("15:04") + " UTC"
		okY := chartY(b.Succeeded, buildTop)
		failY := chartY(b.Succeeded+b.Failed, buildTop)
		c.Bars = append(c.Bars, ChartBar{
			Index: i, X: chartRound(x + 1), Width: chartRound(chartSlotWidth - 2),
			OKY: okY, OKHeight: chartRound(chartPlotBottom - okY),
			FailedY: failY, FailedHeight: chartRound(okY - failY),
			Succeeded: b.Succeeded, Failed: b.Failed,
			Title: fmt.Sprintf("%s: %d succeeded, %d failed", span, b.Succeeded, b.Failed),
		})
		p := ChartPoint{Index: i, X: chartRound(x + chartSlotWidth/2), Y: chartY(b.Depth, depthTop), Depth: b.Depth,
			Title: fmt.Sprintf("%s: %d pending at the end", span, b.Depth)}
		c.Points = append(c.Points, p)
		line = append(line, fmt.Sprintf("%g,%g", p.X, p.Y))
	}
	if len(c.Points) > 0 {
		c.DepthLine = strings.Join(line, " ")
		first, last := c.Points[0], c.Points[len(c.Points)-1]
		c.DepthArea = fmt.Sprintf("%g,%d %s %g,%d", first.X, chartPlotBottom, c.DepthLine, last.X, chartPlotBottom)
	}
	// An hour is 6 buckets: a tick on each hour boundary, "now" at the right edge.
	hours := len(a.Buckets) / 6
	for h := 0; h <= hours; h++ {
		label := "now"
		if h < hours {
			label = fmt.Sprintf("−%d h", hours-h)
		}
		c.TimeTicks = append(c.TimeTicks, ChartTick{Pos: chartRound(chartMarginLeft + float64(h*6)*chartSlotWidth), Label: label})
	}
	return c
}

// activityCharts reads the last 6 hours and lays out the dashboard's charts. Like the queue
// page, it reads without JIT: the planner overprices the grouping by far.
func (u *UI) activityCharts(ctx context.Context) (Charts, error) {
	tx, err := u.cfg.Pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return Charts{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, sqlNoJIT); err != nil {
		return Charts{}, err
	}
	a, err := loadActivity(ctx, tx, activityEnd(time.Now()))
	if err != nil {
		return Charts{}, err
	}
	return buildCharts(a), nil
}
