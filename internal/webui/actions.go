package webui

import (
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
)

// The actions, all POST: rebuild and cancel a build, rebuild an evaluation's failed builds,
// re-evaluate and cancel an evaluation. A browser authenticates with the session cookie and the
// CSRF token (form field "csrf" or header X-CSRF-Token); scripts with "Authorization: Bearer
// <admin token>" and no CSRF token. permission.go says who may act.
//
// Answers: a plain form post (no HX-Request, Accept: text/html) is sent back to the page with a
// 303 (its Referer if that is a page of the UI, else the evaluation's or build's page), or to
// the login when logged out; HTMX gets a small HTML fragment; other clients JSON.

// maxActionBody bounds an action's form body.
const maxActionBody = 64 << 10

// actionTimeout bounds an action: the forge's permission answer and the database work.
const actionTimeout = time.Minute

// actionFunc carries out an action on id for who and returns what to tell the user.
type actionFunc func(ctx context.Context, id int64, who actor) (string, error)

// registerActions mounts the actions; on a build or evaluation the caller may not read, an
// action answers as on one that does not exist.
func (u *UI) registerActions(rt *access.Routes) {
	build := access.Job("id").Deny(func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, notFound("no build %s", r.PathValue("id")), "/ci/")
	})
	eval := access.Eval("id").Deny(func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, notFound("no evaluation %s", r.PathValue("id")), "/ci/")
	})
	rt.Handle("POST /api/builds/{id}/rebuild", build, u.action("build", u.rebuildBuild))
	rt.Handle("POST /api/builds/{id}/cancel", build, u.action("build", u.cancelBuild))
	rt.Handle("POST /api/evals/{id}/rebuild-failed", eval, u.action("eval", u.rebuildFailed))
	rt.Handle("POST /api/evals/{id}/re-evaluate", eval, u.action("eval", u.reevaluate))
	rt.Handle("POST /api/evals/{id}/cancel", eval, u.action("eval", u.cancelEval))
}

// action wraps an actionFunc on a build ("build") or an evaluation ("eval") with
// authentication, the CSRF check, the permission check and the answer.
func (u *UI) action(kind string, run actionFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		r.Body = http.MaxBytesReader(w, r.Body, maxActionBody)
		id, err := pathID(r, map[string]string{"build": "build", "eval": "evaluation"}[kind])
		if err != nil {
			u.fail(w, r, err, "/ci/")
			return
		}
		who, msg, err := u.act(r, kind, id, run)
		if err != nil {
			u.fail(w, r, err, u.backURL(ctx, kind, id))
			return
		}
		u.log.Info("action", "action", r.URL.Path, "by", who.String(), "result", msg)
		u.record(ctx, kind, lastSegment(r.URL.Path), id, who, msg)
		switch {
		case r.Header.Get("HX-Request") == "true":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-store")
			fmt.Fprintf(w, `<p class="flash ok" role="status">%s</p>`, template.HTMLEscapeString(msg))
		case browserForm(r):
			http.Redirect(w, r, u.returnTo(r, u.backURL(ctx, kind, id)), http.StatusSeeOther)
		default:
			httpapi.WriteJSON(w, http.StatusOK, map[string]any{"message": msg, kind: id})
		}
	})
}

// act authenticates the request, checks the permission and runs the action.
func (u *UI) act(r *http.Request, kind string, id int64, run actionFunc) (actor, string, error) {
	who, err := u.authenticate(r)
	if err != nil {
		return who, "", err
	}
	ctx := r.Context()
	check := u.mayActOnEval
	if kind == "build" {
		// What a user may do to a job depends on the action (jobaccess.go): each build action
		// checks it itself.
		check = u.mayActOnJob
	}
	ok, err := check(ctx, who, id)
	switch {
	case err != nil && !ok:
		return who, "", err // no such build or evaluation, the forge did not answer, the database failed
	case !ok:
		return who, "", errNoPermission
	}
	msg, err := run(ctx, id, who)
	return who, msg, err
}

// authenticate is an API token or the admin token (Authorization: Bearer), or the session with a valid CSRF
// token; otherwise a 401 (no credentials) or 403 (a bad CSRF token).
func (u *UI) authenticate(r *http.Request) (actor, error) {
	if id, ok := tokenOf(r); ok {
		return u.tokenActor(r.Context(), id), nil // a bearer token is not ambient: no CSRF
	}
	if tok, ok := httpapi.BearerToken(r); ok {
		if !u.auth.hasAdmin || !u.auth.admin.Matches(tok) {
			return actor{}, httpapi.Errorf(http.StatusUnauthorized, "invalid admin token")
		}
		return actor{token: true, admin: true}, nil
	}
	who, err := u.sessionActor(r)
	if err != nil {
		return who, err
	}
	if err := u.auth.sessions.CheckCSRF(r); err != nil {
		return actor{}, &httpapi.Error{Code: http.StatusForbidden, Msg: "cross-site request refused: reload the page and try again", Err: err}
	}
	return who, nil
}

// fail answers an action's error: the HTML error page for a browser's form post (or the login
// page for a 401), else JSON through httpapi.Handle. back is the page to return to after login.
func (u *UI) fail(w http.ResponseWriter, r *http.Request, err error, back string) {
	if browserForm(r) {
		var he *httpapi.Error
		if errors.As(err, &he) && he.Code == http.StatusUnauthorized && u.auth.sessions != nil && len(u.auth.oauth) > 0 {
			http.Redirect(w, r, "/ci/login?"+url.Values{"next": {u.returnTo(r, back)}}.Encode(), http.StatusSeeOther)
			return
		}
		u.renderError(w, r, err)
		return
	}
	httpapi.Handle(u.log, func(http.ResponseWriter, *http.Request) error { return err }).ServeHTTP(w, r)
}

// browserForm reports whether r is a plain form post from a browser, which wants a page back.
func browserForm(r *http.Request) bool {
	return r.Header.Get("HX-Request") != "true" && strings.Contains(r.Header.Get("Accept"), "text/html")
}

// returnTo is the page to send a browser back to: its Referer if that is a page of the UI on
// this host, else fallback.
func (u *UI) returnTo(r *http.Request, fallback string) string {
	ref, err := url.Parse(r.Referer())
	if err != nil || ref.Host == "" || !strings.EqualFold(ref.Host, r.Host) {
		return fallback
	}
	if next := localNext(ref.RequestURI()); next != "" {
		return next
	}
	return fallback
}

// backURL is the page of the evaluation or build, "/ci/" if it has none.
func (u *UI) backURL(ctx context.Context, kind string, id int64) string {
	q, seg := sqlEvalProject, "eval"
	if kind == "build" {
		q, seg = sqlBuildProject, "build"
	}
	var project *string
	if err := u.cfg.Pool.QueryRow(ctx, q, id).Scan(&project); err != nil || project == nil {
		return "/ci/"
	}
	return fmt.Sprintf("/ci/%s/%s/%d", url.PathEscape(*project), seg, id)
}

// rebuildBuild is POST /api/builds/{id}/rebuild: a failed, dep-failed or cancelled job back to
// pending, with its dep-failed dependents; at a boosted priority if an admin asks.
func (u *UI) rebuildBuild(ctx context.Context, id int64, who actor) (string, error) {
	acc, err := u.jobAccessOf(ctx, who, id)
	if err != nil {
		return "", err
	}
	if !acc.all {
		return "", errShared
	}
	n, err := queue.Rebuild(ctx, u.cfg.Pool, id, rebuildPriority(who))
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", httpapi.Errorf(http.StatusConflict, "build %d is not failed, dep-failed or cancelled: nothing to rebuild", id)
	}
	return plural(n, "build", "builds") + " queued again", nil
}

// cancelBuild is POST /api/builds/{id}/cancel: a pending or running job cancelled, or, if
// evaluations the user may not act on need it too, the user's evaluations detached from it.
func (u *UI) cancelBuild(ctx context.Context, id int64, who actor) (string, error) {
	acc, err := u.jobAccessOf(ctx, who, id)
	if err != nil {
		return "", err
	}
	var res queue.CancelResult
	switch {
	case who.admin:
		err = queue.Cancel(ctx, u.cfg.Pool, id)
		res.Cancelled = true
	case acc.any():
		res, err = queue.CancelFor(ctx, u.cfg.Pool, id, acc.own)
	default:
		return "", errNoPermission
	}
	switch {
	case errors.Is(err, queue.ErrStale):
		return "", httpapi.Errorf(http.StatusConflict, "build %d has already finished", id)
	case errors.Is(err, queue.ErrNotInterested):
		return "", errNoPermission
	case err != nil:
		return "", err
	case res.Cancelled:
		return fmt.Sprintf("build %d cancelled", id), nil
	}
	return fmt.Sprintf("build %d goes on for the other evaluations that need it; detached from it: %s",
		id, plural(len(res.Detached), "evaluation", "evaluations")), nil
}

// rebuildFailed is POST /api/evals/{id}/rebuild-failed: every job its failed attributes are
// failed by back to pending with fresh retries (queue.Rebuild each, top-down, so each still
// counts as failed when its turn comes and gets the priority), except, for a user who is not an
// admin, the jobs evaluations they may not act on need too.
func (u *UI) rebuildFailed(ctx context.Context, id int64, who actor) (string, error) {
	rows, err := u.cfg.Pool.Query(ctx, sqlEvalFailed, id)
	if err != nil {
		return "", err
	}
	var ids []int64
	for rows.Next() {
		var j int64
		if err := rows.Scan(&j); err != nil {
			rows.Close()
			return "", err
		}
		ids = append(ids, j)
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	total, shared := 0, 0
	for _, j := range ids {
		if !who.admin {
			acc, err := u.jobAccessOf(ctx, who, j)
			if err != nil {
				return "", err
			}
			if !acc.all {
				shared++
				continue
			}
		}
		n, err := queue.Rebuild(ctx, u.cfg.Pool, j, rebuildPriority(who))
		if err != nil {
			return "", err
		}
		total += n
	}
	switch {
	case total == 0 && shared > 0:
		return "", errShared
	case total == 0:
		return "", httpapi.Errorf(http.StatusConflict, "evaluation %d has no failed builds", id)
	case shared > 0:
		return fmt.Sprintf("%s queued again; not rebuilt, as evaluations you may not act on need them too: %s",
			plural(total, "build", "builds"), plural(shared, "build", "builds")), nil
	}
	return plural(total, "build", "builds") + " queued again", nil
}

// reevaluate is POST /api/evals/{id}/re-evaluate: a finished evaluation queued again.
func (u *UI) reevaluate(ctx context.Context, id int64, _ actor) (string, error) {
	_, err := evaluation.Reevaluate(ctx, u.cfg.Pool, id)
	switch {
	case errors.Is(err, evaluation.ErrNotFound):
		return "", notFound("no evaluation %d", id)
	case errors.Is(err, evaluation.ErrNotFinished):
		return "", httpapi.Errorf(http.StatusConflict, "evaluation %d has not finished: cancel it first", id)
	case err != nil:
		return "", err
	}
	return fmt.Sprintf("evaluation %d queued again", id), nil
}

// cancelEval is POST /api/evals/{id}/cancel: a queued or running evaluation cancelled.
func (u *UI) cancelEval(ctx context.Context, id int64, who actor) (string, error) {
	err := evaluation.Cancel(ctx, u.cfg.Pool, id, "cancelled by "+who.String())
	switch {
	case errors.Is(err, evaluation.ErrNotFound):
		return "", notFound("no evaluation %d", id)
	case errors.Is(err, evaluation.ErrFinished):
		return "", httpapi.Errorf(http.StatusConflict, "evaluation %d has already finished", id)
	case err != nil:
		return "", err
	}
	return fmt.Sprintf("evaluation %d cancelled", id), nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
