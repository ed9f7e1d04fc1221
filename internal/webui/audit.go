package webui

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Every write of the actions (rebuild, cancel, rebuild-failed, re-evaluate, cancel an
// evaluation) and of the admins' project settings, by a session or a token, is recorded in
// action_log: who, what, when (the database's clock). The build and evaluation pages list the
// entries of what they show.

// auditShown bounds the entries a page lists.
const auditShown = 20

// AuditEntry is one recorded action.
type AuditEntry struct {
	Action string
	// Actor is who: "forge:login", "machine token N" or "the admin token".
	Actor     string
	TokenID   *int64
	TokenName *string
	Message   string
	At        time.Time
}

// Who is the entry's actor with its token: `forge:alice (token "laptop")`.
func (e AuditEntry) Who() string {
	if e.TokenName != nil {
		return fmt.Sprintf("%s (token %q)", e.Actor, *e.TokenName)
	}
	return e.Actor
}

// Verb is the action as a past participle: "rebuilt", "cancelled".
func (e AuditEntry) Verb() string {
	return map[string]string{"rebuild": "rebuilt", "cancel": "cancelled", "rebuild-failed": "failed builds rebuilt",
		"re-evaluate": "re-evaluated"}[e.Action]
}

// record writes who's action on a build ("build"), an evaluation ("eval") or a repository's
// project ("repo") id. A failure is logged: the action is done.
func (u *UI) record(ctx context.Context, kind, action string, id int64, who actor, msg string) {
	ids := map[string]*int64{kind: &id}
	var tokenID *int64
	var tokenName *string
	if who.tokenID != 0 {
		tokenID, tokenName = &who.tokenID, &who.tokenName
	}
	if _, err := u.cfg.Pool.Exec(ctx, sqlAuditInsert, action, ids["build"], ids["eval"], who.String(), tokenID, tokenName, msg,
		ids["repo"]); err != nil {
		u.log.Error("action not recorded", "action", action, kind, id, "by", who.String(), "error", err)
	}
}

// lastSegment is the last segment of a path: an action's name (rebuild, cancel, ...).
func lastSegment(path string) string { return path[strings.LastIndexByte(path, '/')+1:] }

// audit is the recorded actions on build job (kind "build") or evaluation id, newest first.
func (u *UI) audit(ctx context.Context, kind string, id int64) ([]AuditEntry, error) {
	q := sqlAuditEval
	if kind == "build" {
		q = sqlAuditJob
	}
	rows, err := u.cfg.Pool.Query(ctx, q, id, auditShown)
	if err != nil {
		return nil, fmt.Errorf("actions on %s %d: %w", kind, id, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[AuditEntry])
	if err != nil {
		return nil, fmt.Errorf("actions on %s %d: %w", kind, id, err)
	}
	return out, nil
}
