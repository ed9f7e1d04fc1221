// Package access is the one visibility rule: who may read a project's data. Every HTTP route
// that carries a project's data (pages, event streams, live logs, the JSON API) asks it, through
// a Rule, and is registered through Routes, which records for each route whether it carries
// project data and wraps those that do with the check. It knows nothing of forges: the forge's
// answer for a private repository is a ReadFunc the frontend gives it, so the object store may
// use it too.
package access

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// CallerKind is how a caller proved who they are.
type CallerKind int

const (
	// Anonymous is a caller with no credentials (or invalid ones).
	Anonymous CallerKind = iota
	// User is a logged-in user: a session bound to a forge account.
	User
	// AdminToken is a script with the admin token (Authorization: Bearer).
	AdminToken
	// Node is a cluster node with its node token.
	Node
	// MachineToken is a script with a machine API token that reads a set of projects (a
	// machine token minted admin is an AdminToken).
	MachineToken
)

// Caller is who asks.
type Caller struct {
	Kind CallerKind
	// Admin is true for the admin token and for users among [auth] admins.
	Admin bool
	// Forge, Login and UserID are a User's forge account: UserID is who they are, Login what
	// the forge's permission API is asked with.
	Forge, Login string
	UserID       int64
	// NodeID is a Node's id.
	NodeID string
	// TokenID and TokenName are the API token the caller authenticated with (0: none): a
	// User's personal token, a machine token.
	TokenID   int64
	TokenName string
	// Repos are what a MachineToken reads: "forge/full name" of each repository.
	Repos []string
}

// String names the caller for logs.
func (c Caller) String() string {
	switch c.Kind {
	case User:
		return c.Forge + ":" + c.Login
	case AdminToken:
		return "the admin token"
	case Node:
		return "node " + c.NodeID
	case MachineToken:
		return fmt.Sprintf("machine token %d", c.TokenID)
	default:
		return "anonymous"
	}
}

// Repo is a project's repository, as the rule needs it.
type Repo struct {
	Private         bool
	Forge, FullName string
	// Installation is the GitHub App installation that reaches the repository (0: none).
	Installation int64
}

// errNoDB is the error of a rule without a database (Routes before Use).
var errNoDB = errors.New("visibility rule without a database")

// forgeGit is the forge of projects added by URL: no forge to ask, so a private one is the
// admins' alone.
const forgeGit = "git"

// ReadFunc asks the repository's forge whether the user c may read repo (cached by the
// frontend, about 5 minutes). It is only called for a private repository of c's own forge.
type ReadFunc func(ctx context.Context, c Caller, repo Repo) (bool, error)

// Rule decides who may read what.
type Rule struct {
	// DB resolves projects, evaluations and jobs to their repositories.
	DB db.DBTX
	// Read asks the forge about a user and a private repository; nil means no forge is
	// reachable here (a node without the frontend role): private repositories are then the
	// admins' and nodes' alone.
	Read ReadFunc
}

// MayRead is the rule: a public repository's data is everyone's; a private one's belongs to
// admins, nodes and the users its forge gives read access to (never for a project added by
// URL: no forge to ask). A forge that does not answer is an error, never a guess.
func (r *Rule) MayRead(ctx context.Context, c Caller, repo Repo) (bool, error) {
	if !repo.Private || c.Admin || c.Kind == Node {
		return true, nil
	}
	if c.Kind == MachineToken {
		return slices.Contains(c.Repos, repo.Forge+"/"+repo.FullName), nil
	}
	if c.Kind != User || c.Forge != repo.Forge || repo.Forge == forgeGit || r == nil || r.Read == nil {
		return false, nil
	}
	return r.Read(ctx, c, repo)
}

// MayReadAny reports whether c may read one of repos.
func (r *Rule) MayReadAny(ctx context.Context, c Caller, repos []Repo) (bool, error) {
	var firstErr error
	for _, repo := range repos {
		ok, err := r.MayRead(ctx, c, repo)
		if ok {
			return true, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return false, firstErr
}

// MayReadProject reports whether c may read project name; false for no such project.
func (r *Rule) MayReadProject(ctx context.Context, c Caller, name string) (bool, error) {
	return r.mayReadRow(ctx, c, sqlProjectRepo, name)
}

// MayReadProjectID is MayReadProject by the project's id.
func (r *Rule) MayReadProjectID(ctx context.Context, c Caller, id int64) (bool, error) {
	return r.mayReadRow(ctx, c, sqlProjectIDRepo, id)
}

// MayReadEval reports whether c may read evaluation id (its project's); false for no such
// evaluation.
func (r *Rule) MayReadEval(ctx context.Context, c Caller, id int64) (bool, error) {
	return r.mayReadRow(ctx, c, sqlEvalRepo, id)
}

// MayReadJob reports whether c may read build job id: its name, status and log. A job belongs
// to the project it was queued for and to every evaluation that has its derivation as an
// attribute; whoever may read one of them may read it (a derivation a public project builds is
// public, whoever else builds it). A job of neither is no project's: everyone's. False for no
// such job.
func (r *Rule) MayReadJob(ctx context.Context, c Caller, id int64) (bool, error) {
	repos, err := r.JobRepos(ctx, id)
	if err != nil || repos == nil {
		return false, err
	}
	if len(repos) == 0 {
		return true, nil
	}
	return r.MayReadAny(ctx, c, repos)
}

// JobRepos are the repositories build job id belongs to (see MayReadJob): nil for no such
// job, empty for a job of no project.
func (r *Rule) JobRepos(ctx context.Context, id int64) ([]Repo, error) {
	if r.DB == nil {
		return nil, errNoDB
	}
	rows, err := r.DB.Query(ctx, sqlJobRepos, id)
	if err != nil {
		return nil, fmt.Errorf("repositories of build %d: %w", id, err)
	}
	var exists bool
	repos := []Repo{}
	var repo Repo
	var forge *string
	_, err = pgx.ForEachRow(rows, []any{&forge, &repo.FullName, &repo.Installation, &repo.Private}, func() error {
		exists = true
		if forge != nil {
			repo.Forge = *forge
			repos = append(repos, repo)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("repositories of build %d: %w", id, err)
	}
	if !exists {
		return nil, nil
	}
	return repos, nil
}

func (r *Rule) mayReadRow(ctx context.Context, c Caller, sql string, arg any) (bool, error) {
	if r.DB == nil {
		return false, errNoDB
	}
	var repo Repo
	err := r.DB.QueryRow(ctx, sql, arg).Scan(&repo.Private, &repo.Forge, &repo.FullName, &repo.Installation)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("visibility of %v: %w", arg, err)
	}
	return r.MayRead(ctx, c, repo)
}
