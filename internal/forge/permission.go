package forge

import "context"

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

// PermissionSource answers Forge.Permission; the web UI passes a cache of the forge's answers.
type PermissionSource interface {
	Permission(ctx context.Context, repo Repo, login string) (Permission, error)
}

// WriteAccess is the one check of whether login is trusted on repo: whether the forge gives
// them write access (GitHub: admin, maintain or write; Gitea: owner, admin or write). Being
// a collaborator is not enough: GitHub lists read and triage users, and organisation
// members through the base permission, as collaborators. Webhooks ask it of pull request
// authors, pushers and approvers, the web UI of users acting on a repository's builds.
func WriteAccess(ctx context.Context, src PermissionSource, repo Repo, login string) (bool, error) {
	p, err := src.Permission(ctx, repo, login)
	if err != nil {
		return false, err
	}
	return p.CanWrite(), nil
}
