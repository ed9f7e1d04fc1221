package db

// The migration runner's own SQL.
const (
	sqlMigrationsTableExists = `SELECT to_regclass('schema_migrations') IS NOT NULL`
	sqlMigrationsTableCreate = `CREATE TABLE schema_migrations (
		version    INT PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_by TEXT NOT NULL,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`
	// Whether the current role may change the schema: it is (a member of) the owner of
	// schema_migrations, which the role that created the schema owns.
	sqlMigrationsOwned = `SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = 'schema_migrations'::regclass`

	// The migration lock, held on one session for the whole run. $1 class, $2 object.
	sqlMigrateLock   = `SELECT pg_advisory_lock($1, $2)`
	sqlMigrateUnlock = `SELECT pg_advisory_unlock($1, $2)`

	sqlMigrationsApplied = `SELECT version FROM schema_migrations`

	// $1 version, $2 name, $3 the node that applied it.
	sqlMigrationRecord = `INSERT INTO schema_migrations (version, name, applied_by) VALUES ($1, $2, $3)`
)
