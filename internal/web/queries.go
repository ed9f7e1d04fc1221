package web

// sqlBuildLogState reads a build and its live tail; $1 is the job id. One statement, so status
// and tail come from one snapshot: the builder records the final status before it deletes the
// tail, so a finished status is never seen with a tail older than the last one written.
const sqlBuildLogState = `
SELECT j.status, j.log_url, j.error_message, t.log_tail, t.log_seq
FROM build_jobs j
LEFT JOIN build_log_tails t ON t.build_job_id = j.id
WHERE j.id = $1`
