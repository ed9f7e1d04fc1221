package commitstatus

const (
	// The evaluation, locked: transitions of one evaluation run one at a time, each computing
	// its report in a statement that starts after the previous one committed, so a report
	// computed from older data can never overwrite a newer one. $1 id.
	sqlLockEval = `
SELECT e.id, e.status, COALESCE(e.error, ''), e.reuses_eval_id, p.name, r.forge, r.full_name,
       e.commit_sha, COALESCE(r.installation_id, 0), e.last_status, e.reported_status, e.report_attempts
FROM evaluations e JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
WHERE e.id = $1
FOR UPDATE OF e`

	// The evaluation's attributes and their build jobs (an attribute whose outputs were
	// already cached has none: it counts as succeeded), and the flaky ones among the succeeded
	// (a build failure of the same derivation before). A job whose build failure waits for a
	// retry is pending: the status is not red before the retry's result. $1 id.
	sqlAggregate = `
WITH attrs AS (
    SELECT count(*)::int AS attrs, count(*) FILTER (WHERE error IS NOT NULL)::int AS errors
    FROM eval_attrs WHERE eval_id = $1
), drvs AS (
    -- A derivation whose attributes were all detached from its job (a user cancelled it for
    -- this evaluation while others still need it) counts as cancelled, whatever the job does.
    SELECT drv_path, bool_and(detached_at IS NOT NULL) AS detached
    FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL GROUP BY drv_path
)
SELECT attrs.attrs, attrs.errors, count(d.drv_path)::int,
       count(d.drv_path) FILTER (WHERE NOT d.detached AND (j.id IS NULL OR j.status = 'succeeded'))::int,
       count(*) FILTER (WHERE NOT d.detached AND j.status IN ('failed', 'dep-failed'))::int,
       count(*) FILTER (WHERE d.detached OR j.status = 'cancelled')::int,
       count(*) FILTER (WHERE NOT d.detached AND j.status IN ('pending', 'building', 'uploading'))::int,
       COALESCE(min(j.id) FILTER (WHERE NOT d.detached AND j.status = 'failed'),
                min(j.id) FILTER (WHERE NOT d.detached AND j.status = 'dep-failed'), 0),
       count(*) FILTER (WHERE NOT d.detached AND j.status = 'succeeded' AND j.failures > 0)::int
FROM attrs LEFT JOIN drvs d ON true LEFT JOIN build_jobs j ON j.drv_path = d.drv_path
GROUP BY attrs.attrs, attrs.errors`

	// Deduplication across frontends: only the frontend whose UPDATE changes last_status reports it.
	// It also takes the delivery lease unless a live one is held, by another frontend or by a
	// delivery of this one already under way (the holder delivers this report after its own):
	// it returns true only if it took the lease. A lease taken from a frontend that died counts
	// as an attempt, as in sqlTakeOver: its last call may have reached the forge, so the forge
	// is asked before sending again. $1 id, $2 report, $3 final, $4 this node, $5 lease.
	sqlTransition = `
UPDATE evaluations e
SET last_status = $2, last_status_at = now(), report_final = $3,
    report_owner = CASE WHEN prev.free THEN $4 ELSE e.report_owner END,
    report_lease_until = CASE WHEN prev.free THEN now() + $5::interval ELSE e.report_lease_until END,
    report_attempts = e.report_attempts + CASE WHEN e.report_owner IS NOT NULL AND prev.free THEN 1 ELSE 0 END
FROM (SELECT report_owner IS NULL OR report_lease_until < now() AS free FROM evaluations WHERE id = $1) prev
WHERE e.id = $1 AND e.last_status IS DISTINCT FROM $2
RETURNING prev.free`

	// Mark a report final without a change (a project without a configured forge).
	sqlMarkFinal = `UPDATE evaluations SET report_final = true WHERE id = $1`

	// What to deliver, while this node holds the lease. $1 id, $2 this node.
	sqlLeased = `
SELECT e.last_status, e.reported_status, e.report_attempts, e.commit_sha, r.forge, r.full_name,
       COALESCE(r.installation_id, 0)
FROM evaluations e JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
WHERE e.id = $1 AND e.report_owner = $2`

	// $1 id, $2 this node, $3 lease
	sqlRenewLease = `
UPDATE evaluations SET report_lease_until = now() + $3::interval
WHERE id = $1 AND report_owner = $2`

	// $1 id, $2 this node, $3 what the forge now shows
	sqlDelivered = `
UPDATE evaluations SET reported_status = $3
WHERE id = $1 AND report_owner = $2`

	// Done: release the lease if nothing new arrived meanwhile. $1 id, $2 this node.
	sqlRelease = `
UPDATE evaluations SET report_owner = NULL, report_lease_until = NULL, report_attempts = 0,
    report_next_attempt = NULL
WHERE id = $1 AND report_owner = $2 AND reported_status IS NOT DISTINCT FROM last_status`

	// A delivery failed: release the lease and retry after a backoff. $1 id, $2 this node,
	// $3 backoff.
	sqlFailed = `
UPDATE evaluations SET report_owner = NULL, report_lease_until = NULL,
    report_attempts = report_attempts + 1, report_next_attempt = now() + $3::interval
WHERE id = $1 AND report_owner = $2`

	// At start: the deliveries this node id held before it restarted are free to take at once.
	// They count as attempts (the last call may have reached the forge). $1 this node.
	sqlReleaseMine = `
UPDATE evaluations SET report_owner = NULL, report_lease_until = NULL, report_attempts = report_attempts + 1
WHERE report_owner = $1`

	// Evaluations whose forge has not been told their report, and which no live lease covers:
	// failed deliveries whose backoff is over, and deliveries of frontends that died. $1 forges.
	sqlBehind = `
SELECT e.id FROM evaluations e
WHERE e.reported_status IS DISTINCT FROM e.last_status
  AND (e.report_owner IS NULL OR e.report_lease_until < now())
  AND (e.report_next_attempt IS NULL OR e.report_next_attempt <= now())
  AND EXISTS (SELECT 1 FROM projects p JOIN repositories r ON r.id = p.repo_id
              WHERE p.id = e.project_id AND r.forge = ANY($1))
ORDER BY e.report_next_attempt NULLS FIRST, e.id
LIMIT 100`

	// Take over a delivery. A lease taken from a dead frontend counts as an attempt: it may
	// have reached the forge, so the forge is asked before sending again. $1 id, $2 this node,
	// $3 lease.
	sqlTakeOver = `
UPDATE evaluations
SET report_owner = $2, report_lease_until = now() + $3::interval,
    report_attempts = report_attempts + CASE WHEN report_owner IS NULL THEN 0 ELSE 1 END
WHERE id = $1 AND reported_status IS DISTINCT FROM last_status
  AND (report_owner IS NULL OR report_lease_until < now())
  AND (report_next_attempt IS NULL OR report_next_attempt <= now())
RETURNING true`

	// Evaluations of forge projects whose report is not final, recent first: recomputed at
	// start and now and then, in case a notification was lost. $1 forges, $2 how far back.
	sqlOpen = `
SELECT e.id FROM evaluations e JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
WHERE NOT e.report_final AND r.forge = ANY($1) AND e.created_at > now() - $2::interval
ORDER BY e.id DESC
LIMIT 1000`

	// The evaluations whose attributes include these derivations. $1 drv paths, $2 forges.
	sqlEvalsOfDrvs = `
SELECT DISTINCT ea.eval_id FROM eval_attrs ea
JOIN evaluations e ON e.id = ea.eval_id JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
WHERE ea.drv_path = ANY($1) AND r.forge = ANY($2)`
)
