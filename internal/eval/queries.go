package eval

// All SQL of the evaluator; that of the evaluation records (requests, cancels, rollbacks) is in
// internal/evaluation. Evaluator writes are guarded by (id, claimed_by, attempt,
// status = 'running') and trust rows-affected; times come from now().

const (
	// The evaluator's claim: the oldest queued evaluation of an enabled project. A new claim
	// forgets what an earlier, reaped attempt recorded. $1 node, $2 the Nix version it evaluates
	// with, $3 its walkers per evaluation and $4 the memory of each.
	sqlClaimEval = `
WITH next AS (
    SELECT e.id FROM evaluations e JOIN projects p ON p.id = e.project_id
    WHERE e.status = 'queued' AND p.enabled
    ORDER BY e.id LIMIT 1
    FOR UPDATE OF e SKIP LOCKED
)
UPDATE evaluations e SET status = 'running', claimed_by = $1, claimed_at = now(), started_at = now(),
    attempt = e.attempt + 1, error = NULL, nix_version = $2,
    workers = $3, worker_memory = $4, worker_restarts = 0
FROM next WHERE e.id = next.id
RETURNING e.id, e.attempt`

	// A walker of the evaluation was restarted past its memory limit. $1 id, $2 node, $3 attempt.
	sqlCountRestart = `
UPDATE evaluations SET worker_restarts = worker_restarts + 1
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'running'`

	// The live frontends an evaluator may ask for a read credential; $1 the dead threshold in
	// seconds.
	sqlFrontends = `
SELECT endpoint FROM nodes
WHERE 'frontend' = ANY(capabilities) AND last_seen > now() - make_interval(secs => $1) AND status <> 'dead'
ORDER BY id`

	sqlRepoOfEval = `
SELECT e.project_id, r.clone_url, r.is_private, e.commit_sha, e.branch, COALESCE(e.pr_number, 0), e.pr_base,
       p.promote_pr_outputs
FROM evaluations e
JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
WHERE e.id = $1`

	// Proves the claim inside an ingest transaction and keeps it until commit, and names the
	// evaluation for the rest of the transaction (harmonia.eval_id): under per-role database
	// roles an evaluator's login writes derivations and jobs only for a running evaluation it
	// holds, which the row-level security policies read from that setting. $1 id, $2 node,
	// $3 attempt.
	sqlHoldClaim = `
SELECT e.status FROM evaluations e, set_config('harmonia.eval_id', $1::bigint::text, true)
WHERE e.id = $1 AND e.claimed_by = $2 AND e.attempt = $3 FOR SHARE OF e`

	// The retention the evaluation's .harmonia-ci.toml declares, guarded by the claim.
	sqlSetRetention = `
UPDATE evaluations SET retention_seconds = $4 WHERE id = $1 AND claimed_by = $2 AND attempt = $3`

	sqlEvalStatus = `SELECT status FROM evaluations WHERE id = $1 AND claimed_by = $2 AND attempt = $3`

	// A helper's view of the evaluation: its status at the attempt the helper's units belong to.
	sqlEvalStatusAt = `SELECT status FROM evaluations WHERE id = $1 AND attempt = $2`

	sqlKnownDerivations = `SELECT drv_path FROM derivations WHERE drv_path = ANY($1)`

	// Outputs the cache holds by the signer's record (canonical NAR hash set). $1 output paths.
	// The derivations the database has that claim output paths $1, with the derivation hash the
	// signer recorded for each (NULL if none) and whether it stored the .drv at all.
	sqlOutputClaimants = `
SELECT o.output_path, o.drv_path, x.drv_hash, x.hash_part IS NOT NULL
FROM derivation_outputs o
JOIN derivations d ON d.drv_path = o.drv_path
LEFT JOIN drv_objects x ON x.hash_part = d.hash_part AND x.store_path = d.drv_path
WHERE o.output_path = ANY($1)`

	// Any derivation's row counts: only the signer records a hash, on the rows of a derivation
	// whose outputs it checked, and a derivation sharing the path has the same derivation
	// hash (checkSharedOutputs), so Nix would take the path as built for it too. Each path
	// comes with whether it is quarantined (every built row is).
	sqlCachedOutputs = `
SELECT output_path, bool_and(quarantined) FROM derivation_outputs
WHERE output_path = ANY($1) AND nar_hash IS NOT NULL
GROUP BY output_path`

	// A trusted evaluation promotes the quarantined outputs $1 of its new derivations.
	sqlPromoteOutputs = `
UPDATE derivation_outputs SET quarantined = false WHERE output_path = ANY($1) AND quarantined`

	// The jobs an evaluation needs that exist already, in the closure of the known derivations $1
	// it met: cancelled ones (superseded earlier) go back to pending. When the evaluation is
	// trusted ($2), the rest of its unfinished jobs become trusted too (one running for a pull
	// request counts as trusted when it completes: it builds the same derivation), and outputs
	// there that are quarantined (every built row of the path is) are promoted when $3, or else
	// their succeeded jobs go back to pending, trusted, to be built again (the readiness
	// triggers block their dependents again). One walk of the closure for all of it. The jobs
	// made trusted are locked in id order, as the readiness triggers lock them: a job may be
	// finishing. Returns the systems of the jobs revived and of those reset.
	sqlNeedJobs = `
WITH RECURSIVE clo(drv_path) AS (
    SELECT unnest($1::text[])
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN clo c ON di.referrer = c.drv_path
), revived AS (
    UPDATE build_jobs bj SET status = 'pending', finished_at = NULL, claimed_by = NULL, claimed_at = NULL,
        started_at = NULL, trusted = bj.trusted OR $2
    WHERE bj.status = 'cancelled' AND bj.drv_path IN (SELECT drv_path FROM clo)
    RETURNING bj.system
), trust AS (
    UPDATE build_jobs bj SET trusted = true
    FROM (SELECT l.id FROM build_jobs l
          WHERE $2 AND l.drv_path IN (SELECT drv_path FROM clo) AND NOT l.trusted
            AND l.status NOT IN ('succeeded', 'cancelled')
          ORDER BY l.id
          FOR NO KEY UPDATE) locked
    WHERE bj.id = locked.id
), q AS (
    SELECT o.drv_path, o.output_path FROM derivation_outputs o
    WHERE $2 AND o.drv_path IN (SELECT drv_path FROM clo) AND o.quarantined
      AND NOT EXISTS (SELECT 1 FROM derivation_outputs p
                      WHERE p.output_path = o.output_path AND p.nar_hash IS NOT NULL AND NOT p.quarantined)
), promoted AS (
    UPDATE derivation_outputs o SET quarantined = false
    WHERE $3 AND o.output_path IN (SELECT output_path FROM q) AND o.quarantined
), reset AS (
    UPDATE build_jobs bj SET status = 'pending', trusted = true, claimed_by = NULL, claimed_at = NULL,
        started_at = NULL, finished_at = NULL
    WHERE NOT $3 AND bj.drv_path IN (SELECT drv_path FROM q) AND bj.status = 'succeeded'
    RETURNING bj.system
)
SELECT ARRAY(SELECT system FROM revived), ARRAY(SELECT system FROM reset)`

	// The retry policy and failure expiry of an evaluation, on the jobs it needs that exist
	// already, in the closure of the known derivations $1 it met. A failed job whose failure is
	// older than $4 seconds (0: none is) goes back to pending, as a rebuild sends it (fresh
	// retries, its dep-failed dependents pending too), and its next claim is a new attempt. A
	// pending or cancelled job whose policy retries fewer build failures than $2 takes this
	// evaluation's: $2 retries, $3 seconds apart; so does an expired one. (A running job keeps
	// its policy: the evaluator's login writes only queued jobs.) Returns the systems of the
	// jobs reset and the ids of the dependents reset.
	sqlApplyRetryPolicy = `
WITH RECURSIVE clo(drv_path) AS (
    SELECT unnest($1::text[])
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN clo c ON di.referrer = c.drv_path
), expired AS (
    UPDATE build_jobs bj SET status = 'pending', retry_count = 0, failure_retries = 0, retry_at = NULL,
        retry_limit = GREATEST(bj.retry_limit, $2::int),
        retry_backoff_secs = CASE WHEN bj.retry_limit < $2::int THEN $3::int ELSE bj.retry_backoff_secs END,
        claimed_by = NULL, claimed_at = NULL, started_at = NULL, finished_at = NULL, exit_code = NULL,
        error_message = NULL
    WHERE $4::bigint > 0 AND bj.status = 'failed' AND bj.finished_at < now() - make_interval(secs => $4::bigint)
      AND bj.drv_path IN (SELECT drv_path FROM clo)
    RETURNING bj.drv_path, bj.system
), to_reset(drv_path) AS (
    SELECT drv_path FROM expired
  UNION
    SELECT di.referrer FROM derivation_inputs di
    JOIN to_reset tr ON tr.drv_path = di.input_drv
    JOIN build_jobs bj ON bj.drv_path = di.referrer
    WHERE bj.status = 'dep-failed'
), dependents AS (
    UPDATE build_jobs SET status = 'pending', finished_at = NULL
    WHERE drv_path IN (SELECT drv_path FROM to_reset) AND status = 'dep-failed'
    RETURNING id, system
), raised AS (
    UPDATE build_jobs bj SET retry_limit = $2::int, retry_backoff_secs = $3::int
    WHERE $2::int > 0 AND bj.status IN ('pending', 'cancelled') AND bj.retry_limit < $2::int
      AND bj.drv_path IN (SELECT drv_path FROM clo)
)
SELECT ARRAY(SELECT system FROM expired UNION SELECT system FROM dependents), ARRAY(SELECT id FROM dependents)`

	// Dependents $1, just reset with an expired failure below them, that have an input failed,
	// dep-failed or cancelled still: they can never build, so they and the pending jobs above
	// them are dep-failed (again), as a failure's propagation marks them.
	sqlRefailDependents = `
WITH RECURSIVE to_fail(drv_path) AS (
    SELECT bj.drv_path FROM build_jobs bj
    WHERE bj.id = ANY($1) AND bj.status = 'pending'
      AND EXISTS (SELECT 1 FROM derivation_inputs di JOIN build_jobs i ON i.drv_path = di.input_drv
                  WHERE di.referrer = bj.drv_path AND i.status IN ('failed', 'dep-failed', 'cancelled'))
  UNION
    SELECT di.referrer FROM derivation_inputs di
    JOIN to_fail tf ON tf.drv_path = di.input_drv
    JOIN build_jobs bj ON bj.drv_path = di.referrer
    WHERE bj.status = 'pending'
)
UPDATE build_jobs SET status = 'dep-failed', finished_at = now()
WHERE drv_path IN (SELECT drv_path FROM to_fail) AND status = 'pending'`

	// $1 eval, $2 attr[], $3 drv_path[] ('' = NULL), $4 error[] ('' = NULL), $5 the unit that
	// reported each (0 = NULL: the evaluation's roots). An attribute already there (a reclaimed
	// unit's walker reporting again what an earlier attempt committed) is left as it is.
	// The attributes evaluation $1 recorded, every node's.
	sqlCountAttrs = `SELECT count(*) FROM eval_attrs WHERE eval_id = $1`

	sqlInsertAttrs = `
INSERT INTO eval_attrs (eval_id, attr, drv_path, error, unit_id)
SELECT $1, a, NULLIF(d, ''), NULLIF(e, ''), NULLIF(u, 0)
FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[]) AS t(a, d, e, u)
ON CONFLICT (eval_id, attr) DO NOTHING`

	// Proves, inside an ingest transaction, that the units whose attributes it commits are still
	// this node's, at the attempt that walked them, and marks done those walked to the end: one
	// row locked per unit until commit, so the reaper cannot put one back meanwhile. $1 node,
	// $2 unit ids, $3 their attempts, $4 done. Returns the units it holds.
	sqlHoldUnits = `
UPDATE eval_units u SET status = CASE WHEN v.done THEN 'done' ELSE u.status END
FROM unnest($2::bigint[], $3::int[], $4::bool[]) AS v(id, attempt, done)
WHERE u.id = v.id AND u.attempt = v.attempt AND u.claimed_by = $1 AND u.status = 'running'
RETURNING u.id`

	// A helper's ingest transaction proves the evaluation is running at the attempt its units
	// belong to, keeps it so until commit, and names it (as sqlHoldClaim does). $1 id, $2 attempt.
	sqlHoldEval = `
SELECT e.status FROM evaluations e, set_config('harmonia.eval_id', $1::bigint::text, true)
WHERE e.id = $1 AND e.attempt = $2 FOR SHARE OF e`

	// Units a walker handed on, in one statement: the slices of a set it split, or the retry of
	// one attribute (names NULL). Written only while the evaluation runs at that attempt and the
	// parent unit is still the walker's (no parent: the claimant's own roots). $1 eval, $2 eval
	// attempt, $3 parent (0: none), $4 the handed attribute, $5 path, $6 force, $7 a JSON array
	// of the units' names (null: the whole attribute), $8 retry, $9 node, $10 parent's attempt.
	sqlInsertUnits = `
INSERT INTO eval_units (eval_id, eval_attempt, parent_id, handed, path, force, names, retry)
SELECT $1, $2, NULLIF($3, 0), $4, $5, $6,
       CASE WHEN jsonb_typeof(c.names) = 'array' THEN ARRAY(SELECT jsonb_array_elements_text(c.names)) END, $8
FROM jsonb_array_elements($7::jsonb) WITH ORDINALITY AS c(names, n)
WHERE EXISTS (SELECT 1 FROM evaluations e
              WHERE e.id = $1 AND e.attempt = $2 AND e.status = 'running' AND ($3 <> 0 OR e.claimed_by = $9))
  AND ($3 = 0 OR EXISTS (SELECT 1 FROM eval_units p
                         WHERE p.id = $3 AND p.claimed_by = $9 AND p.attempt = $10 AND p.status = 'running'))
ORDER BY c.n`

	// Claims the oldest queued unit of evaluation $2 at attempt $3 for node $1.
	sqlClaimUnitOf = `
WITH next AS (
    SELECT u.id FROM eval_units u JOIN evaluations e ON e.id = u.eval_id AND e.attempt = u.eval_attempt
    WHERE u.eval_id = $2 AND u.eval_attempt = $3 AND u.status = 'queued' AND e.status = 'running'
    ORDER BY u.id LIMIT 1
    FOR UPDATE OF u SKIP LOCKED
)
UPDATE eval_units u SET status = 'running', claimed_by = $1, claimed_at = now(), attempt = u.attempt + 1
FROM next WHERE u.id = next.id
RETURNING u.id, u.attempt, u.eval_id, u.eval_attempt, u.path, u.force, COALESCE(u.names, '{}'), u.retry`

	// An idle evaluator's claim of a unit of an evaluation another node runs: the oldest queued
	// unit of the oldest running evaluation, none of $2 (those it takes part in already).
	sqlClaimUnitToHelp = `
WITH next AS (
    SELECT u.id FROM eval_units u JOIN evaluations e ON e.id = u.eval_id AND e.attempt = u.eval_attempt
    WHERE u.status = 'queued' AND e.status = 'running' AND e.claimed_by <> $1 AND NOT (u.eval_id = ANY($2))
    ORDER BY u.eval_id, u.id LIMIT 1
    FOR UPDATE OF u SKIP LOCKED
)
UPDATE eval_units u SET status = 'running', claimed_by = $1, claimed_at = now(), attempt = u.attempt + 1
FROM next WHERE u.id = next.id
RETURNING u.id, u.attempt, u.eval_id, u.eval_attempt, u.path, u.force, COALESCE(u.names, '{}'), u.retry`

	// What a reclaimed unit's walker skips: the attributes its earlier attempts committed, and
	// what they handed on as units. $1 unit.
	sqlUnitSkip = `
SELECT attr FROM eval_attrs WHERE unit_id = $1
UNION ALL
SELECT handed FROM eval_units WHERE parent_id = $1`

	// Whether the claimant of evaluation $1 at attempt $2 must still wait: units queued, or
	// walked by other nodes ($3 the claimant).
	sqlUnitsOpen = `
SELECT EXISTS (SELECT 1 FROM eval_units
               WHERE eval_id = $1 AND eval_attempt = $2
                 AND (status = 'queued' OR (status = 'running' AND claimed_by <> $3)))`

	// A new attempt of an evaluation forgets the units of earlier ones. $1 id, $2 attempt.
	sqlClearUnits = `DELETE FROM eval_units WHERE eval_id = $1 AND eval_attempt < $2`

	// A helper that stops (drain, or it cannot take part) hands its units of evaluation $2 back.
	// $1 node.
	sqlReleaseUnits = `
UPDATE eval_units SET status = 'queued', claimed_by = NULL, claimed_at = NULL
WHERE claimed_by = $1 AND eval_id = $2 AND status = 'running'`

	// A helper's walk failed (Nix outside any attribute, a ceiling of its node): the evaluation
	// fails, as it does at its claimant's first error, while the helper still walks a unit of
	// it. $1 id, $2 node, $3 attempt, $4 error.
	sqlFailEvalHelped = `
UPDATE evaluations e SET status = 'failed', finished_at = now(), error = $4
WHERE e.id = $1 AND e.attempt = $3 AND e.status = 'running'
  AND EXISTS (SELECT 1 FROM eval_units u
              WHERE u.eval_id = e.id AND u.eval_attempt = e.attempt AND u.claimed_by = $2 AND u.status = 'running')`

	// What a helper evaluates: the commit the claimant recorded (the merge, or the head), and
	// the evaluation's status at the helper's attempt.
	sqlHelpedEval = `
SELECT COALESCE(merge_commit, ''), status FROM evaluations WHERE id = $1 AND attempt = $2`

	// Live evaluator nodes other than $1; $2 the dead threshold in seconds.
	sqlOtherEvaluators = `
SELECT EXISTS (SELECT 1 FROM nodes
               WHERE id <> $1 AND 'evaluator' = ANY(capabilities)
                 AND last_seen > now() - make_interval(secs => $2) AND status <> 'dead' AND NOT draining)`

	// Finishes. $1 id, $2 node, $3 attempt.
	sqlSucceedEval = `
UPDATE evaluations SET status = 'succeeded', finished_at = now()
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'running'`

	// $4 error
	// What a pull request's evaluation evaluates: the base's tip and the merge ('' and '': the
	// head). $1 id, $2 node, $3 attempt, $4 base commit, $5 merge commit.
	sqlSetMerge = `
UPDATE evaluations SET base_commit = $4, merge_commit = $5
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'running'`

	// A pull request that conflicts with its base is not evaluated: cancelled, saying why.
	sqlConflictEval = `
UPDATE evaluations SET status = 'cancelled', finished_at = now(), error = $4
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'running'`

	sqlFailEval = `
UPDATE evaluations SET status = 'failed', finished_at = now(), error = $4
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'running'`

	// An evaluator stopping (drain) hands its evaluation back.
	sqlReleaseEval = `
UPDATE evaluations SET status = 'queued', claimed_by = NULL, claimed_at = NULL, started_at = NULL
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'running'`
)
