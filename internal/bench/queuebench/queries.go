package queuebench

// The benchmark's SQL, named for what it reads or writes.
const (
	// sqlAnalyze gathers fresh planner statistics for the filled tables.
	sqlAnalyze = `ANALYZE`

	// sqlAnyOpen reads whether any job is unfinished.
	sqlAnyOpen = `SELECT EXISTS (SELECT 1 FROM build_jobs WHERE status IN ('pending', 'building', 'uploading'))`

	// sqlBackendPID reads this connection's server process.
	sqlBackendPID = `SELECT pg_backend_pid()`

	// sqlBlockedCount counts the jobs waiting on inputs.
	sqlBlockedCount = `SELECT count(*) FROM build_jobs WHERE blocked_inputs > 0`

	// sqlJobCount counts every build job.
	sqlJobCount = `SELECT count(*) FROM build_jobs`

	// sqlOpenCount counts the unfinished jobs.
	sqlOpenCount = `SELECT count(*) FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`

	// sqlWakeGaps reads seconds from each chain link's finish to its successor's claim, chain $1 in order.
	sqlWakeGaps = `
SELECT EXTRACT(EPOCH FROM next.claimed_at - cur.finished_at)::float8
FROM unnest($1::text[]) WITH ORDINALITY AS c(drv, i)
JOIN unnest($1::text[]) WITH ORDINALITY AS n(drv, i) ON n.i = c.i + 1
JOIN build_jobs cur ON cur.drv_path = c.drv
JOIN build_jobs next ON next.drv_path = n.drv`
)
