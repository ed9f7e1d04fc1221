package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// UserID implements Forge: GET /users/{login}. Gitea answers 404 for a login nobody has.
func (g *Gitea) UserID(ctx context.Context, login string) (int64, error) {
	if err := ValidateLogin(login); err != nil {
		return 0, err
	}
	var u giteaUser
	if _, err := g.api.do(ctx, http.MethodGet, g.api.url("/users/"+url.PathEscape(login), nil), nil, &u); err != nil {
		return 0, fmt.Errorf("user %s: %w", login, err)
	}
	return checkUser(login, u.ID, u.Login)
}

// UserID implements Forge: GET /users/{login} as one of the App's installations (an App's own
// token cannot read users, and unauthenticated calls have a tiny rate limit).
func (g *GitHub) UserID(ctx context.Context, login string) (int64, error) {
	if err := validGitHubLogin(login); err != nil {
		return 0, err
	}
	inst, err := g.anyInstallation(ctx)
	if err != nil {
		return 0, fmt.Errorf("user %s: %w", login, err)
	}
	var u githubUser
	if _, err := g.installationDo(ctx, inst, http.MethodGet, g.endpoint(nil, "users", login), nil, &u); err != nil {
		return 0, fmt.Errorf("user %s: %w", login, err)
	}
	return checkUser(login, u.ID, u.Login)
}

// anyInstallation is an installation to make calls that concern no repository with: one learnt
// on the way, else the first active one GitHub lists.
func (g *GitHub) anyInstallation(ctx context.Context) (int64, error) {
	g.mu.Lock()
	for _, id := range g.installs {
		if id > 0 {
			g.mu.Unlock()
			return id, nil
		}
	}
	g.mu.Unlock()
	var insts []githubInstallation
	if _, err := g.appAPI().do(ctx, http.MethodGet, g.endpoint(url.Values{"per_page": {"100"}}, "app", "installations"), nil, &insts); err != nil {
		return 0, fmt.Errorf("list installations: %w", err)
	}
	for _, in := range insts {
		if in.SuspendedAt == nil && in.ID > 0 {
			return in.ID, nil
		}
	}
	return 0, errors.New("the App has no active installation to look users up with")
}

// checkUser refuses an answer that is not about login (logins compare without case on both
// forges) or has no usable id. Gitea answers for a renamed user's old login with the renamed
// account (a redirect it keeps until someone takes the login): nobody has that login, so it
// is ErrNotFound.
func checkUser(login string, id int64, got string) (int64, error) {
	if !strings.EqualFold(got, login) {
		return 0, fmt.Errorf("user %s: %w (the forge answered for %q, renamed)", login, ErrNotFound, got)
	}
	if id <= 0 {
		return 0, fmt.Errorf("user %s: id %d", login, id)
	}
	return id, nil
}
