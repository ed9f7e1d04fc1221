package evaluation

import "github.com/jackc/pgx/v5"

// All SQL of the evaluation records: requests, cancels, re-evaluations, rollbacks and reads.

const (
	// The statements that return evaluations list the columns in scanEval's order.
	sqlEvalByID = `
SELECT e.id, e.project_id, p.name, e.flake_url, e.commit_sha, e.branch, COALESCE(e.tree_hash, ''),
       e.status, COALESCE(e.skipped_reason, ''), e.reuses_eval_id, COALESCE(e.claimed_by, ''), e.attempt,
       COALESCE(e.error, ''), e.created_at, e.started_at, e.finished_at, COALESCE(e.pr_number, 0),
       COALESCE(e.pr_author, ''), e.nix_version, e.pr_base, e.base_commit, e.merge_commit
FROM evaluations e JOIN projects p ON p.id = e.project_id WHERE e.id = $1`

	sqlEvalByKey = `
SELECT e.id, e.project_id, p.name, e.flake_url, e.commit_sha, e.branch, COALESCE(e.tree_hash, ''),
       e.status, COALESCE(e.skipped_reason, ''), e.reuses_eval_id, COALESCE(e.claimed_by, ''), e.attempt,
       COALESCE(e.error, ''), e.created_at, e.started_at, e.finished_at, COALESCE(e.pr_number, 0),
       COALESCE(e.pr_author, ''), e.nix_version, e.pr_base, e.base_commit, e.merge_commit
FROM evaluations e JOIN projects p ON p.id = e.project_id
WHERE e.project_id = $1 AND e.commit_sha = $2 AND e.branch = $3`

	// Tree-hash dedup: the newest succeeded evaluation of the project with the same tree, if
	// any of its derivations is still known. $1 project, $2 tree hash.
	sqlTreeHit = `
SELECT e.id FROM evaluations e
WHERE e.project_id = $1 AND e.tree_hash = $2 AND e.status = 'succeeded'
  AND EXISTS (SELECT 1 FROM eval_attrs ea JOIN derivations d ON d.drv_path = ea.drv_path WHERE ea.eval_id = e.id)
ORDER BY e.id DESC LIMIT 1`

	// $1 project, $2 flake url, $3 commit, $4 branch, $5 tree hash ('' = NULL)
	sqlInsertQueued = `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, tree_hash, pr_number, pr_author, pr_base, pr_author_id)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, 0), NULLIF($7, ''), $8, NULLIF($9::bigint, 0))
ON CONFLICT (project_id, commit_sha, branch) DO NOTHING
RETURNING id`

	// $6 pr_number, $7 pr_author, $8 the evaluation reused, $9 pr_base, $10 pr_author_id
	sqlInsertSkipped = `
INSERT INTO evaluations (project_id, flake_url, commit_sha, branch, tree_hash, pr_number, pr_author, pr_base,
                         pr_author_id, status, skipped_reason, reuses_eval_id, finished_at)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), NULLIF($6, 0), NULLIF($7, ''), $9, NULLIF($10::bigint, 0), 'skipped', 'tree_hash_hit', $8, now())
ON CONFLICT (project_id, commit_sha, branch) DO NOTHING
RETURNING id`

	// A webhook delivery acted on; no row back means it was seen before, by its delivery id or
	// its body. $1 forge, $2 delivery id, $3 the body's SHA-256 (NULL: none).
	sqlRecordDelivery = `
INSERT INTO webhook_deliveries (forge, delivery_id, body_sha256) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING
RETURNING true`

	sqlDeliveryEval = `UPDATE webhook_deliveries SET eval_id = $3 WHERE forge = $1 AND delivery_id = $2`

	sqlCopyAttrs = `
INSERT INTO eval_attrs (eval_id, attr, drv_path, error)
SELECT $1, attr, drv_path, error FROM eval_attrs WHERE eval_id = $2`

	// Superseding: older queued or running evaluations of the project and branch. $1 project,
	// $2 branch, $3 the new evaluation.
	// Whether a branch has an evaluation of another commit. $1 project, $2 branch, $3 commit.
	sqlOtherCommitOfBranch = `
SELECT EXISTS (SELECT 1 FROM evaluations WHERE project_id = $1 AND branch = $2 AND commit_sha <> $3)`

	sqlSupersede = `
UPDATE evaluations SET status = 'cancelled', finished_at = now(),
    error = 'superseded by evaluation ' || $3::bigint
WHERE project_id = $1 AND branch = $2 AND id < $3 AND status IN ('queued', 'running')
RETURNING id`

	// A branch gone back to a commit whose evaluation was superseded: that evaluation is the
	// head's again and supersedes every other unfinished one of the branch, newer ones too.
	sqlSupersedeOthers = `
UPDATE evaluations SET status = 'cancelled', finished_at = now(),
    error = 'superseded by evaluation ' || $3::bigint
WHERE project_id = $1 AND branch = $2 AND id <> $3 AND status IN ('queued', 'running')
RETURNING id`

	// Re-evaluation: a finished evaluation goes back to the queue as it was before its first
	// claim. attempt is kept: the next claim bumps it, which fences any runner of an earlier
	// attempt. $1 id.
	sqlReevaluate = `
UPDATE evaluations SET status = 'queued', claimed_by = NULL, claimed_at = NULL, started_at = NULL,
    finished_at = NULL, error = NULL, skipped_reason = NULL, reuses_eval_id = NULL, report_final = false,
    base_commit = '', merge_commit = ''
WHERE id = $1 AND status IN ('succeeded', 'failed', 'cancelled', 'skipped')
RETURNING project_id, branch`

	sqlCancelEval = `
UPDATE evaluations SET status = 'cancelled', finished_at = now(), error = $2
WHERE id = $1 AND status IN ('queued', 'running')
RETURNING id`

	// Cancelling, superseding and failing evaluations, and ingesting attributes, are serialised by
	// the job-need lock ($1 db.LockClass, $2 db.LockJobNeed): a job is never cancelled as
	// unneeded while an evaluation that needs it commits its attributes.
	sqlNeedLock = `SELECT pg_advisory_xact_lock($1, $2)`

	// A project's evaluation requests run one at a time. $1 class, $2 project id (folded into
	// the lock's 32-bit key; two projects sharing a key only wait for each other).
	sqlRequestLock = `SELECT pg_advisory_xact_lock($1, ($2::bigint % 2147483647)::int)`

	// Pending jobs in the closure of evaluations $1 that no live evaluation needs are cancelled
	// (a detached attribute needs nothing).
	// "Needed" is searched from the pending jobs upwards: any derivation that depends on a
	// pending job is in "up", a live evaluation's attribute in "up" needs every pending job
	// below it, and the walk down from such attributes stays inside "up".
	sqlCancelUnneeded = `
WITH RECURSIVE cand(drv_path) AS (
    SELECT ea.drv_path FROM eval_attrs ea WHERE ea.eval_id = ANY($1) AND ea.drv_path IS NOT NULL
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN cand c ON di.referrer = c.drv_path
), pending AS MATERIALIZED (
    SELECT bj.drv_path FROM build_jobs bj
    WHERE bj.status = 'pending' AND bj.drv_path IN (SELECT drv_path FROM cand)
), up(drv_path) AS (
    SELECT drv_path FROM pending
  UNION
    SELECT di.referrer FROM derivation_inputs di JOIN up u ON di.input_drv = u.drv_path
), up_set AS MATERIALIZED (
    SELECT drv_path FROM up
), needed(drv_path) AS (
    SELECT ea.drv_path FROM eval_attrs ea JOIN evaluations e ON e.id = ea.eval_id
    WHERE ea.drv_path IN (SELECT drv_path FROM up_set) AND ea.detached_at IS NULL
      AND e.status IN ('queued', 'running', 'succeeded', 'skipped') AND NOT (e.id = ANY($1))
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN needed n ON di.referrer = n.drv_path
    WHERE di.input_drv IN (SELECT drv_path FROM up_set)
)
UPDATE build_jobs bj SET status = 'cancelled', finished_at = now()
WHERE bj.status = 'pending'
  AND bj.drv_path IN (SELECT drv_path FROM pending EXCEPT SELECT drv_path FROM needed)
RETURNING bj.drv_path`

	sqlNotifyEvaluations = `SELECT pg_notify('evaluations', $1)`

	// Attributes of rolled-back evaluations. $1 ids.
	sqlDeleteAttrs = `DELETE FROM eval_attrs WHERE eval_id = ANY($1)`

	// Whether evaluation $3 is the newest of its project's ($1) branch $2.
	sqlNewestOfBranch = `
SELECT NOT EXISTS (SELECT 1 FROM evaluations WHERE project_id = $1 AND branch = $2 AND id > $3)`

	sqlAttrsOfEval = `
SELECT ea.attr, COALESCE(ea.drv_path, ''), COALESCE(ea.error, ''), COALESCE(bj.id, 0), COALESCE(bj.status, ''),
       COALESCE((SELECT array_agg(o.output_path ORDER BY o.output_name) FROM derivation_outputs o
                 WHERE o.drv_path = ea.drv_path), '{}'),
       bj.started_at, bj.finished_at, COALESCE(bj.error_message, '')
FROM eval_attrs ea LEFT JOIN build_jobs bj ON bj.drv_path = ea.drv_path
WHERE ea.eval_id = $1 ORDER BY ea.attr`

	sqlListEvals = `
SELECT e.id, e.project_id, p.name, e.flake_url, e.commit_sha, e.branch, COALESCE(e.tree_hash, ''),
       e.status, COALESCE(e.skipped_reason, ''), e.reuses_eval_id, COALESCE(e.claimed_by, ''), e.attempt,
       COALESCE(e.error, ''), e.created_at, e.started_at, e.finished_at, COALESCE(e.pr_number, 0),
       COALESCE(e.pr_author, ''), e.nix_version, e.pr_base, e.base_commit, e.merge_commit
FROM evaluations e JOIN projects p ON p.id = e.project_id
WHERE ($1 = '' OR p.name = $1) ORDER BY e.id DESC LIMIT $2`

	// Evaluations $1 (ids), in that order.
	sqlEvalsByIDs = `
SELECT e.id, e.project_id, p.name, e.flake_url, e.commit_sha, e.branch, COALESCE(e.tree_hash, ''),
       e.status, COALESCE(e.skipped_reason, ''), e.reuses_eval_id, COALESCE(e.claimed_by, ''), e.attempt,
       COALESCE(e.error, ''), e.created_at, e.started_at, e.finished_at, COALESCE(e.pr_number, 0),
       COALESCE(e.pr_author, ''), e.nix_version, e.pr_base, e.base_commit, e.merge_commit
FROM evaluations e JOIN projects p ON p.id = e.project_id
WHERE e.id = ANY($1) ORDER BY array_position($1, e.id)`

	// A page of project $1's evaluations, newest first, before evaluation $2 (0: from the
	// newest). $3 limit.
	sqlListEvalsBefore = `
SELECT e.id, e.project_id, p.name, e.flake_url, e.commit_sha, e.branch, COALESCE(e.tree_hash, ''),
       e.status, COALESCE(e.skipped_reason, ''), e.reuses_eval_id, COALESCE(e.claimed_by, ''), e.attempt,
       COALESCE(e.error, ''), e.created_at, e.started_at, e.finished_at, COALESCE(e.pr_number, 0),
       COALESCE(e.pr_author, ''), e.nix_version, e.pr_base, e.base_commit, e.merge_commit
FROM evaluations e JOIN projects p ON p.id = e.project_id
WHERE e.project_id = $1 AND ($2::bigint = 0 OR e.id < $2) ORDER BY e.id DESC LIMIT $3`

	// The jobs an evaluation needs, by status: those of its attributes' closures.
	sqlJobCountsOfEval = `
WITH RECURSIVE closure AS (
    SELECT drv_path FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN closure c ON di.referrer = c.drv_path
)
SELECT bj.status, count(*)::int FROM closure JOIN build_jobs bj USING (drv_path) GROUP BY bj.status`
)

// scanEval reads a row of the statements that return evaluations, in their column order.
func scanEval(row pgx.CollectableRow) (Evaluation, error) {
	var e Evaluation
	err := row.Scan(&e.ID, &e.ProjectID, &e.Project, &e.FlakeURL, &e.Commit, &e.Branch, &e.TreeHash,
		&e.Status, &e.SkippedReason, &e.ReusesEvalID, &e.ClaimedBy, &e.Attempt, &e.Error, &e.CreatedAt,
		&e.StartedAt, &e.FinishedAt, &e.PRNumber, &e.PRAuthor, &e.NixVersion, &e.PRBase, &e.BaseCommit, &e.MergeCommit)
	return e, err
}

// Evaluation diffs.
const (
	// The evaluation evaluation $1 is compared with: the latest finished (succeeded, or skipped
	// for the same tree) branch evaluation of its project before it, of its branch, or for a
	// pull request of its base branch. One row, NULL when there is none; no row: no $1.
	sqlDiffBase = `
SELECT (SELECT e.id FROM evaluations e
        WHERE e.project_id = c.project_id AND e.pr_number IS NULL AND e.id < c.id
          AND e.status IN ('succeeded', 'skipped')
          AND e.branch = CASE WHEN c.pr_number IS NULL THEN c.branch ELSE c.pr_base END
        ORDER BY e.id DESC LIMIT 1)
FROM evaluations c WHERE c.id = $1`

	// Each attribute of evaluation $1 or $2 (a skipped one's are those it reuses) with its
	// outcome in $2 (before) and in $1 (after), NULL where it is missing, by name.
	sqlDiff = `
WITH outcome AS (
    SELECT x.side, a.attr,
           CASE WHEN a.error IS NOT NULL OR j.status IN ('failed', 'dep-failed') THEN 'failed'
                WHEN j.id IS NULL OR j.status = 'succeeded' THEN 'succeeded'
                ELSE 'unfinished' END AS outcome
    FROM (SELECT 'after' AS side, COALESCE(reuses_eval_id, id) AS attrs_of FROM evaluations WHERE id = $1
          UNION ALL
          SELECT 'before', COALESCE(reuses_eval_id, id) FROM evaluations WHERE id = $2) x
    JOIN eval_attrs a ON a.eval_id = x.attrs_of
    LEFT JOIN build_jobs j ON j.drv_path = a.drv_path
)
SELECT COALESCE(b.attr, f.attr), b.outcome, f.outcome
FROM (SELECT attr, outcome FROM outcome WHERE side = 'before') b
FULL JOIN (SELECT attr, outcome FROM outcome WHERE side = 'after') f ON f.attr = b.attr
ORDER BY 1`
)
