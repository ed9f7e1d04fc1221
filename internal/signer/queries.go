package signer

// All SQL of the signer and its client.

const (
	// The live signers a client may call.
	sqlSigners = `
SELECT endpoint FROM nodes
WHERE 'signer' = ANY(capabilities) AND last_seen > now() - interval '2 minutes' AND status <> 'dead'
ORDER BY id`

	// $1 job id, $2 node, $3 attempt.
	sqlCheckClaim = `
SELECT EXISTS (SELECT 1 FROM build_jobs
               WHERE id = $1 AND claimed_by = $2 AND attempt = $3 AND status IN ('building', 'uploading'))`

	// Runs in the transaction that marked the job succeeded.
	sqlSetLogURL = `UPDATE build_jobs SET log_url = $2 WHERE id = $1 AND status = 'succeeded'`

	// First writer wins: the NAR hash the cache serves for an output is its canonical one.
	sqlRecordNarHashes = `
UPDATE derivation_outputs o SET nar_hash = v.nar_hash, nar_size = v.nar_size
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v(output_path, nar_hash, nar_size)
WHERE o.output_path = v.output_path AND o.nar_hash IS NULL`

	sqlRecordKey = `
INSERT INTO signing_keys (public_key) VALUES ($1)
ON CONFLICT (public_key) DO UPDATE SET last_seen = now()`

	sqlTrustedKeys = `SELECT public_key FROM signing_keys ORDER BY first_seen, public_key`
)
