package evaluation

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/status"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// RequestParams ask for one evaluation.
type RequestParams struct {
	ProjectID int64
	FlakeURL  string // the repository the commit comes from
	Commit    string // full sha
	Branch    string
	TreeHash  string // "" when unknown: no dedup
	// A pull request's evaluation: its number and author (0 and "" for a branch), and the
	// author's forge user id (0 if the forge did not say), which is what authorship compares.
	PRNumber   int
	PRAuthor   string
	PRAuthorID int64
	// PRBase is a pull request's base branch, as the forge names it: the head is evaluated
	// merged into it (unless the merge's settings say otherwise). "": the head as it is.
	PRBase string
	// Delivery, if set, is the webhook delivery asking: recorded in the same transaction, and
	// a delivery recorded before makes Request fail with ErrDuplicateDelivery.
	Delivery *Delivery
	// IsHead, if set, asks the forge whether Commit is still the branch's head. It is called,
	// with no transaction open, when the branch (one that supersedes) has an evaluation of
	// another commit: a commit the branch has moved on from (a late or replayed
	// delivery) is not evaluated (ErrNotHead), so it can neither supersede the newer
	// evaluation nor bring back its own superseded one.
	IsHead func(ctx context.Context) (bool, error)
}

// Delivery names a forge's webhook delivery.
type Delivery struct {
	Forge, ID string
	// BodySHA256 is the hash of the delivery's signed body (nil: none); a body recorded before
	// is a replay whatever its delivery id.
	BodySHA256 []byte
}

// ErrDuplicateDelivery is returned for a webhook delivery that was acted on before (a replay).
var ErrDuplicateDelivery = errors.New("webhook delivery already received")

// Request queues an evaluation of a commit on a branch, idempotently: the same (project,
// commit, branch) twice is one evaluation. A commit whose tree equals that of a succeeded
// evaluation of the project is recorded skipped, reusing that evaluation's attributes. A new
// evaluation supersedes older unfinished ones of its branch (see Supersedes). created is false
// when the evaluation already existed.
func Request(ctx context.Context, pool *pgxpool.Pool, p RequestParams) (e Evaluation, created bool, err error) {
	var head *bool // the forge's answer to p.IsHead, asked outside any transaction
	err = retryConflicts(ctx, func() error {
		for {
			e, created, err = request(ctx, pool, p, head)
			if !errors.Is(err, errAskHead) {
				return err
			}
			// The transaction needed the branch's head and was rolled back: the forge is asked
			// with no transaction open and no lock held, and the request made again.
			h, err := isHead(ctx, p)
			if err != nil {
				return err
			}
			head = &h
		}
	})
	if err != nil {
		return Evaluation{}, false, fmt.Errorf("request evaluation of %s on %s: %w", p.Commit, p.Branch, err)
	}
	return e, created, nil
}

// retryConflicts runs f again, a few milliseconds later, while PostgreSQL reports a
// serialization failure or a deadlock (f's transaction was rolled back), up to 20 times.
func retryConflicts(ctx context.Context, f func() error) error {
	for attempt := 0; ; attempt++ {
		err := f()
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || (pe.Code != "40001" && pe.Code != "40P01") || attempt >= 20 {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 5 * time.Millisecond):
		}
	}
}

// errAskHead rolls back a request that needs the forge's answer to RequestParams.IsHead
// before it can decide: Request asks and makes it again.
var errAskHead = errors.New("the branch's head is needed")

// request makes one request in one transaction; head is the forge's answer to p.IsHead if
// asked already (nil: not yet).
func request(ctx context.Context, pool *pgxpool.Pool, p RequestParams, head *bool) (Evaluation, bool, error) {
	isHead := func() (bool, error) {
		switch {
		case p.IsHead == nil:
			return true, nil
		case head == nil:
			return false, errAskHead
		}
		return *head, nil
	}
	var id int64
	var e Evaluation
	created := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// One request per project at a time: the existing evaluation, the tree-hash hit and
		// what to supersede are decided on what the previous request committed. (Serializable
		// isolation decided the same, but aborted most of a burst of pushes.)
		if _, err := tx.Exec(ctx, sqlRequestLock, db.RequestLockClass, p.ProjectID); err != nil {
			return fmt.Errorf("take the project's request lock: %w", err)
		}
		if d := p.Delivery; d != nil {
			var fresh bool
			err := tx.QueryRow(ctx, sqlRecordDelivery, d.Forge, d.ID, d.BodySHA256).Scan(&fresh)
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrDuplicateDelivery
			}
			if err != nil {
				return fmt.Errorf("record webhook delivery: %w", err)
			}
		}
		rows, err := tx.Query(ctx, sqlEvalByKey, p.ProjectID, p.Commit, p.Branch)
		if err != nil {
			return err
		}
		existing, err := pgx.CollectRows(rows, scanEval)
		if err != nil {
			return err
		}
		if len(existing) > 0 {
			e = existing[0]
			again, err := againstNewBase(ctx, tx, p, e)
			if err != nil {
				return err
			}
			if again || (p.Delivery != nil && wasSuperseded(e) && Supersedes(p.Branch)) {
				// The forge says the branch points at this commit again (a revert, a
				// force-push back): evaluate it again rather than leave it cancelled, unless the
				// branch has moved on since (the delivery is late, or replayed).
				if head, err := isHead(); err != nil || !head {
					return cmp.Or(err, ErrNotHead)
				}
				if err := requeueSuperseded(ctx, tx, e); err != nil {
					return err
				}
				created = true
				if e, err = Get(ctx, tx, e.ID); err != nil {
					return err
				}
			}
			return recordDeliveryEval(ctx, tx, p.Delivery, e.ID)
		}
		if p.IsHead != nil && Supersedes(p.Branch) {
			var other bool
			if err := tx.QueryRow(ctx, sqlOtherCommitOfBranch, p.ProjectID, p.Branch, p.Commit).Scan(&other); err != nil {
				return fmt.Errorf("evaluations of the branch: %w", err)
			}
			if other {
				if head, err := isHead(); err != nil || !head {
					return cmp.Or(err, ErrNotHead)
				}
			}
		}
		var reuse int64
		if p.TreeHash != "" {
			err := tx.QueryRow(ctx, sqlTreeHit, p.ProjectID, p.TreeHash).Scan(&reuse)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		if reuse != 0 {
			err = tx.QueryRow(ctx, sqlInsertSkipped, p.ProjectID, p.FlakeURL, p.Commit, p.Branch, p.TreeHash, p.PRNumber, p.PRAuthor, reuse, p.PRBase, p.PRAuthorID).Scan(&id)
			if err == nil {
				_, err = tx.Exec(ctx, sqlCopyAttrs, id, reuse)
			}
		} else {
			err = tx.QueryRow(ctx, sqlInsertQueued, p.ProjectID, p.FlakeURL, p.Commit, p.Branch, p.TreeHash, p.PRNumber, p.PRAuthor, p.PRBase, p.PRAuthorID).Scan(&id)
		}
		if err != nil {
			return err
		}
		created = true
		if err := recordDeliveryEval(ctx, tx, p.Delivery, id); err != nil {
			return err
		}
		old, err := supersede(ctx, tx, p.ProjectID, p.Branch, id)
		if err != nil {
			return err
		}
		if len(old) > 0 {
			if err := Rollback(ctx, tx, old); err != nil {
				return err
			}
		}
		st := status.EvalQueued
		if reuse != 0 {
			st = status.EvalSkipped
		}
		if err := Notify(ctx, tx, id, st); err != nil {
			return err
		}
		// As requested, in this transaction: an evaluator may claim it the moment it commits.
		e, err = Get(ctx, tx, id)
		return err
	})
	if err != nil {
		return Evaluation{}, false, err
	}
	return e, created, nil
}

// againstNewBase reports whether a pull request event for a head evaluated before should
// evaluate it again: its last run merged it into (or found it conflicting with) the base as it
// was then, and the base may have moved since. Only the newest evaluation of the pull request
// is, so an event for an older head never displaces a newer one.
func againstNewBase(ctx context.Context, tx pgx.Tx, p RequestParams, e Evaluation) (bool, error) {
	if p.Delivery == nil || p.PRNumber == 0 || !e.Finished() || e.BaseCommit == "" {
		return false, nil
	}
	var newest bool
	if err := tx.QueryRow(ctx, sqlNewestOfBranch, e.ProjectID, e.Branch, e.ID).Scan(&newest); err != nil {
		return false, fmt.Errorf("newest evaluation of %s: %w", e.Branch, err)
	}
	return newest, nil
}

func recordDeliveryEval(ctx context.Context, tx pgx.Tx, d *Delivery, id int64) error {
	if d == nil {
		return nil
	}
	if _, err := tx.Exec(ctx, sqlDeliveryEval, d.Forge, d.ID, id); err != nil {
		return fmt.Errorf("record webhook delivery: %w", err)
	}
	return nil
}

// supersededPrefix starts the error of an evaluation a newer one of its branch superseded.
const supersededPrefix = "superseded by evaluation "

func wasSuperseded(e Evaluation) bool {
	return e.Status == status.EvalCancelled && strings.HasPrefix(e.Error, supersededPrefix)
}

// requeueSuperseded puts a superseded evaluation back in the queue under its id, superseding
// every other unfinished evaluation of its branch.
func requeueSuperseded(ctx context.Context, tx pgx.Tx, e Evaluation) error {
	var projectID int64
	var branch string
	if err := tx.QueryRow(ctx, sqlReevaluate, e.ID).Scan(&projectID, &branch); err != nil {
		return fmt.Errorf("requeue evaluation %d: %w", e.ID, err)
	}
	rows, err := tx.Query(ctx, sqlSupersedeOthers, projectID, branch, e.ID)
	if err != nil {
		return fmt.Errorf("supersede other evaluations: %w", err)
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return fmt.Errorf("supersede other evaluations: %w", err)
	}
	for _, o := range old {
		if err := Notify(ctx, tx, o, status.EvalCancelled); err != nil {
			return err
		}
	}
	if err := Rollback(ctx, tx, append(old, e.ID)); err != nil {
		return err
	}
	return Notify(ctx, tx, e.ID, status.EvalQueued)
}

// isHead asks p.IsHead, if set, with no transaction open; without one the commit is taken to
// be the head.
func isHead(ctx context.Context, p RequestParams) (bool, error) {
	if p.IsHead == nil {
		return true, nil
	}
	head, err := p.IsHead(ctx)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrHeadUnknown, err)
	}
	return head, nil
}

// ErrHeadUnknown wraps a failure of RequestParams.IsHead: whether the commit is the branch's
// head could not be decided, and nothing was recorded.
var ErrHeadUnknown = errors.New("could not ask for the branch's head")

// ErrNotHead is returned for a request whose commit is no longer its branch's head while the
// branch has an evaluation of another commit (see RequestParams.IsHead): nothing was recorded.
var ErrNotHead = errors.New("commit is no longer the branch's head")

// supersede cancels the queued and running evaluations of the project's branch older than
// evaluation id, when the branch supersedes (see Supersedes), and announces them; the caller
// rolls them back in the same transaction.
func supersede(ctx context.Context, tx pgx.Tx, projectID int64, branch string, id int64) ([]int64, error) {
	if !Supersedes(branch) {
		return nil, nil
	}
	rows, err := tx.Query(ctx, sqlSupersede, projectID, branch, id)
	if err != nil {
		return nil, fmt.Errorf("supersede older evaluations: %w", err)
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("supersede older evaluations: %w", err)
	}
	for _, o := range old {
		if err := Notify(ctx, tx, o, status.EvalCancelled); err != nil {
			return nil, err
		}
	}
	return old, nil
}

// Supersedes reports whether a new evaluation on branch cancels older unfinished ones there.
// Merge-queue and bors branches never do: each of their commits is a candidate of its own.
func Supersedes(branch string) bool {
	switch {
	case strings.HasPrefix(branch, "gh-readonly-queue/"), branch == "staging", branch == "trying",
		strings.HasPrefix(branch, "staging.tmp"), strings.HasPrefix(branch, "trying.tmp"):
		return false
	}
	return true
}
