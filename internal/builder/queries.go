package builder

// All SQL of the builder.

const (
	// $1 job id, $2 tail. The notify_build_log trigger sends the job id on channel build_log.
	// An unchanged tail is not written again (nor announced): a write whose answer was lost
	// to a stop is repeated by Stop's final write.
	sqlUpsertTail = `
INSERT INTO build_log_tails (build_job_id, log_tail, log_seq) VALUES ($1, $2, 1)
ON CONFLICT (build_job_id) DO UPDATE
SET log_tail = EXCLUDED.log_tail, log_seq = build_log_tails.log_seq + 1
WHERE build_log_tails.log_tail IS DISTINCT FROM EXCLUDED.log_tail`

	// A finished job's tail: the result is recorded, so watchers may stop watching. A job that
	// went back to the queue (or to another builder) keeps it.
	sqlDeleteFinishedTail = `
DELETE FROM build_log_tails t USING build_jobs j
WHERE t.build_job_id = $1 AND j.id = $1 AND j.status IN ('succeeded', 'failed', 'cancelled', 'dep-failed')`

	// The running jobs ($1 ids, $2 attempts) whose claim by node $3 no longer holds.
	sqlLostClaims = `
SELECT t.id, t.attempt FROM unnest($1::bigint[], $2::int[]) AS t(id, attempt)
WHERE NOT EXISTS (
    SELECT 1 FROM build_jobs j
    WHERE j.id = t.id AND j.claimed_by = $3 AND j.attempt = t.attempt AND j.status IN ('building', 'uploading'))`

	// Where inputs come from: the live cache nodes (silent for less than $1 seconds), and the keys
	// their narinfos are signed with.
	sqlSources = `
SELECT
    ARRAY(SELECT endpoint FROM nodes
          WHERE 'cache' = ANY(capabilities) AND endpoint IS NOT NULL AND endpoint <> ''
            AND status NOT IN ('dead') AND last_seen > now() - make_interval(secs => $1)
          ORDER BY id),
    ARRAY(SELECT public_key FROM signing_keys ORDER BY first_seen, public_key)`

	// The outputs of derivation $1's input derivations, with the canonical NAR hash of each
	// (what the cache serves for the path, whichever derivation published it first), and each
	// input's derivation hash as the signer recorded it when it checked that .drv (NULL if it
	// recorded none). Then, as rows of $1 itself (never its own input), its outputs that a
	// trusted job must build again: quarantined ones (only pull requests built them), whatever
	// the store holds of them.
	sqlJobInputs = `
SELECT o.drv_path, o.output_name, o.output_path,
       COALESCE(o.nar_hash, (SELECT c.nar_hash FROM derivation_outputs c
                             WHERE c.output_path = o.output_path AND c.nar_hash IS NOT NULL LIMIT 1), ''),
       d.drv_hash
FROM derivation_inputs i JOIN derivation_outputs o ON o.drv_path = i.input_drv
LEFT JOIN drv_objects d ON d.hash_part = substring(i.input_drv FROM 12 FOR 32) AND d.store_path = i.input_drv
WHERE i.referrer = $1 AND o.output_path IS NOT NULL
UNION ALL
SELECT o.drv_path, o.output_name, o.output_path, '', NULL::bytea
FROM derivation_outputs o JOIN build_jobs j ON j.drv_path = o.drv_path
WHERE o.drv_path = $1 AND j.trusted AND o.quarantined
  AND NOT EXISTS (SELECT 1 FROM derivation_outputs c
                  WHERE c.output_path = o.output_path AND c.nar_hash IS NOT NULL AND NOT c.quarantined)`
)
