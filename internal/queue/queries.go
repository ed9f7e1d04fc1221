package queue

// All SQL of the queue. Every claim-holder write is guarded by (id, claimed_by, attempt, status)
// and trusts rows-affected; times come from now().

const (
	// Enqueues are serialised by this transaction-scoped lock ($1 db.LockClass, $2 db.LockEnqueue):
	// two concurrent inserts of a job and its input could otherwise each miss the other, leaving
	// the dependent ready too early. Status changes need no such lock (their counter deltas
	// commute).
	sqlEnqueueLock = `SELECT pg_advisory_xact_lock($1, $2)`

	// $1 drv_path[], $2 hash_part[], $3 name[], $4 system[], $5 features (comma-joined)[],
	// $6 nar_hash[], $7 nar_size[], $8 input sources (space-joined)[]
	sqlDerivationsInsert = `
INSERT INTO derivations (drv_path, hash_part, name, system, required_features, nar_hash, nar_size, input_srcs)
SELECT d, h, n, s, CASE WHEN f = '' THEN '{}'::text[] ELSE string_to_array(f, ',') END, nh, ns,
       CASE WHEN src = '' THEN '{}'::text[] ELSE string_to_array(src, ' ') END
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::text[])
     AS t(d, h, n, s, f, nh, ns, src)
ON CONFLICT (drv_path) DO NOTHING`

	// $1 drv_path[], $2 output_name[], $3 output_path[] ('' = NULL)
	sqlOutputsInsert = `
INSERT INTO derivation_outputs (drv_path, output_name, output_path)
SELECT d, o, NULLIF(p, '') FROM unnest($1::text[], $2::text[], $3::text[]) AS t(d, o, p)
ON CONFLICT (drv_path, output_name) DO NOTHING`

	// $1 referrer[], $2 input_drv[], $3 outputs (comma-joined)[]
	sqlInputsInsert = `
INSERT INTO derivation_inputs (referrer, input_drv, outputs)
SELECT r, i, string_to_array(o, ',') FROM unnest($1::text[], $2::text[], $3::text[]) AS t(r, i, o)
ON CONFLICT (referrer, input_drv) DO NOTHING`

	// $1 drv_path[], $2 project_id (NULL for none), $3 dependent_chain[], $4 trusted, $5 retry
	// limit, $6 retry backoff seconds. Returns the derivations and systems of the jobs created.
	sqlJobsInsert = `
INSERT INTO build_jobs (drv_path, project_id, system, required_features, dependent_chain, trusted,
                        retry_limit, retry_backoff_secs)
SELECT d.drv_path, $2, d.system, d.required_features, t.chain, $4, $5, $6
FROM unnest($1::text[], $3::int[]) AS t(drv, chain) JOIN derivations d ON d.drv_path = t.drv
ON CONFLICT (drv_path) DO NOTHING
RETURNING drv_path, system`

	// Raises the chains of jobs that existed before an enqueue which put new jobs above them:
	// each seed ($1 drv_path[], $2 the chain it must reach at least) and, while a job's chain
	// grows, its inputs' pending jobs, one more than it. A job whose chain is already long
	// enough stops the walk: its inputs' chains are longer still.
	sqlRaiseChains = `
WITH RECURSIVE raise(drv_path, chain) AS (
    SELECT t.d, t.c FROM unnest($1::text[], $2::int[]) AS t(d, c)
  UNION
    SELECT di.input_drv, r.chain + 1
    FROM raise r
    JOIN build_jobs bj ON bj.drv_path = r.drv_path
    JOIN derivation_inputs di ON di.referrer = r.drv_path
    WHERE bj.status = 'pending' AND bj.dependent_chain < r.chain
)
UPDATE build_jobs bj SET dependent_chain = m.chain
FROM (SELECT drv_path, max(chain) AS chain FROM raise GROUP BY drv_path) m
WHERE bj.drv_path = m.drv_path AND bj.status = 'pending' AND bj.dependent_chain < m.chain`

	// Raises pending jobs' chains to at least $2[i] for $1[i] (no walk below them), the rows
	// locked in id order: another raise, or a finish's readiness step, may lock some of them.
	sqlSetChains = `
WITH locked AS (
    SELECT bj.id, t.c FROM build_jobs bj JOIN unnest($1::text[], $2::int[]) AS t(d, c) ON bj.drv_path = t.d
    WHERE bj.status = 'pending' AND bj.dependent_chain < t.c
    ORDER BY bj.id
    FOR NO KEY UPDATE OF bj
)
UPDATE build_jobs bj SET dependent_chain = l.c FROM locked l
WHERE bj.id = l.id AND bj.status = 'pending' AND bj.dependent_chain < l.c`

	sqlNotify     = `SELECT pg_notify('build_jobs', $1)`
	sqlNotifyMany = `SELECT pg_notify('build_jobs', p) FROM unnest($1::text[]) AS t(p)`

	// The claim (FOR UPDATE SKIP LOCKED, so concurrent builders never take the same job) over
	// maintained readiness: the
	// function claim_jobs (migration 0011) holds the statement, so that its plan is cached
	// generic. $1 systems, $2 features, $3 node id, $4 per-(system,project) candidates, $5 limit.
	sqlClaim = `
SELECT id, drv_path, system, project_id, priority, attempt, retry_count, required_features, claimed_at
FROM claim_jobs($1, $2, $3, $4, $5)`

	// The claim with readiness checked by NOT EXISTS per candidate instead of maintained,
	// kept for the benchmark's comparison only. $1 systems, $2 features, $3 node id, $4 limit.
	sqlClaimNotExists = `
WITH ready AS (
    SELECT bj.id
    FROM build_jobs bj
    JOIN derivations d USING (drv_path)
    LEFT JOIN projects p ON p.id = bj.project_id
    WHERE bj.status = 'pending'
      AND d.system = ANY($1::text[])
      AND d.required_features <@ $2::text[]
      AND NOT EXISTS (
          SELECT 1 FROM derivation_inputs di
          JOIN build_jobs dep ON dep.drv_path = di.input_drv
          WHERE di.referrer = bj.drv_path AND dep.status NOT IN ('succeeded')
      )
    ORDER BY bj.priority DESC,
             COALESCE(p.consumed_seconds / GREATEST(p.scheduling_shares, 1), 0) ASC,
             bj.created_at ASC
    LIMIT $4
    FOR UPDATE OF bj SKIP LOCKED
)
UPDATE build_jobs SET status = 'building', claimed_by = $3, claimed_at = now(), started_at = now(),
    attempt = build_jobs.attempt + 1
FROM ready WHERE build_jobs.id = ready.id
RETURNING build_jobs.id, build_jobs.drv_path, build_jobs.system, build_jobs.project_id,
          build_jobs.priority, build_jobs.attempt, build_jobs.retry_count,
          build_jobs.required_features, build_jobs.claimed_at`

	// Guarded finishes: $1 id, $2 node, $3 attempt. Each returns the project and the seconds the
	// attempt took, which the caller charges to the project (see Charger).
	//
	// Success is one statement (one round trip, no explicit transaction). Its notification is
	// the caller's, batched (see Announcer).
	// $4 the log's blob key, or NULL to keep log_url; $5, $6 the enqueue lock.
	//
	// A success moves the job into 'succeeded', so it takes the readiness lock shared ($5, $6:
	// db.LockClass, db.LockEnqueue; see sqlEnqueueLock) before it touches the row: the uncorrelated EXISTS is a one-time
	// filter, evaluated before the scan. Taken later, by the readiness trigger with the row
	// already locked, it could deadlock against an enqueue of the same job waiting on that row.
	sqlJobSucceed = `
UPDATE build_jobs SET status = 'succeeded', finished_at = now(), exit_code = 0, error_message = NULL,
    log_url = COALESCE($4, log_url)
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status IN ('building', 'uploading')
  AND EXISTS (SELECT FROM pg_advisory_xact_lock_shared($5, $6))
RETURNING project_id, EXTRACT(EPOCH FROM now() - started_at)::float8, drv_path, failures > 0`

	sqlJobUploading = `
UPDATE build_jobs SET status = 'uploading'
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status = 'building'`

	// $4 exit code, $5 error message, $6 log key (all nullable). Past 3 retries a transient failure is permanent.
	sqlJobFailTransient = `
UPDATE build_jobs SET
    status      = CASE WHEN retry_count < 3 THEN 'pending' ELSE 'failed' END,
    retry_count = retry_count + CASE WHEN retry_count < 3 THEN 1 ELSE 0 END,
    claimed_by  = CASE WHEN retry_count < 3 THEN NULL ELSE claimed_by END,
    claimed_at  = CASE WHEN retry_count < 3 THEN NULL ELSE claimed_at END,
    finished_at = CASE WHEN retry_count < 3 THEN NULL ELSE now() END,
    exit_code   = $4,
    error_message = $5,
    log_url     = COALESCE($6, log_url)
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status IN ('building', 'uploading')
RETURNING status, project_id, EXTRACT(EPOCH FROM now() - started_at)::float8, drv_path, system`

	// A build failure: failed, or back to the queue after the job's backoff while its retry
	// policy (retry_limit, recorded by the evaluations that need it) has retries left. Either
	// way it counts in failures, which makes a later success flaky.
	sqlJobFailPermanent = `
UPDATE build_jobs SET
    status          = CASE WHEN failure_retries < retry_limit THEN 'pending' ELSE 'failed' END,
    failure_retries = failure_retries + CASE WHEN failure_retries < retry_limit THEN 1 ELSE 0 END,
    failures        = failures + 1,
    retry_at        = CASE WHEN failure_retries < retry_limit
                           THEN now() + make_interval(secs => retry_backoff_secs) END,
    claimed_by      = CASE WHEN failure_retries < retry_limit THEN NULL ELSE claimed_by END,
    claimed_at      = CASE WHEN failure_retries < retry_limit THEN NULL ELSE claimed_at END,
    finished_at     = CASE WHEN failure_retries < retry_limit THEN NULL ELSE now() END,
    exit_code = $4, error_message = $5, log_url = COALESCE($6, log_url)
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status IN ('building', 'uploading')
RETURNING status, project_id, EXTRACT(EPOCH FROM now() - started_at)::float8, drv_path, system`

	// A claim given back unfinished (a draining node past its drain timeout): no retry counted.
	sqlJobRelease = `
UPDATE build_jobs SET status = 'pending', claimed_by = NULL, claimed_at = NULL, started_at = NULL
WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status IN ('building', 'uploading')
RETURNING system`

	// Cancel by a user: pending or building (the builder learns of it and stops).
	sqlJobCancel = `
UPDATE build_jobs SET status = 'cancelled', finished_at = now()
WHERE id = $1 AND status IN ('pending', 'building', 'uploading')
RETURNING id, drv_path`

	// The job-need lock ($1 db.LockClass, $2 db.LockJobNeed) that the evaluator's ingest and the
	// cancelling of unneeded jobs take too: while a cancel holds it, no evaluation becomes
	// interested in a job or stops being.
	sqlNeedLock = `SELECT pg_advisory_xact_lock($1, $2)`

	// A job a user cancels, if unfinished, locked against finishes until the cancel commits.
	// $1 job id.
	sqlJobLockForCancel = `
SELECT drv_path FROM build_jobs WHERE id = $1 AND status IN ('pending', 'building', 'uploading')
FOR UPDATE`

	// The live evaluations interested in job $1 (see migration 0019): an attribute not detached
	// whose derivation is the job's or depends on it. At most $2.
	sqlInterestedEvals = `
WITH RECURSIVE up(drv_path) AS (
    SELECT drv_path FROM build_jobs WHERE id = $1
  UNION
    SELECT di.referrer FROM derivation_inputs di JOIN up ON di.input_drv = up.drv_path
)
SELECT DISTINCT a.eval_id FROM up
JOIN eval_attrs a ON a.drv_path = up.drv_path AND a.detached_at IS NULL
JOIN evaluations e ON e.id = a.eval_id AND e.status IN ('queued', 'running', 'succeeded', 'skipped')
ORDER BY a.eval_id LIMIT $2`

	// Evaluations $2 give up their interest in job $1: each of their attributes whose derivation
	// is the job's or depends on it is detached. Returns the evaluations.
	sqlDetachInterest = `
WITH RECURSIVE up(drv_path) AS (
    SELECT drv_path FROM build_jobs WHERE id = $1
  UNION
    SELECT di.referrer FROM derivation_inputs di JOIN up ON di.input_drv = up.drv_path
)
UPDATE eval_attrs a SET detached_at = now()
WHERE a.eval_id = ANY($2) AND a.detached_at IS NULL AND a.drv_path IN (SELECT drv_path FROM up)
RETURNING a.eval_id`

	// $1 project ids, $2 seconds.
	sqlProjectsCharge = `
UPDATE projects p SET consumed_seconds = p.consumed_seconds + t.secs
FROM unnest($1::bigint[], $2::float8[]) AS t(id, secs)
WHERE p.id = t.id`
	// (The caller passes ids sorted; the update visits them in that order.)

	// After a permanent failure every pending job above it becomes dep-failed, since it can never
	// build. A
	// cancelled job propagates the same way: its dependents can no longer build either.
	// $1 ids of jobs that just failed or were cancelled. Returns how many were marked.
	sqlPropagateFailure = `
WITH RECURSIVE to_fail AS (
    SELECT bj.drv_path FROM build_jobs bj WHERE bj.id = ANY($1) AND bj.status IN ('failed', 'cancelled')
  UNION
    SELECT di.referrer
    FROM derivation_inputs di
    JOIN to_fail tf ON tf.drv_path = di.input_drv
    JOIN build_jobs bj ON bj.drv_path = di.referrer
    WHERE bj.status = 'pending'
), marked AS (
    UPDATE build_jobs SET status = 'dep-failed', finished_at = now()
    WHERE drv_path IN (SELECT drv_path FROM to_fail) AND status = 'pending'
    RETURNING drv_path
)
SELECT count(pg_notify('build_jobs', json_build_object('drv_path', drv_path, 'status', 'dep-failed')::text))
FROM marked`

	// Manual rebuild, the only way a failed job runs again: a failed job back to pending at
	// priority $2, with fresh retries, and its
	// dep-failed dependents back to pending; readiness keeps them waiting for their inputs.
	// $1 job id. Returns the number of jobs reset (0: the job was not failed).
	sqlRebuild = `
WITH RECURSIVE root AS (
    UPDATE build_jobs SET status = 'pending', priority = $2, retry_count = 0, failure_retries = 0, retry_at = NULL,
        claimed_by = NULL, claimed_at = NULL, started_at = NULL, finished_at = NULL, exit_code = NULL,
        error_message = NULL
    WHERE id = $1 AND status IN ('failed', 'dep-failed', 'cancelled')
    RETURNING drv_path, system
), to_reset AS (
    SELECT drv_path FROM root
  UNION
    SELECT di.referrer FROM derivation_inputs di
    JOIN to_reset tr ON tr.drv_path = di.input_drv
    JOIN build_jobs bj ON bj.drv_path = di.referrer
    WHERE bj.status = 'dep-failed'
), dependents AS (
    UPDATE build_jobs SET status = 'pending', finished_at = NULL
    WHERE drv_path IN (SELECT drv_path FROM to_reset) AND status = 'dep-failed'
      AND drv_path NOT IN (SELECT drv_path FROM root)
    RETURNING system
)
SELECT (SELECT count(*) FROM root) + (SELECT count(*) FROM dependents),
       ARRAY(SELECT DISTINCT system FROM (SELECT system FROM root UNION ALL SELECT system FROM dependents) s)`

	// Dead-node reaper, paginated: claims of nodes silent past the threshold (or with no row at
	// all) go back to pending, or fail past 3 retries. $1 threshold seconds, $2 page size.
	sqlReapDeadClaims = `
WITH stale AS (
    SELECT bj.id FROM build_jobs bj
    WHERE bj.status IN ('building', 'uploading')
      AND NOT EXISTS (SELECT 1 FROM nodes n
                      WHERE n.id = bj.claimed_by AND n.last_seen >= now() - make_interval(secs => $1))
    ORDER BY bj.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE build_jobs bj SET
    status      = CASE WHEN retry_count < 3 THEN 'pending' ELSE 'failed' END,
    claimed_by  = CASE WHEN retry_count < 3 THEN NULL ELSE claimed_by END,
    claimed_at  = CASE WHEN retry_count < 3 THEN NULL ELSE claimed_at END,
    started_at  = CASE WHEN retry_count < 3 THEN NULL ELSE started_at END,
    finished_at = CASE WHEN retry_count < 3 THEN NULL ELSE now() END,
    retry_count = retry_count + CASE WHEN retry_count < 3 THEN 1 ELSE 0 END
FROM stale WHERE bj.id = stale.id
RETURNING bj.id, bj.status, bj.system, bj.drv_path`

	sqlReapDeadEvals = `
UPDATE evaluations e SET status = 'queued', claimed_by = NULL, claimed_at = NULL, started_at = NULL
WHERE e.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM nodes n
                  WHERE n.id = e.claimed_by AND n.last_seen >= now() - make_interval(secs => $1))`

	// The units of evaluations that dead nodes walk go back to the queue, for any evaluator; the
	// next claim raises their attempt, so the dead node's walk can no longer mark them done. $1
	// liveness threshold seconds.
	sqlReapDeadUnits = `
UPDATE eval_units u SET status = 'queued', claimed_by = NULL, claimed_at = NULL
WHERE u.status = 'running'
  AND NOT EXISTS (SELECT 1 FROM nodes n
                  WHERE n.id = u.claimed_by AND n.last_seen >= now() - make_interval(secs => $1))`

	// The units one node id walks (its previous incarnation, at re-registration).
	sqlReleaseNodeUnits = `
UPDATE eval_units SET status = 'queued', claimed_by = NULL, claimed_at = NULL
WHERE claimed_by = $1 AND status = 'running'`

	// Releases everything one node id holds (its previous incarnation, at re-registration).
	sqlReleaseNodeClaims = `
UPDATE build_jobs SET
    status      = CASE WHEN retry_count < 3 THEN 'pending' ELSE 'failed' END,
    claimed_by  = CASE WHEN retry_count < 3 THEN NULL ELSE claimed_by END,
    claimed_at  = CASE WHEN retry_count < 3 THEN NULL ELSE claimed_at END,
    started_at  = CASE WHEN retry_count < 3 THEN NULL ELSE started_at END,
    finished_at = CASE WHEN retry_count < 3 THEN NULL ELSE now() END,
    retry_count = retry_count + CASE WHEN retry_count < 3 THEN 1 ELSE 0 END
WHERE claimed_by = $1 AND status IN ('building', 'uploading')
RETURNING id, status, system, drv_path`

	sqlReleaseNodeEvals = `
UPDATE evaluations SET status = 'queued', claimed_by = NULL, claimed_at = NULL, started_at = NULL
WHERE claimed_by = $1 AND status = 'running'`

	// Unsupported builds fail rather than wait forever: pending past the grace and no live,
	// non-draining node has the
	// system and every required feature. $1 grace seconds, $2 liveness threshold seconds.
	sqlFailUnsupported = `
UPDATE build_jobs bj SET status = 'failed', exit_code = NULL, finished_at = now()
WHERE bj.status = 'pending'
  AND bj.created_at < now() - make_interval(secs => $1)
  AND NOT EXISTS (
      SELECT 1 FROM nodes n
      WHERE n.last_seen > now() - make_interval(secs => $2)
        AND n.status <> 'dead' AND NOT n.draining
        AND 'builder' = ANY(n.roles)
        AND bj.system = ANY(n.systems)
        AND bj.required_features <@ n.features)
RETURNING bj.id, bj.drv_path`

	// Hourly decay of consumed_seconds, so fair shares weigh recent builder time and forget old
	// usage (factor 0.95: a half-life of about 13 hours).
	sqlDecayShares = `
UPDATE projects SET consumed_seconds = consumed_seconds * $1 WHERE consumed_seconds > 0`

	// Jobs whose maintained count disagrees with the truth, or whose ready flag with the count
	// (both are written by the readiness triggers and recount_blocked); a non-empty result is
	// a bug, fixed here and logged. $1 page size.
	sqlReadinessAudit = `
WITH truth AS (
    SELECT bj.id, bj.blocked_inputs AS have, bj.ready, (
        SELECT count(*) FROM derivation_inputs di
        JOIN build_jobs dep ON dep.drv_path = di.input_drv
        WHERE di.referrer = bj.drv_path AND dep.status <> 'succeeded')::int AS want
    FROM build_jobs bj WHERE bj.status = 'pending'
), wrong AS (
    SELECT id FROM truth WHERE have <> want OR ready <> (want = 0) ORDER BY id LIMIT $1
)
SELECT count(*) FROM (SELECT recount_blocked(ARRAY(SELECT id FROM wrong))) r, wrong`
)

// One job as users see it.
const sqlJobInfo = `
SELECT bj.id, bj.drv_path, COALESCE(p.name, ''), bj.system, bj.status, bj.priority, bj.attempt, bj.retry_count,
       COALESCE(bj.claimed_by, ''), bj.started_at, bj.finished_at, bj.exit_code, COALESCE(bj.error_message, ''),
       COALESCE(bj.log_url, ''), bj.created_at, bj.failures, bj.retry_limit, bj.retry_at
FROM build_jobs bj LEFT JOIN projects p ON p.id = bj.project_id
WHERE bj.id = $1`

// The ended attempts of job $1, the first first.
const sqlJobAttempts = `
SELECT attempt, COALESCE(node, ''), started_at, finished_at, status, exit_code, COALESCE(error, ''),
       COALESCE(log_key, '')
FROM build_attempts WHERE job_id = $1 ORDER BY attempt`
