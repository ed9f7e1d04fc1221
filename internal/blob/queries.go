package blob

// All SQL of the blob package: the .drv objects (Derivations).

const (
	// $1 hash parts, $2 store paths, $3 NAR hashes (nix32), $4 NAR sizes, $5 narinfos, $6 .drv
	// contents, $7 derivation hashes. Returns the hash parts inserted; a stored one is kept (but
	// given its hash, had it none).
	sqlPutDrvs = `
WITH v AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::bytea[], $7::bytea[])
        AS v(hash_part, store_path, nar_hash, nar_size, narinfo, drv, drv_hash)
)
INSERT INTO drv_objects AS o (hash_part, store_path, nar_hash, nar_size, narinfo, drv, drv_hash)
SELECT * FROM v
ON CONFLICT (hash_part) DO UPDATE SET drv_hash = EXCLUDED.drv_hash WHERE o.drv_hash IS NULL
RETURNING hash_part, xmax = 0`

	// The .drv texts and derivation hashes of store paths ($1), found by their key (the hash
	// part): store_path has no index.
	sqlDrvHashes = `
SELECT store_path, drv, drv_hash FROM drv_objects
WHERE hash_part = ANY(ARRAY(SELECT substring(p FROM 12 FOR 32) FROM unnest($1::text[]) AS p))
  AND store_path = ANY($1)`

	sqlDrvNarInfo = `SELECT narinfo, created_at FROM drv_objects WHERE hash_part = $1`

	sqlDrvNAR = `SELECT drv, created_at FROM drv_objects WHERE nar_hash = $1 LIMIT 1`

	sqlDrvsHave = `SELECT hash_part FROM drv_objects WHERE hash_part = ANY($1)`

	sqlListDrvs = `
SELECT hash_part, nar_hash, octet_length(narinfo), nar_size, created_at FROM drv_objects`

	sqlDeleteDrvs = `DELETE FROM drv_objects WHERE hash_part = ANY($1) RETURNING hash_part`
)
