package overview

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/gc"
)

// MaxBuilderRows is how many builders WriteText lists one by one; past it, only those that need
// a look (dead, draining, joining) are, so the overview stays one screen on a large cluster.
const MaxBuilderRows = 16

// WriteText renders the overview as one screen of text. Every age is measured against ReadAt,
// the database's clock.
func (o Overview) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "harmonia-ci status at %s\n\n", o.ReadAt.UTC().Format(time.DateTime+" MST"))
	o.writeQueue(&b)
	b.WriteString("\n")
	o.writeBuilders(&b)
	b.WriteString("\n")
	o.writeLeaders(&b)
	b.WriteString("\n")
	o.writeGC(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

func (o Overview) writeQueue(b *strings.Builder) {
	if len(o.Queue) == 0 {
		b.WriteString("Queue: empty (no pending, building or uploading jobs)\n")
	} else {
		tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "QUEUE\tPENDING\tBUILDING\tUPLOADING")
		for _, q := range append(o.Queue, o.Totals()) {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", q.System, q.Pending, q.Building, q.Uploading)
		}
		tw.Flush()
	}
	fmt.Fprintf(b, "Pending jobs: %d ready, %d blocked on inputs", o.Ready, o.Blocked)
	if o.Ready > 0 {
		fmt.Fprintf(b, "; the oldest ready job has waited %s", age(o.OldestReadySeconds))
	}
	b.WriteString("\n")
	fmt.Fprintf(b, "Evaluations: %d queued, %d running\n", o.Evaluations.Queued, o.Evaluations.Running)
}

func (o Overview) writeBuilders(b *strings.Builder) {
	st := o.BuilderStates()
	used, total := o.Slots()
	fmt.Fprintf(b, "Builders: %d busy, %d idle, %d draining, %d joining, %d dead; %d of %d build slots in use\n",
		st[StateBusy], st[StateIdle], st[StateDraining], st[StateJoining], st[StateDead], used, total)
	if len(o.Builders) == 0 {
		b.WriteString("(no builder nodes)\n")
		return
	}
	rows := o.Builders
	hidden := 0
	if len(rows) > MaxBuilderRows {
		rows = nil
		for _, bl := range o.Builders {
			if bl.State == StateDead || bl.State == StateDraining || bl.State == StateJoining {
				rows = append(rows, bl)
			}
		}
		hidden = len(o.Builders) - len(rows)
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BUILDER\tSTATE\tJOBS\tLAST SEEN")
	for _, bl := range rows {
		state := bl.State
		if state == StateDead {
			state = "DEAD" // the one that needs a look
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s ago\n", bl.ID, state, bl.CurrentJobs, bl.MaxJobs, age(bl.LastSeenSecondsAgo))
	}
	tw.Flush()
	if hidden > 0 {
		fmt.Fprintf(b, "… and %d busy or idle builders (harmonia-ci nodes lists every node)\n", hidden)
	}
}

func (o Overview) writeLeaders(b *strings.Builder) {
	if len(o.Leaders) == 0 {
		b.WriteString("Leaders: none elected yet\n")
		return
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LEADER ROLE\tNODE\tEPOCH\tLEASE")
	for _, l := range o.Leaders {
		left := l.LeaseUntil.Sub(o.ReadAt).Seconds()
		lease := "valid, " + age(left) + " left"
		if !l.Valid {
			lease = "EXPIRED " + age(-left) + " ago: no leader (last " + l.NodeID + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", l.Role, l.NodeID, l.Epoch, lease)
	}
	tw.Flush()
}

func (o Overview) writeGC(b *strings.Builder) {
	g := o.GC.Last
	if g == nil {
		b.WriteString("Last garbage collection: never\n")
		return
	}
	fmt.Fprintf(b, "Last garbage collection: %s on %s, started %s (%s ago)", g.Status, g.NodeID,
		g.StartedAt.UTC().Format(time.DateTime), age(o.ReadAt.Sub(g.StartedAt).Seconds()))
	if g.FinishedAt != nil {
		fmt.Fprintf(b, ", took %s", age(g.FinishedAt.Sub(g.StartedAt).Seconds()))
	}
	b.WriteString("\n")
	if g.Error != "" {
		fmt.Fprintf(b, "  error: %s\n", g.Error)
	}
	fmt.Fprintf(b, "  deleted %d evaluations, %d jobs, %d derivations, %d logs, %d webhook deliveries; %d of %d cache objects (%s)\n",
		g.EvaluationsDeleted, g.JobsDeleted, g.DerivationsDeleted, g.LogsExpired, g.DeliveriesDeleted,
		g.ObjectsDeleted, g.ObjectsScanned, gc.FormatBytes(g.BytesDeleted))
	if s := o.GC.LastSucceededAt; s == nil {
		b.WriteString("Last successful garbage collection: never\n")
	} else {
		fmt.Fprintf(b, "Last successful garbage collection: finished %s (%s ago)\n",
			s.UTC().Format(time.DateTime), age(o.ReadAt.Sub(*s).Seconds()))
	}
}

// age renders seconds to the precision an operator reads: seconds under an hour, minutes under
// two days, hours beyond.
func age(seconds float64) string {
	d := time.Duration(max(seconds, 0) * float64(time.Second))
	switch {
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	default:
		h := int64(d.Round(time.Hour) / time.Hour)
		return fmt.Sprintf("%dd%dh", h/24, h%24)
	}
}
