package webui

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// What a user may do to a build job. A job is shared by every live evaluation interested in it
// (queue.InterestedEvals: an attribute, not detached, whose derivation is the job's or depends on
// it), and whoever writes an evaluation's attributes chooses what it is interested in: a pull
// request may name another project's derivation. So acting on an evaluation is not enough to
// act on its jobs for everyone:
//   - admins may cancel and rebuild any job (and only they boost a rebuild's priority);
//   - a user who may act on every evaluation interested in the job (mayActForEval) may cancel
//     and rebuild it; on a job no live evaluation needs, the rules of mayActOnBuild apply;
//   - a user who may act on some of them may only withdraw those evaluations' interest: the
//     cancel detaches their attributes and the job goes on for the others; no rebuild;
//   - anyone else nothing.

// maxAskedRepos bounds the forge permission requests one job's check makes; a job needed by more
// repositories than that counts as shared.
const maxAskedRepos = 20

// jobAccess is what an actor may do to one build job.
type jobAccess struct {
	all bool    // cancel for everyone, rebuild
	own []int64 // interested evaluations the actor may act on: what a cancel detaches
}

// any reports whether the actor may do anything to the job.
func (j jobAccess) any() bool { return j.all || len(j.own) > 0 }

// evalTarget is an evaluation with its repository and pull request author.
type evalTarget struct {
	id int64
	t  target
}

// mayActForEval reports whether a may act on a job on behalf of evaluation e: e's pull request
// author, a user with write access to e's repository, an admin.
func (u *UI) mayActForEval(ctx context.Context, a actor, e evalTarget) (bool, error) {
	return u.mayAct(ctx, a, []target{e.t})
}

// jobAccessOf is what a may do to job id (a 404 if there is none).
func (u *UI) jobAccessOf(ctx context.Context, a actor, id int64) (jobAccess, error) {
	var exists bool
	if err := u.cfg.Pool.QueryRow(ctx, sqlJobExists, id).Scan(&exists); errors.Is(err, pgx.ErrNoRows) {
		return jobAccess{}, notFound("no build %d", id)
	} else if err != nil {
		return jobAccess{}, err
	}
	if a.admin {
		return jobAccess{all: true}, nil
	}
	if a.login == "" {
		return jobAccess{}, nil
	}
	ids, truncated, err := queue.InterestedEvals(ctx, u.cfg.Pool, id)
	if err != nil {
		return jobAccess{}, err
	}
	if len(ids) == 0 {
		ok, err := u.mayActOnBuild(ctx, a, id)
		return jobAccess{all: ok}, err
	}
	rows, err := u.cfg.Pool.Query(ctx, sqlEvalsTargets, ids)
	if err != nil {
		return jobAccess{}, err
	}
	evals, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (evalTarget, error) {
		var e evalTarget
		err := row.Scan(&e.id, &e.t.Forge, &e.t.FullName, &e.t.Installation, &e.t.Private, &e.t.PRAuthorID)
		return e, err
	})
	if err != nil {
		return jobAccess{}, err
	}
	acc := jobAccess{all: !truncated}
	decided := map[target]bool{}
	asked := map[string]bool{}
	var firstErr error
	for _, e := range evals {
		ok, seen := decided[e.t]
		if !seen {
			repo := e.t.Forge + ":" + strings.ToLower(e.t.FullName)
			if !asked[repo] && len(asked) >= maxAskedRepos {
				acc.all = false
				continue
			}
			asked[repo] = true
			ok, err = u.mayActForEval(ctx, a, e)
			firstErr = cmpErr(firstErr, err)
			if err == nil {
				decided[e.t] = ok
			}
		}
		if ok {
			acc.own = append(acc.own, e.id)
		} else {
			acc.all = false
		}
	}
	if !acc.any() {
		return acc, firstErr
	}
	return acc, nil
}

// mayActOnJob reports whether a may do anything to job id: the page's buttons show then.
func (u *UI) mayActOnJob(ctx context.Context, a actor, id int64) (bool, error) {
	acc, err := u.jobAccessOf(ctx, a, id)
	return acc.any(), err
}

// errShared is the 403 of a rebuild of a job other users' evaluations need too.
var errShared = httpapi.Errorf(http.StatusForbidden, "this build is needed by evaluations you may not act on: only an admin or their owners may rebuild it")

// rebuildPriority is the priority of a rebuild by a: a boost is an admin's.
func rebuildPriority(a actor) int {
	if a.admin {
		return queue.PriorityBoost
	}
	return queue.PriorityNormal
}
