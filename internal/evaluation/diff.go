package evaluation

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// Outcome is an attribute's result in one evaluation, as a diff compares them.
type Outcome string

const (
	OutcomeSucceeded  Outcome = "succeeded"  // built, or nothing to build (cached)
	OutcomeFailed     Outcome = "failed"     // failed to evaluate, or its build failed
	OutcomeUnfinished Outcome = "unfinished" // building, waiting, or cancelled
)

// Diff is an evaluation compared with the one before it: the previous finished evaluation of
// its branch, or for a pull request the latest finished evaluation of its base branch before
// it. Attribute names are sorted.
type Diff struct {
	Against int64 `json:"against"` // the evaluation compared with; 0: none (the other fields are empty)
	// NewlyFailing failed here and succeeded there; NewlyFixed the other way round;
	// StillFailing failed in both.
	NewlyFailing []string `json:"newly_failing"`
	NewlyFixed   []string `json:"newly_fixed"`
	StillFailing []string `json:"still_failing"`
	// Added are here and not there (with their outcome here in AddedFailing when they
	// failed), Removed there and not here.
	Added        []string `json:"added"`
	AddedFailing []string `json:"added_failing"`
	Removed      []string `json:"removed"`
}

// Summary is the diff in a few words ("2 newly failing, 1 fixed"), "" when nothing changed
// or there is nothing to compare with.
func (d Diff) Summary() string {
	var parts []string
	for _, p := range []struct {
		n    int
		what string
	}{
		{len(d.NewlyFailing), "newly failing"}, {len(d.NewlyFixed), "fixed"},
		{len(d.AddedFailing), "new and failing"}, {len(d.Removed), "removed"},
	} {
		if p.n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", p.n, p.what))
		}
	}
	return strings.Join(parts, ", ")
}

// DiffOf compares evaluation id with the one before it (see Diff); ErrNotFound for an id
// that does not exist. Attributes unfinished on either side are neither newly failing nor
// fixed: the diff is final once both evaluations' builds are.
func DiffOf(ctx context.Context, q db.DBTX, id int64) (Diff, error) {
	var d Diff
	var against *int64
	err := q.QueryRow(ctx, sqlDiffBase, id).Scan(&against)
	if errors.Is(err, pgx.ErrNoRows) {
		return d, fmt.Errorf("evaluation %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return d, fmt.Errorf("diff of evaluation %d: %w", id, err)
	}
	if against == nil {
		return d, nil
	}
	d.Against = *against
	rows, err := q.Query(ctx, sqlDiff, id, d.Against)
	if err != nil {
		return d, fmt.Errorf("diff of evaluation %d: %w", id, err)
	}
	var attr string
	var before, after *Outcome
	_, err = pgx.ForEachRow(rows, []any{&attr, &before, &after}, func() error {
		switch {
		case before == nil:
			d.Added = append(d.Added, attr)
			if *after == OutcomeFailed {
				d.AddedFailing = append(d.AddedFailing, attr)
			}
		case after == nil:
			d.Removed = append(d.Removed, attr)
		case *before == OutcomeSucceeded && *after == OutcomeFailed:
			d.NewlyFailing = append(d.NewlyFailing, attr)
		case *before == OutcomeFailed && *after == OutcomeSucceeded:
			d.NewlyFixed = append(d.NewlyFixed, attr)
		case *before == OutcomeFailed && *after == OutcomeFailed:
			d.StillFailing = append(d.StillFailing, attr)
		}
		return nil
	})
	if err != nil {
		return d, fmt.Errorf("diff of evaluation %d: %w", id, err)
	}
	return d, nil
}
