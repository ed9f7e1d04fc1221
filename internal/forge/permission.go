package forge

// Permission is a user's access to a repository, in the forge's own words (Gitea's "owner"
// counts as admin, GitHub's "maintain" as write and "triage" as read).
type Permission string

// Permissions, weakest first.
const (
	PermissionNone  Permission = "none"
	PermissionRead  Permission = "read"
	PermissionWrite Permission = "write"
	PermissionAdmin Permission = "admin"
)

// parsePermission maps a forge's permission word to a Permission; unknown words are none.
func parsePermission(s string) Permission {
	switch s {
	case "owner", "admin":
		return PermissionAdmin
	case "write", "maintain", "push":
		return PermissionWrite
	case "read", "triage", "pull":
		return PermissionRead
	}
	return PermissionNone
}

// CanRead reports whether p allows seeing the repository.
func (p Permission) CanRead() bool { return p == PermissionRead || p.CanWrite() }

// CanWrite reports whether p allows pushing (and so rebuilding its branch builds).
func (p Permission) CanWrite() bool { return p == PermissionWrite || p == PermissionAdmin }
