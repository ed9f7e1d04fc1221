package signerclient

// All SQL of the signer client.

const (
	// The live signers a client may call; $1 the dead threshold in seconds.
	sqlSigners = `
SELECT endpoint FROM nodes
WHERE 'signer' = ANY(capabilities) AND last_seen > now() - make_interval(secs => $1) AND status <> 'dead'
ORDER BY id`
)
