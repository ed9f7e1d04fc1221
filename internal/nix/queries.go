package nix

// The SQL of the read-only reader of a Nix store's SQLite database (StoreDB). A list is one
// parameter, a JSON array that json_each unpacks, so no statement is assembled per call.
const (
	// The valid paths among $1 (JSON array of store paths).
	sqlStorePathInfos = `SELECT id, path, hash, narSize, deriver FROM ValidPaths WHERE path IN (SELECT value FROM json_each(?))`

	// The references of the valid paths with ids $1 (JSON array of ids), as (referrer id, path).
	sqlStoreReferences = `
SELECT Refs.referrer, ValidPaths.path FROM Refs JOIN ValidPaths ON ValidPaths.id = Refs.reference
WHERE Refs.referrer IN (SELECT value FROM json_each(?))`
)
