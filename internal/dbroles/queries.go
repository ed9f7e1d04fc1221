package dbroles

// SQL of GrantNode. Role names cannot be bind parameters in these statements, so the node id,
// checked against nodeIDPattern, is quoted with pgx.Identifier.
const (
	// Whether the role exists, and whether it is something other than a node's login role: a
	// privileged role, the one running this, one of the groups, or the owner of anything here
	// (the schema owner's role must never be turned into a node's).
	sqlRoleCheck = `
SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1),
       EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = $1 AND (
           r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls
           OR r.rolname = current_user OR r.rolname LIKE 'harmonia\_%'
           OR EXISTS (SELECT 1 FROM pg_class c WHERE c.relowner = r.oid)
           OR EXISTS (SELECT 1 FROM pg_namespace n WHERE n.nspowner = r.oid)
           OR EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = current_database() AND d.datdba = r.oid)))`
	// A builder's grant: $1 id, $2 systems, $3 features, $4 max_jobs.
	sqlGrantBuilds = `
INSERT INTO node_grants (id, systems, features, max_jobs) VALUES ($1, $2, $3, $4)
ON CONFLICT (id) DO UPDATE SET systems = EXCLUDED.systems, features = EXCLUDED.features, max_jobs = EXCLUDED.max_jobs`
	sqlRevokeBuilds = `DELETE FROM node_grants WHERE id = $1`

	// The groups a role is a direct member of, among ours.
	sqlRoleGroups = `
SELECT g.rolname FROM pg_auth_members m
JOIN pg_roles g ON g.oid = m.roleid JOIN pg_roles u ON u.oid = m.member
WHERE u.rolname = $1 AND g.rolname LIKE 'harmonia\_%'`
)
