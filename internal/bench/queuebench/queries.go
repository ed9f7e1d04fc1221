package queuebench

// The benchmark's SQL, named for what it reads or writes.
const (
	// queryAnalyze gathers fresh planner statistics for the filled tables.
	queryAnalyze = `ANALYZE`

	// queryAnyOpen reads whether any job is unfinished.
	queryAnyOpen = `SELECT EXISTS (SELECT 1 FROM build_jobs WHERE status IN ('pending', 'building', 'uploading'))`

	// queryBackendPID reads this connection's server process.
	queryBackendPID = `SELECT pg_backend_pid()`

	// queryBlockedCount counts the jobs waiting on inputs.
	queryBlockedCount = `SELECT count(*) FROM build_jobs WHERE blocked_inputs > 0`

	// queryJobCount counts every build job.
	queryJobCount = `SELECT count(*) FROM build_jobs`

	// queryOpenCount counts the unfinished jobs.
	queryOpenCount = `SELECT count(*) FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')`

	// queryWakeGaps reads seconds from each chain link's finish to its successor's claim, chain $1 in order.
	queryWakeGaps = `
SELECT EXTRACT(EPOCH FROM next.claimed_at - cur.finished_at)::float8
FROM unnest($1::text[]) WITH ORDINALITY AS c(drv, i)
JOIN unnest($1::text[]) WITH ORDINALITY AS n(drv, i) ON n.i = c.i + 1
JOIN build_jobs cur ON cur.drv_path = c.drv
JOIN build_jobs next ON next.drv_path = n.drv`
)
