package gc

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
)

// Object kinds of the binary cache layout, as metrics and reports name them.
const (
	kindNarInfo     = "narinfo"
	kindNAR         = "nar"
	kindListing     = "ls"
	kindLog         = "log"
	kindRealisation = "realisation"
	kindCacheInfo   = "nix-cache-info"
)

// kindOf names the kind of a valid blob key.
func kindOf(key string) string {
	switch {
	case key == "nix-cache-info":
		return kindCacheInfo
	case strings.HasPrefix(key, "nar/"):
		return kindNAR
	case strings.HasPrefix(key, "log/"):
		return kindLog
	case strings.HasPrefix(key, "realisations/"):
		return kindRealisation
	case strings.HasSuffix(key, ".ls"):
		return kindListing
	default:
		return kindNarInfo
	}
}

// Count is a number of objects and their bytes.
type Count struct {
	Objects int64 `json:"objects"`
	Bytes   int64 `json:"bytes"`
}

// Report says what one collection deleted (or, in a dry run, would delete).
type Report struct {
	DryRun bool `json:"dry_run"`

	// The database step.
	Evaluations int64 `json:"evaluations"`
	Jobs        int64 `json:"jobs"`
	Derivations int64 `json:"derivations"`
	LogsExpired int64 `json:"logs_expired"`
	Deliveries  int64 `json:"webhook_deliveries"`

	// The cache step.
	LivePaths    int              `json:"live_paths"`     // store paths the database keeps
	LiveSetQuery time.Duration    `json:"live_set_query"` // the database's time for them
	NarInfoReads int64            `json:"narinfo_reads"`
	Scanned      int64            `json:"scanned"`
	Deleted      map[string]Count `json:"deleted"` // by kind
	Keys         []blob.Info      `json:"-"`       // dry run: what would be deleted

	// Phases of the cache step: listing the cache, marking (narinfo reads), the rechecks and
	// deletions.
	ListDuration  time.Duration `json:"list_duration"`
	MarkDuration  time.Duration `json:"mark_duration"`
	SweepDuration time.Duration `json:"sweep_duration"`

	Started  time.Time     `json:"started"`
	Duration time.Duration `json:"duration"`
}

// Rows is the number of database rows the run deleted or changed.
func (r *Report) Rows() int64 {
	return r.Evaluations + r.Jobs + r.Derivations + r.LogsExpired + r.Deliveries
}

// Objects is the number of cache objects deleted and their bytes.
func (r *Report) Objects() Count {
	var c Count
	for _, k := range r.Deleted {
		c.Objects += k.Objects
		c.Bytes += k.Bytes
	}
	return c
}

func (r *Report) count(key string, size int64) {
	if r.Deleted == nil {
		r.Deleted = map[string]Count{}
	}
	c := r.Deleted[kindOf(key)]
	c.Objects++
	c.Bytes += size
	r.Deleted[kindOf(key)] = c
}

// Print writes the report for an operator.
func (r *Report) Print(w io.Writer) {
	verb := "deleted"
	if r.DryRun {
		verb = "would delete"
	}
	fmt.Fprintf(w, "database: %s %d evaluations, %d jobs, %d derivations, %d webhook deliveries; %d logs expired\n",
		verb, r.Evaluations, r.Jobs, r.Derivations, r.Deliveries, r.LogsExpired)
	o := r.Objects()
	fmt.Fprintf(w, "cache: scanned %d objects, %d store paths live (query %s, %d narinfos read); %s %d objects, %s\n",
		r.Scanned, r.LivePaths, r.LiveSetQuery.Round(time.Millisecond), r.NarInfoReads, verb, o.Objects, FormatBytes(o.Bytes))
	kinds := make([]string, 0, len(r.Deleted))
	for k := range r.Deleted {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-12s %8d objects %12s\n", k, r.Deleted[k].Objects, FormatBytes(r.Deleted[k].Bytes))
	}
	fmt.Fprintf(w, "took %s\n", r.Duration.Round(time.Millisecond))
}

// FormatBytes renders n in binary units for operators ("1.5 GiB").
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
