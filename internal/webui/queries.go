package webui

// The web UI's SQL. Each page's statements are a block of their own; lists are paged by keyset
// (WHERE id < $before ORDER BY id DESC LIMIT n), never OFFSET.

// Dashboard.
const (
	// Every project with its latest evaluation and that evaluation's attribute jobs by status
	// (an attribute without a job had its outputs cached: it counts as succeeded).
	sqlDashboardProjects = `
SELECT p.id, p.name, r.forge, r.full_name, r.clone_url, p.enabled, r.is_private,
       e.id, e.commit_sha, e.branch, e.status, e.created_at,
       COALESCE(c.total, 0), COALESCE(c.succeeded, 0), COALESCE(c.failed, 0),
       COALESCE(c.running, 0), COALESCE(c.pending, 0)
FROM projects p
JOIN repositories r ON r.id = p.repo_id
LEFT JOIN LATERAL (
    SELECT id, commit_sha, branch, status, created_at FROM evaluations
    WHERE project_id = p.id ORDER BY id DESC LIMIT 1
) e ON true
LEFT JOIN LATERAL (
    SELECT count(*)::int AS total,
           count(*) FILTER (WHERE j.id IS NULL OR j.status = 'succeeded')::int AS succeeded,
           count(*) FILTER (WHERE j.status IN ('failed', 'dep-failed'))::int AS failed,
           count(*) FILTER (WHERE j.status IN ('building', 'uploading'))::int AS running,
           count(*) FILTER (WHERE j.status = 'pending')::int AS pending
    FROM (SELECT DISTINCT drv_path FROM eval_attrs WHERE eval_id = e.id AND drv_path IS NOT NULL) a
    LEFT JOIN build_jobs j ON j.drv_path = a.drv_path
) c ON e.id IS NOT NULL
ORDER BY p.name`

	// The global bar: jobs waiting and running, nodes online.
	sqlQueueBar = `
SELECT count(*) FILTER (WHERE status = 'pending')::int,
       count(*) FILTER (WHERE status = 'building')::int,
       count(*) FILTER (WHERE status = 'uploading')::int,
       (SELECT count(*)::int FROM nodes WHERE status IN ('active', 'draining'))
FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`
)

// Project, nodes and queue pages.
const (
	// A project by name, with its repository. $1 name.
	sqlProject = `
SELECT p.id, p.name, p.enabled, p.scheduling_shares, p.consumed_seconds, p.pr_enabled, p.pr_trust,
       p.poll_interval, p.last_polled, r.forge, r.owner, r.name, r.full_name, r.clone_url, r.is_private,
       r.default_branch
FROM projects p JOIN repositories r ON r.id = p.repo_id
WHERE p.name = $1`

	// The latest evaluation of each branch (pull requests apart), the default branch first, then
	// the most recently evaluated. $1 project, $2 default branch, $3 limit.
	sqlProjectBranches = `
SELECT id, branch, commit_sha, status, created_at, started_at, finished_at, 0, ''
FROM (
    SELECT DISTINCT ON (branch) id, branch, commit_sha, status, created_at, started_at, finished_at
    FROM evaluations WHERE project_id = $1 AND pr_number IS NULL
    ORDER BY branch, id DESC
) b
ORDER BY branch = $2 DESC, id DESC
LIMIT $3`

	// The latest evaluation of each pull request, the most recently evaluated first.
	// $1 project, $2 limit.
	sqlProjectPulls = `
SELECT id, branch, commit_sha, status, created_at, started_at, finished_at, pr_number, pr_author
FROM (
    SELECT DISTINCT ON (pr_number) id, branch, commit_sha, status, created_at, started_at, finished_at,
           pr_number, COALESCE(pr_author, '') AS pr_author
    FROM evaluations WHERE project_id = $1 AND pr_number IS NOT NULL
    ORDER BY pr_number, id DESC
) p
ORDER BY id DESC
LIMIT $2`

	// A page of a project's evaluations, newest first. $1 project, $2 before this id, $3 limit.
	sqlProjectEvals = `
SELECT id, branch, commit_sha, status, created_at, started_at, finished_at, COALESCE(pr_number, 0),
       COALESCE(pr_author, '')
FROM evaluations
WHERE project_id = $1 AND id < $2
ORDER BY id DESC
LIMIT $3`

	// Every node, the live ones first.
	sqlNodes = `
SELECT id, roles, status, draining, systems, features, current_jobs, max_jobs, speed_factor,
       hostname, version, started_at, last_seen, nix_version, nix_protocol
FROM nodes
ORDER BY status = 'dead', id`

	// Pending jobs: how many are ready, how many wait for their inputs (index-only scans of
	// build_jobs_ready_idx and build_jobs_pending_idx).
	sqlQueueCounts = `
SELECT r.n::int, (p.n - r.n)::int
FROM (SELECT count(*) AS n FROM build_jobs WHERE status = 'pending' AND ready) r,
     (SELECT count(*) AS n FROM build_jobs WHERE status = 'pending') p`

	// The queue page and the charts read in a transaction without JIT: the planner prices the
	// per-(system, project) walk by its unLIMITed rows and the charts' grouping by a row per
	// job, far above jit_above_cost, and compiling either would take longer than running it.
	sqlNoJIT = `SET LOCAL jit = off`

	// A page of ready jobs in the claim's order (priority DESC, the project's consumed/shares
	// ratio, dependent_chain DESC, created_at, id), after the cursor ($1 priority, $2 ratio, $3
	// chain, $4 created_at, $5 id; the first page passes a priority above any). Like the claim,
	// it walks build_jobs_ready_idx per (system, project) and merges: the systems come from a
	// skip scan of that index, and each partition's rows after the cursor are those of the
	// cursor's priority past the cursor (which the ratio decides: the whole priority, part of it,
	// or none; within it, the rest of the cursor's chain, then every shorter chain) followed by
	// every lower priority: three index range scans. $6 limit. capable is false when no live
	// builder has the job's system and features; the repository's privacy and name let the page
	// hide private jobs.
	sqlQueueReady = `
WITH RECURSIVE systems AS (
    (SELECT system FROM build_jobs WHERE status = 'pending' AND ready ORDER BY system LIMIT 1)
  UNION ALL
    SELECT (SELECT bj.system FROM build_jobs bj
            WHERE bj.status = 'pending' AND bj.ready AND bj.system > s.system
            ORDER BY bj.system LIMIT 1)
    FROM systems s WHERE s.system IS NOT NULL
), shares AS (
    SELECT p.id AS project_id, p.consumed_seconds / GREATEST(p.scheduling_shares, 1) AS ratio
    FROM projects p
), partitions AS (
    -- Each (system, project) and its cursor: a ratio past the page's takes the whole priority
    -- (from a chain above any, from the start of time). A NULL project_id is no project.
    SELECT sys.system, s.project_id, s.ratio,
           CASE WHEN s.ratio > $2::float8 THEN 2147483647 ELSE $3::int END AS chain,
           CASE WHEN s.ratio > $2::float8 THEN '-infinity' ELSE $4::timestamptz END AS created_at,
           CASE WHEN s.ratio > $2::float8 THEN 0 ELSE $5::bigint END AS id
    FROM systems sys CROSS JOIN (SELECT project_id, ratio FROM shares UNION ALL SELECT NULL, 0) s
    WHERE sys.system IS NOT NULL
), candidates AS (
    SELECT c.id, c.priority, pt.ratio, c.dependent_chain, c.created_at
    FROM partitions pt
    CROSS JOIN LATERAL (
        (SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at FROM build_jobs bj
         WHERE bj.status = 'pending' AND bj.ready
           AND bj.system = pt.system AND bj.project_id = pt.project_id
           AND bj.priority = $1::bigint AND pt.ratio >= $2::float8
           AND bj.dependent_chain = pt.chain AND (bj.created_at, bj.id) > (pt.created_at, pt.id)
         ORDER BY bj.created_at, bj.id
         LIMIT $6)
      UNION ALL
        (SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at FROM build_jobs bj
         WHERE bj.status = 'pending' AND bj.ready
           AND bj.system = pt.system AND bj.project_id = pt.project_id
           AND bj.priority = $1::bigint AND pt.ratio >= $2::float8
           AND bj.dependent_chain < pt.chain
         ORDER BY bj.dependent_chain DESC, bj.created_at, bj.id
         LIMIT $6)
      UNION ALL
        (SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at FROM build_jobs bj
         WHERE bj.status = 'pending' AND bj.ready
           AND bj.system = pt.system AND bj.project_id = pt.project_id
           AND bj.priority < $1::bigint
         ORDER BY bj.priority DESC, bj.dependent_chain DESC, bj.created_at, bj.id
         LIMIT $6)
    ) c
  UNION ALL
    SELECT c.id, c.priority, pt.ratio, c.dependent_chain, c.created_at
    FROM (SELECT * FROM partitions WHERE project_id IS NULL) pt
    CROSS JOIN LATERAL (
        (SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at FROM build_jobs bj
         WHERE bj.status = 'pending' AND bj.ready
           AND bj.system = pt.system AND bj.project_id IS NULL
           AND bj.priority = $1::bigint AND pt.ratio >= $2::float8
           AND bj.dependent_chain = pt.chain AND (bj.created_at, bj.id) > (pt.created_at, pt.id)
         ORDER BY bj.created_at, bj.id
         LIMIT $6)
      UNION ALL
        (SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at FROM build_jobs bj
         WHERE bj.status = 'pending' AND bj.ready
           AND bj.system = pt.system AND bj.project_id IS NULL
           AND bj.priority = $1::bigint AND pt.ratio >= $2::float8
           AND bj.dependent_chain < pt.chain
         ORDER BY bj.dependent_chain DESC, bj.created_at, bj.id
         LIMIT $6)
      UNION ALL
        (SELECT bj.id, bj.priority, bj.dependent_chain, bj.created_at FROM build_jobs bj
         WHERE bj.status = 'pending' AND bj.ready
           AND bj.system = pt.system AND bj.project_id IS NULL
           AND bj.priority < $1::bigint
         ORDER BY bj.priority DESC, bj.dependent_chain DESC, bj.created_at, bj.id
         LIMIT $6)
    ) c
), page AS (
    SELECT * FROM candidates ORDER BY priority DESC, ratio, dependent_chain DESC, created_at, id LIMIT $6
)
SELECT pg.id, pg.priority, pg.ratio, pg.dependent_chain, pg.created_at, bj.system, COALESCE(d.name, bj.drv_path),
       COALESCE(p.name, ''), 0,
       EXISTS (SELECT 1 FROM nodes n
               WHERE n.status = 'active' AND NOT n.draining
                 AND bj.system = ANY (n.systems) AND bj.required_features <@ n.features),
       COALESCE(r.is_private, false), COALESCE(r.forge, ''), COALESCE(r.full_name, '')
FROM page pg
JOIN build_jobs bj ON bj.id = pg.id
LEFT JOIN derivations d ON d.drv_path = bj.drv_path
LEFT JOIN projects p ON p.id = bj.project_id
LEFT JOIN repositories r ON r.id = p.repo_id
ORDER BY pg.priority DESC, pg.ratio, pg.dependent_chain DESC, pg.created_at, pg.id`

	// A page of the pending jobs that wait for their inputs, by priority then age, after the
	// cursor ($1 priority, $2 created_at, $3 id; the first page passes a priority above any), in
	// two range scans of build_jobs_pending_idx as above. $4 limit.
	sqlQueueBlocked = `
WITH page AS (
    (SELECT bj.id FROM build_jobs bj
     WHERE bj.status = 'pending' AND bj.blocked_inputs > 0
       AND bj.priority = $1::bigint AND (bj.created_at, bj.id) > ($2::timestamptz, $3::bigint)
     ORDER BY bj.created_at, bj.id
     LIMIT $4)
  UNION ALL
    (SELECT bj.id FROM build_jobs bj
     WHERE bj.status = 'pending' AND bj.blocked_inputs > 0 AND bj.priority < $1::bigint
     ORDER BY bj.priority DESC, bj.created_at, bj.id
     LIMIT $4)
)
SELECT bj.id, bj.priority, 0::float8, bj.dependent_chain, bj.created_at, bj.system, COALESCE(d.name, bj.drv_path),
       COALESCE(p.name, ''), bj.blocked_inputs,
       EXISTS (SELECT 1 FROM nodes n
               WHERE n.status = 'active' AND NOT n.draining
                 AND bj.system = ANY (n.systems) AND bj.required_features <@ n.features),
       COALESCE(r.is_private, false), COALESCE(r.forge, ''), COALESCE(r.full_name, '')
FROM page pg
JOIN build_jobs bj ON bj.id = pg.id
LEFT JOIN derivations d ON d.drv_path = bj.drv_path
LEFT JOIN projects p ON p.id = bj.project_id
LEFT JOIN repositories r ON r.id = p.repo_id
ORDER BY bj.priority DESC, bj.created_at, bj.id
LIMIT $4`

	// The dashboard's charts: per 10-minute bucket of the 6 hours before $1 (a bucket boundary),
	// the builds that finished in it by result, and the jobs pending at its end (created before
	// it, and neither claimed nor finished by then). A job enters the queue when it is created
	// and leaves it at the first of claimed_at and finished_at. The depth at a bucket's end is
	// the jobs that have waited since before the window (pending, created before it: a count
	// of build_jobs_pending_idx) plus the running sum of the arrivals and departures of the
	// jobs active in the window, those whose GREATEST(created_at, claimed_at, finished_at) falls
	// in it (a job already waiting when the window opens arrives in the first bucket). That
	// condition is the one an expression index on GREATEST(created_at, claimed_at, finished_at)
	// would serve; without it, it is a sequential scan of build_jobs.
	// A job rebuilt or retried loses its earlier claim, so it counts as waiting since its
	// creation.
	sqlActivity = `
WITH jobs AS (
    SELECT bj.status, bj.created_at, bj.finished_at, LEAST(bj.claimed_at, bj.finished_at) AS left_at,
           $1::timestamptz - interval '6 hours' AS lo, $1::timestamptz AS hi
    FROM build_jobs bj
    WHERE bj.created_at < $1::timestamptz
      AND GREATEST(bj.created_at, bj.claimed_at, bj.finished_at) >= $1::timestamptz - interval '6 hours'
), grouped AS MATERIALIZED (
    -- per job: the buckets of its arrival, departure and finish (NULL: none in the window)
    SELECT CASE WHEN left_at IS NULL OR left_at >= lo
                THEN GREATEST(floor(date_part('epoch', created_at - lo) / 600), 0) END AS arrived,
           CASE WHEN left_at >= lo AND left_at < hi
                THEN floor(date_part('epoch', left_at - lo) / 600) END AS departed,
           CASE WHEN finished_at >= lo AND finished_at < hi AND status IN ('succeeded', 'failed')
                THEN floor(date_part('epoch', finished_at - lo) / 600) END AS finished,
           status = 'succeeded' AS ok,
           count(*) AS n
    FROM jobs
    GROUP BY 1, 2, 3, 4
), per_bucket AS (
    SELECT s.b,
           COALESCE(sum(g.n) FILTER (WHERE g.arrived = s.b), 0)
             - COALESCE(sum(g.n) FILTER (WHERE g.departed = s.b), 0) AS delta,
           COALESCE(sum(g.n) FILTER (WHERE g.finished = s.b AND g.ok), 0) AS succeeded,
           COALESCE(sum(g.n) FILTER (WHERE g.finished = s.b AND NOT g.ok), 0) AS failed
    FROM generate_series(0, 35) AS s(b)
    LEFT JOIN grouped g ON true
    GROUP BY s.b
), waiting AS (
    SELECT count(*) AS n FROM build_jobs
    WHERE status = 'pending' AND created_at < $1::timestamptz - interval '6 hours'
)
SELECT pb.b, (waiting.n + sum(pb.delta) OVER (ORDER BY pb.b))::int, pb.succeeded::int, pb.failed::int
FROM per_bucket pb CROSS JOIN waiting
ORDER BY pb.b`
)

// Evaluation and build pages.
const (
	// $1 evaluation id, $2 project name: no row unless the evaluation is of that project.
	sqlEvalHeader = `
SELECT e.id, p.id, p.name, r.forge, r.owner, r.name, r.full_name, e.commit_sha, e.branch, e.status,
       COALESCE(e.skipped_reason, ''), COALESCE(e.error, ''), COALESCE(e.pr_number, 0), COALESCE(e.pr_author, ''),
       e.pr_base, e.base_commit, e.merge_commit,
       e.created_at, e.started_at, e.finished_at, e.reuses_eval_id, e.claimed_by, e.nix_version,
       e.workers, e.worker_memory, e.worker_restarts
FROM evaluations e
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
WHERE e.id = $1 AND p.name = $2`

	// An evaluation's attributes per tab: all, failed (to evaluate or to build), building,
	// pending, succeeded (built or cached); and the flaky ones (succeeded after a build
	// failure of the same derivation). A detached attribute (a user cancelled its job for
	// this evaluation while others still need it) is cancelled, in no tab but all. $1 evaluation id.
	sqlEvalTabCounts = `
SELECT count(*)::int,
       count(*) FILTER (WHERE ea.drv_path IS NULL OR (ea.detached_at IS NULL AND j.status IN ('failed', 'dep-failed')))::int,
       count(*) FILTER (WHERE ea.detached_at IS NULL AND j.status IN ('building', 'uploading'))::int,
       count(*) FILTER (WHERE ea.detached_at IS NULL AND j.status = 'pending')::int,
       count(*) FILTER (WHERE ea.drv_path IS NOT NULL AND ea.detached_at IS NULL AND (j.id IS NULL OR j.status = 'succeeded'))::int,
       count(*) FILTER (WHERE ea.detached_at IS NULL AND j.status = 'succeeded' AND j.failures > 0)::int
FROM eval_attrs ea
LEFT JOIN build_jobs j ON j.drv_path = ea.drv_path
WHERE ea.eval_id = $1`

	// An evaluation's attribute rows (AttrRow), by name, keyset-paged. $1 evaluation id, $2 tab
	// (as sqlEvalTabCounts), $3 only attributes after this name (NULL: from the first), $4 only
	// attributes of these derivations (NULL: any), $5 at most this many (NULL: all).
	//
	// A job that had failed before the evaluation was created is a cached failure: the row
	// names the attempt whose failure it rests on, the first of the failures the job ends with.
	//
	// A dep-failed job's cause is the nearest failed (or cancelled) job below it: failure
	// propagates up through pending jobs only, so the walk follows dep-failed jobs down. Rows
	// are (derivation, depth) pairs, so a diamond of dependencies costs depth × jobs at most.
	sqlEvalAttrRows = `
SELECT ea.id, p.name, ea.attr, COALESCE(ea.drv_path, ''), COALESCE(ea.error, ''), COALESCE(j.id, 0),
       CASE WHEN ea.drv_path IS NULL THEN 'eval error' WHEN ea.detached_at IS NOT NULL THEN 'cancelled'
            WHEN j.id IS NULL THEN 'cached' ELSE j.status END,
       COALESCE(j.claimed_by, ''), j.started_at, j.finished_at,
       COALESCE(cause.id, 0), COALESCE(cause.name, ''), COALESCE(ff.attempt, 0),
       COALESCE(ea.detached_at IS NULL AND j.status = 'succeeded' AND j.failures > 0, false)
FROM eval_attrs ea
JOIN evaluations e ON e.id = ea.eval_id
JOIN projects p ON p.id = e.project_id
LEFT JOIN build_jobs j ON j.drv_path = ea.drv_path
LEFT JOIN LATERAL (
    WITH RECURSIVE down (id, drv_path, status, depth) AS (
        SELECT i.id, i.drv_path, i.status, 1
        FROM derivation_inputs di
        JOIN build_jobs i ON i.drv_path = di.input_drv
        WHERE j.status = 'dep-failed' AND di.referrer = j.drv_path
          AND i.status IN ('failed', 'cancelled', 'dep-failed')
      UNION
        SELECT i.id, i.drv_path, i.status, d.depth + 1
        FROM down d
        JOIN derivation_inputs di ON di.referrer = d.drv_path
        JOIN build_jobs i ON i.drv_path = di.input_drv
        WHERE d.status = 'dep-failed' AND i.status IN ('failed', 'cancelled', 'dep-failed')
    )
    SELECT down.id, dv.name
    FROM down JOIN derivations dv ON dv.drv_path = down.drv_path
    WHERE down.status IN ('failed', 'cancelled')
    ORDER BY down.depth, down.status <> 'failed', down.id
    LIMIT 1
) cause ON true
LEFT JOIN LATERAL (
    SELECT min(a.attempt) AS attempt
    FROM build_attempts a
    WHERE j.status = 'failed' AND j.finished_at < e.created_at AND a.job_id = j.id
      AND a.status IN ('failed', 'retried')
      AND NOT EXISTS (SELECT 1 FROM build_attempts b
                      WHERE b.job_id = a.job_id AND b.attempt > a.attempt AND b.status NOT IN ('failed', 'retried'))
) ff ON true
WHERE ea.eval_id = $1
  AND CASE $2::text
      WHEN 'failed' THEN ea.drv_path IS NULL OR (ea.detached_at IS NULL AND j.status IN ('failed', 'dep-failed'))
      WHEN 'building' THEN ea.detached_at IS NULL AND j.status IN ('building', 'uploading')
      WHEN 'pending' THEN ea.detached_at IS NULL AND j.status = 'pending'
      WHEN 'succeeded' THEN ea.drv_path IS NOT NULL AND ea.detached_at IS NULL AND (j.id IS NULL OR j.status = 'succeeded')
      ELSE true END
  AND ($3::text IS NULL OR ea.attr > $3)
  AND ($4::text[] IS NULL OR ea.drv_path = ANY($4))
ORDER BY ea.attr
LIMIT $5`

	// The timeline's builds: the claimed jobs of an evaluation's attributes and their input
	// closures, newest claim first, each with an attribute naming it (if it is one) and the
	// number of such jobs; and the database's clock. $1 evaluation id, $2 at most this many.
	sqlTimelineBuilds = `
WITH RECURSIVE closure AS (
    SELECT drv_path FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL
  UNION
    SELECT di.input_drv FROM derivation_inputs di JOIN closure c ON di.referrer = c.drv_path
)
SELECT j.id, d.name, COALESCE(a.attr, ''), j.status, j.claimed_by, COALESCE(j.claimed_at, j.started_at),
       j.finished_at, count(*) OVER ()::int, now()
FROM closure
JOIN build_jobs j ON j.drv_path = closure.drv_path
JOIN derivations d ON d.drv_path = j.drv_path
LEFT JOIN LATERAL (
    SELECT attr FROM eval_attrs WHERE eval_id = $1 AND drv_path = j.drv_path ORDER BY attr LIMIT 1
) a ON true
WHERE j.claimed_by IS NOT NULL AND COALESCE(j.claimed_at, j.started_at) IS NOT NULL
ORDER BY COALESCE(j.claimed_at, j.started_at) DESC, j.id DESC
LIMIT $2`

	// A build page's job, and whether the project its URL names exists. $1 job id, $2 project.
	sqlBuildJob = `
SELECT j.id, j.drv_path, d.name, j.system, j.status, j.priority, j.attempt, j.retry_count,
       COALESCE(j.claimed_by, ''), j.claimed_at, j.started_at, j.finished_at, j.exit_code,
       COALESCE(j.error_message, ''), COALESCE(j.log_url, ''), j.created_at, COALESCE(jp.name, ''),
       EXISTS (SELECT 1 FROM projects WHERE name = $2), j.failures, j.retry_limit, j.failure_retries, j.retry_at
FROM build_jobs j
JOIN derivations d ON d.drv_path = j.drv_path
LEFT JOIN projects jp ON jp.id = j.project_id
WHERE j.id = $1`

	// The newest evaluations that have a derivation as an attribute. $1 drv path, $2 limit.
	sqlBuildEvals = `
SELECT e.id, p.name, e.branch, e.commit_sha, e.status, ea.attr, e.created_at, r.is_private, r.forge, r.full_name
FROM eval_attrs ea
JOIN evaluations e ON e.id = ea.eval_id
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
WHERE ea.drv_path = $1
ORDER BY e.id DESC
LIMIT $2`

	// The jobs that take a derivation as an input. $1 drv path, $2 limit.
	sqlBuildDependents = `
SELECT j.id, d.name, j.status, COALESCE(r.is_private, false), COALESCE(r.forge, ''), COALESCE(r.full_name, '')
FROM derivation_inputs di
JOIN build_jobs j ON j.drv_path = di.referrer
JOIN derivations d ON d.drv_path = j.drv_path
LEFT JOIN projects p ON p.id = j.project_id
LEFT JOIN repositories r ON r.id = p.repo_id
WHERE di.input_drv = $1
ORDER BY j.id DESC
LIMIT $2`

	// A build's outputs ($1 its derivation): path, the NAR hash the cache serves, whether only
	// pull requests built the path (quarantined), and the NAR hash of a pull request's build a
	// trusted rebuild did not reproduce ('' for none).
	sqlBuildOutputs = `
SELECT o.output_name, COALESCE(o.output_path, ''), COALESCE(o.nar_hash, ''),
       o.quarantined AND NOT EXISTS (SELECT 1 FROM derivation_outputs c
                                     WHERE c.output_path = o.output_path AND c.nar_hash IS NOT NULL AND NOT c.quarantined),
       COALESCE(o.nonrepro_nar_hash, '')
FROM derivation_outputs o WHERE o.drv_path = $1
ORDER BY o.output_name`

	// A build's log state: status, archived log key, live tail. $1 job id.
	// The ended attempts of job $1, the first first.
	sqlBuildAttempts = `
SELECT attempt, COALESCE(node, ''), started_at, finished_at, status, exit_code, COALESCE(error, ''),
       COALESCE(log_key, '')
FROM build_attempts WHERE job_id = $1 ORDER BY attempt`

	sqlBuildLogState = `
SELECT j.status, COALESCE(j.log_url, ''), t.log_tail
FROM build_jobs j
LEFT JOIN build_log_tails t ON t.build_job_id = j.id
WHERE j.id = $1`

	// The cache nodes that may serve an archived log, the most recently seen first.
	sqlCacheEndpoints = `
SELECT endpoint FROM nodes
WHERE 'cache' = ANY(capabilities) AND status = 'active'
ORDER BY last_seen DESC, id`
)

// Live updates.
const (
	// The attributes of watched evaluations among these derivations. $1 evaluations, $2 drvs.
	sqlWatchedAttrDrvs = `
SELECT DISTINCT eval_id, drv_path FROM eval_attrs WHERE eval_id = ANY($1) AND drv_path = ANY($2)`

	sqlEvalStatus = `SELECT status FROM evaluations WHERE id = $1`

	// The attributes of an evaluation whose builds moved since a time (a second of slack for
	// clocks: the page's time is this node's, the columns the database's). $1 evaluation, $2 time.
	sqlAttrDrvsMovedSince = `
SELECT DISTINCT ea.drv_path FROM eval_attrs ea JOIN build_jobs j ON j.drv_path = ea.drv_path
WHERE ea.eval_id = $1
  AND GREATEST(j.created_at, j.claimed_at, j.started_at, j.finished_at) >= $2::timestamptz - interval '1 second'`
)

// Settings pages.
const (
	// A repository with its project's settings (zero values when it has none), in
	// scanRepoSettings's column order (settings.go).
	//
	// The repositories whose owner/name, forge or project name match an ILIKE pattern ('' for
	// all), by forge and name, after a repository (keyset; 0 for the first page).
	// $1 pattern, $2 after repository id, $3 limit.
	sqlSettingsRepos = `
SELECT r.id, r.forge, r.full_name, r.clone_url, r.default_branch, r.is_private, COALESCE(r.hook_id, ''),
       COALESCE(p.name, ''), p.id IS NOT NULL, COALESCE(p.enabled, false), COALESCE(p.scheduling_shares, 0),
       COALESCE(p.pr_enabled, false), COALESCE(p.pr_trust, ''), COALESCE(p.poll_interval, 0),
       COALESCE(p.promote_pr_outputs, true)
FROM repositories r LEFT JOIN projects p ON p.repo_id = r.id
WHERE ($1::text = '' OR r.full_name ILIKE $1 OR r.forge ILIKE $1 OR p.name ILIKE $1)
  AND ($2::bigint = 0 OR (r.forge, r.full_name) > (SELECT forge, full_name FROM repositories WHERE id = $2))
ORDER BY r.forge, r.full_name
LIMIT $3`

	// One repository. $1 repository id.
	sqlSettingsRepo = `
SELECT r.id, r.forge, r.full_name, r.clone_url, r.default_branch, r.is_private, COALESCE(r.hook_id, ''),
       COALESCE(p.name, ''), p.id IS NOT NULL, COALESCE(p.enabled, false), COALESCE(p.scheduling_shares, 0),
       COALESCE(p.pr_enabled, false), COALESCE(p.pr_trust, ''), COALESCE(p.poll_interval, 0),
       COALESCE(p.promote_pr_outputs, true)
FROM repositories r LEFT JOIN projects p ON p.repo_id = r.id
WHERE r.id = $1`
)

// Job ownership (jobaccess.go).
const (
	// The repositories of evaluations $1, with their pull requests' authors.
	sqlEvalsTargets = `
SELECT e.id, r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private,
       CASE WHEN e.pr_number IS NOT NULL THEN COALESCE(e.pr_author_id, 0) ELSE 0 END
FROM evaluations e
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
WHERE e.id = ANY($1)
ORDER BY e.id`

	sqlJobExists = `SELECT true FROM build_jobs WHERE id = $1`
)

// The [auth] admins' bindings to forge user ids (admins.go).
const (
	// $1: every configured "forge:login" (lower-case login); the others' bindings go.
	sqlAdminUnbindOthers = `DELETE FROM admin_logins WHERE forge || ':' || login <> ALL($1::text[])`

	sqlAdminBound = `SELECT user_id FROM admin_logins WHERE forge = $1 AND login = $2`

	sqlAdminBind = `
INSERT INTO admin_logins (forge, login, user_id) VALUES ($1, $2, $3)
ON CONFLICT (forge, login) DO NOTHING`
)

// Actions: the page an action sends its user back to, and what rebuild-failed rebuilds.
const (
	sqlEvalProject = `SELECT p.name FROM evaluations e JOIN projects p ON p.id = e.project_id WHERE e.id = $1`
	// A job's page is under the project it was queued for, or that of its newest evaluation.
	sqlBuildProject = `
SELECT COALESCE(
    (SELECT p.name FROM projects p WHERE p.id = j.project_id),
    (SELECT p.name FROM eval_attrs a JOIN evaluations e ON e.id = a.eval_id JOIN projects p ON p.id = e.project_id
     WHERE a.drv_path = j.drv_path ORDER BY e.id DESC LIMIT 1))
FROM build_jobs j WHERE j.id = $1`
)

// sqlEvalFailed lists the jobs an evaluation's failed attributes are failed by: the failed
// and dep-failed attribute jobs, and below each dep-failed one its failed, dep-failed or
// cancelled inputs, top-down (attributes first).
const sqlEvalFailed = `
WITH RECURSIVE down(drv_path, depth) AS (
    SELECT a.drv_path, 0 FROM eval_attrs a JOIN build_jobs j ON j.drv_path = a.drv_path
    WHERE a.eval_id = $1 AND j.status IN ('failed', 'dep-failed')
  UNION
    SELECT di.input_drv, d.depth + 1 FROM down d
    JOIN build_jobs r ON r.drv_path = d.drv_path AND r.status = 'dep-failed'
    JOIN derivation_inputs di ON di.referrer = d.drv_path
    JOIN build_jobs j ON j.drv_path = di.input_drv AND j.status IN ('failed', 'dep-failed', 'cancelled')
    WHERE d.depth < 500
)
SELECT j.id FROM down JOIN build_jobs j ON j.drv_path = down.drv_path
GROUP BY j.id ORDER BY min(down.depth), j.id`

// SQL of the permission checks.
const (
	// The repository of an evaluation, and its pull request's author's forge user id.
	sqlEvalTarget = `
SELECT r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private,
       CASE WHEN e.pr_number IS NOT NULL THEN COALESCE(e.pr_author_id, 0) ELSE 0 END
FROM evaluations e
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
WHERE e.id = $1`

	// The repositories a build job belongs to directly: the project it was queued for, and the
	// evaluations that have its derivation as an attribute. NULL forge: the job exists but has
	// neither.
	sqlBuildTargets = `
WITH j AS (SELECT id, drv_path, project_id FROM build_jobs WHERE id = $1)
SELECT r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private, 0::bigint
FROM j JOIN projects p ON p.id = j.project_id JOIN repositories r ON r.id = p.repo_id
UNION
SELECT r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private,
       CASE WHEN e.pr_number IS NOT NULL THEN COALESCE(e.pr_author_id, 0) ELSE 0 END
FROM j
JOIN eval_attrs a ON a.drv_path = j.drv_path
JOIN evaluations e ON e.id = a.eval_id
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
UNION
SELECT NULL, '', 0, false, 0::bigint FROM j`

	// The repositories of the evaluations whose attributes need the job's derivation through
	// their closure (the job is a dependency), at most 200.
	sqlBuildClosureTargets = `
WITH RECURSIVE up(drv_path) AS (
    SELECT drv_path FROM build_jobs WHERE id = $1
  UNION
    SELECT di.referrer FROM derivation_inputs di JOIN up ON di.input_drv = up.drv_path
)
SELECT DISTINCT r.forge, r.full_name, COALESCE(r.installation_id, 0), r.is_private,
       CASE WHEN e.pr_number IS NOT NULL THEN COALESCE(e.pr_author_id, 0) ELSE 0 END
FROM up
JOIN eval_attrs a ON a.drv_path = up.drv_path
JOIN evaluations e ON e.id = a.eval_id
JOIN projects p ON p.id = e.project_id
JOIN repositories r ON r.id = p.repo_id
LIMIT 200`
)

// Badges and "latest" links.
const (
	// The latest evaluation (not cancelled, not a pull request's) of project $1's branch $2 (''
	// is the default branch), and its attributes (all, or the one named $3) by outcome: its
	// status, attributes, evaluation errors, failed builds, unfinished builds. A skipped
	// evaluation counts with the attributes it reuses. No row: no such evaluation.
	sqlBadge = `
WITH e AS (
    SELECT e.status, COALESCE(e.reuses_eval_id, e.id) AS attrs_of
    FROM evaluations e JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
    WHERE p.name = $1 AND e.pr_number IS NULL AND e.status <> 'cancelled'
      AND e.branch = COALESCE(NULLIF($2, ''), r.default_branch)
    ORDER BY e.id DESC LIMIT 1
)
SELECT e.status, count(a.id)::int,
       count(*) FILTER (WHERE a.error IS NOT NULL)::int,
       count(*) FILTER (WHERE j.status IN ('failed', 'dep-failed'))::int,
       count(*) FILTER (WHERE j.status IN ('pending', 'building', 'uploading'))::int
FROM e
LEFT JOIN eval_attrs a ON a.eval_id = e.attrs_of AND ($3 = '' OR a.attr = $3)
LEFT JOIN build_jobs j ON j.drv_path = a.drv_path
GROUP BY e.status`

	// The latest evaluation of project $1's default branch in which attribute $2 built (its
	// job succeeded, or it had none: cached), with that job and the attribute's output path
	// ("out" first). No row: none.
	sqlLatestSucceeded = `
SELECT e.id, j.id, COALESCE(o.output_path, '')
FROM evaluations e
JOIN projects p ON p.id = e.project_id JOIN repositories r ON r.id = p.repo_id
JOIN eval_attrs a ON a.eval_id = COALESCE(e.reuses_eval_id, e.id) AND a.attr = $2 AND a.drv_path IS NOT NULL
LEFT JOIN build_jobs j ON j.drv_path = a.drv_path
LEFT JOIN LATERAL (
    SELECT output_path FROM derivation_outputs
    WHERE drv_path = a.drv_path ORDER BY output_name <> 'out', output_name LIMIT 1
) o ON true
WHERE p.name = $1 AND e.pr_number IS NULL AND e.branch = r.default_branch
  AND e.status IN ('succeeded', 'skipped') AND (j.id IS NULL OR j.status = 'succeeded')
ORDER BY e.id DESC LIMIT 1`
)

// The attribute history page.
const (
	// The default branch of project $1.
	sqlDefaultBranch = `
SELECT r.default_branch FROM projects p JOIN repositories r ON r.id = p.repo_id WHERE p.name = $1`

	// Attribute $3 in the last $4 evaluations (not cancelled, not a pull request's) of project
	// $1's branch $2, newest first, with its build: a skipped evaluation's is the one it
	// reuses.
	sqlAttrHistory = `
SELECT e.id, e.commit_sha, e.created_at, COALESCE(a.error, ''), j.id, COALESCE(j.status, ''),
       j.claimed_by, j.started_at, j.finished_at
FROM evaluations e
JOIN projects p ON p.id = e.project_id
JOIN eval_attrs a ON a.eval_id = COALESCE(e.reuses_eval_id, e.id) AND a.attr = $3
LEFT JOIN build_jobs j ON j.drv_path = a.drv_path
WHERE p.name = $1 AND e.branch = $2 AND e.pr_number IS NULL AND e.status <> 'cancelled'
ORDER BY e.id DESC LIMIT $4`
)

// Users' cache tokens (tokens.go).
const (
	// Every project with its repository, for the projects a user may read: id, name, private,
	// forge, full name, installation.
	sqlProjectRepos = `
SELECT p.id, p.name, r.is_private, r.forge, r.full_name, COALESCE(r.installation_id, 0)
FROM projects p JOIN repositories r ON r.id = p.repo_id
ORDER BY p.id`

	// A user's cache token: $1 hash, $2 note, $3 project ids, $4 days valid, $5 forge, $6 user
	// id, $7 login; no row when the user has $8 live tokens already. Refreshed now: its
	// projects are what the forge said at mint.
	sqlUserTokenInsert = `
INSERT INTO cache_tokens (token_hash, note, project_ids, expires_at, forge, user_id, login, refreshed_at)
SELECT $1, $2, $3, now() + make_interval(days => $4), $5, $6, $7, now()
WHERE (SELECT count(*) FROM cache_tokens
       WHERE forge = $5 AND user_id = $6 AND revoked_at IS NULL AND expires_at > now()) < $8
RETURNING id, expires_at`

	// Cache tokens, newest first, at most $3: user $2 of forge $1's, or with $1 = '' everyone's
	// (an admin's view, admin tokens included). Owner: "forge:login", "" for an admin token.
	sqlUserTokens = `
SELECT t.id, t.note, COALESCE(t.forge || ':' || t.login, ''), t.project_ids, t.expires_at, t.revoked_at,
       t.created_at, t.revoked_at IS NULL AND t.expires_at > now()
FROM cache_tokens t
WHERE $1 = '' OR (t.forge = $1 AND t.user_id = $2)
ORDER BY t.id DESC
LIMIT $3`

	// Revoke token $1 now, if it is live and user $3 of forge $2's (with $2 = '': anyone's, an
	// admin's revocation).
	sqlUserTokenRevoke = `
UPDATE cache_tokens SET revoked_at = now()
WHERE id = $1 AND revoked_at IS NULL AND ($2 = '' OR (forge = $2 AND user_id = $3))`

	// The live users' tokens, for the refresh: id, forge, user id, login.
	sqlLiveUserTokens = `
SELECT id, forge, user_id, login FROM cache_tokens
WHERE user_id IS NOT NULL AND revoked_at IS NULL AND expires_at > now()
ORDER BY forge, user_id, login, id`

	// Tokens $1 read projects $2 from now on (the forge's answer of this refresh).
	sqlUserTokenRefresh = `
UPDATE cache_tokens SET project_ids = $2, refreshed_at = now()
WHERE id = ANY($1::bigint[]) AND revoked_at IS NULL`

	// Where Nix clients substitute from: the live cache nodes' endpoints (silent for less than
	// $1 seconds), and the keys the cluster signs with.
	sqlCacheSources = `
SELECT
    ARRAY(SELECT endpoint FROM nodes
          WHERE 'cache' = ANY(capabilities) AND endpoint IS NOT NULL AND endpoint <> ''
            AND status NOT IN ('dead') AND last_seen > now() - make_interval(secs => $1)
          ORDER BY id),
    ARRAY(SELECT public_key FROM signing_keys ORDER BY first_seen, public_key)`
)

// The record of actions (audit.go).
const (
	// $1 action, $2 build job, $3 evaluation or $8 repository (the others NULL), $4 who, $5
	// token id and $6 name (NULL: no token), $7 the answer.
	sqlAuditInsert = `
INSERT INTO action_log (action, job_id, eval_id, actor, token_id, token_name, message, repo_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

	// The actions on build job $1, newest first, at most $2.
	sqlAuditJob = `
SELECT action, actor, token_id, token_name, message, at FROM action_log
WHERE job_id = $1 ORDER BY id DESC LIMIT $2`

	// The actions on evaluation $1, newest first, at most $2.
	sqlAuditEval = `
SELECT action, actor, token_id, token_name, message, at FROM action_log
WHERE eval_id = $1 ORDER BY id DESC LIMIT $2`
)
