package signer

// All SQL of the signer (its client's is in package signerclient).

const (
	// $1 job id, $2 node, $3 attempt: the claimed job's derivation, its output names and paths
	// ('' for a floating content-addressed one), its inputs (the selected outputs of its input
	// derivations and its input sources), the .drv the signer stored for it (NULL if none), and
	// the input derivations the database lists with the hashes the signer recorded for them
	// (NULL where none): what checkDerivation recomputes the outputs from, in the same round
	// trip. .drv objects are found by their key, the store path's hash part.
	sqlJobFacts = `
SELECT j.drv_path,
       ARRAY(SELECT o.output_name FROM derivation_outputs o
             WHERE o.drv_path = j.drv_path ORDER BY o.output_name),
       ARRAY(SELECT COALESCE(o.output_path, '') FROM derivation_outputs o
             WHERE o.drv_path = j.drv_path ORDER BY o.output_name),
       ARRAY(SELECT o.output_path FROM derivation_inputs i
             JOIN derivation_outputs o ON o.drv_path = i.input_drv AND o.output_name = ANY(i.outputs)
             WHERE i.referrer = j.drv_path AND o.output_path IS NOT NULL)
       || COALESCE(d.input_srcs, '{}'),
       x.drv,
       ARRAY(SELECT i.input_drv FROM derivation_inputs i WHERE i.referrer = j.drv_path ORDER BY i.input_drv),
       ARRAY(SELECT y.drv_hash FROM derivation_inputs i
             LEFT JOIN drv_objects y ON y.hash_part = substring(i.input_drv FROM 12 FOR 32) AND y.store_path = i.input_drv
             WHERE i.referrer = j.drv_path ORDER BY i.input_drv),
       j.trusted,
       ARRAY(SELECT o.output_path FROM derivation_outputs o
             WHERE o.drv_path = j.drv_path AND o.output_path IS NOT NULL
               AND EXISTS (SELECT 1 FROM derivation_outputs q WHERE q.output_path = o.output_path AND q.quarantined)
               AND NOT EXISTS (SELECT 1 FROM derivation_outputs q
                               WHERE q.output_path = o.output_path AND q.nar_hash IS NOT NULL AND NOT q.quarantined))
FROM build_jobs j JOIN derivations d ON d.drv_path = j.drv_path
LEFT JOIN drv_objects x ON x.hash_part = d.hash_part AND x.store_path = j.drv_path
WHERE j.id = $1 AND j.claimed_by = $2 AND j.attempt = $3 AND j.status IN ('building', 'uploading')`

	// $1 job id, $2 node, $3 attempt: the claimed job's system, whether the claiming node's row
	// declares that system and the job's features, and one input derivation whose job has not
	// succeeded ('' for none) with that job's status. Inputs without a job were never waited
	// for (the queue's readiness counts jobs only).
	sqlClaimFit = `
SELECT j.system,
       COALESCE((SELECT j.system = ANY(n.systems) AND j.required_features <@ n.features
                 FROM nodes n WHERE n.id = j.claimed_by), false),
       COALESCE(u.drv_path, ''), COALESCE(u.status, '')
FROM build_jobs j
LEFT JOIN LATERAL (SELECT dep.drv_path, dep.status FROM derivation_inputs di
                   JOIN build_jobs dep ON dep.drv_path = di.input_drv
                   WHERE di.referrer = j.drv_path AND dep.status <> 'succeeded'
                   ORDER BY dep.drv_path LIMIT 1) u ON true
WHERE j.id = $1 AND j.claimed_by = $2 AND j.attempt = $3 AND j.status IN ('building', 'uploading')`

	// The node holds the evaluation, or a unit of it that it walks to help its claimant. $1
	// evaluation, $2 node, $3 attempt.
	sqlCheckEvalClaim = `
SELECT EXISTS (SELECT 1 FROM evaluations e
               WHERE e.id = $1 AND e.attempt = $3 AND e.status = 'running'
                 AND (e.claimed_by = $2
                      OR EXISTS (SELECT 1 FROM eval_units u
                                 WHERE u.eval_id = e.id AND u.eval_attempt = e.attempt
                                   AND u.claimed_by = $2 AND u.status = 'running')))`

	// First writer wins: the NAR hash the cache serves for an output is its canonical one. Only
	// the rows of the derivation built ($4) are written: another derivation listing the same
	// path is no more built by this than the signer checked its outputs (readers take a path
	// as built from any derivation's row; see docs/decisions.md). $5: quarantined (an
	// untrusted job built it).
	sqlRecordNarHashes = `
UPDATE derivation_outputs o SET nar_hash = v.nar_hash, nar_size = v.nar_size, quarantined = $5
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v(output_path, nar_hash, nar_size)
WHERE o.drv_path = $4 AND o.output_path = v.output_path AND o.nar_hash IS NULL`

	// A trusted job built the output paths $1, with what the cache now serves ($2 NAR hash, $3
	// size): every quarantined row of them is released, taking that hash as canonical, and a
	// quarantined build that gave another hash is kept as non-reproducible.
	sqlReleaseQuarantine = `
UPDATE derivation_outputs o SET quarantined = false, nar_hash = v.nar_hash, nar_size = v.nar_size,
    nonrepro_nar_hash = CASE WHEN o.nar_hash <> v.nar_hash THEN o.nar_hash ELSE o.nonrepro_nar_hash END
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v(output_path, nar_hash, nar_size)
WHERE o.output_path = v.output_path AND o.quarantined`

	sqlRecordKey = `
INSERT INTO signing_keys (public_key) VALUES ($1)
ON CONFLICT (public_key) DO UPDATE SET last_seen = now()`

	sqlTrustedKeys = `SELECT public_key FROM signing_keys ORDER BY first_seen, public_key`
)
