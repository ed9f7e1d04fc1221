package githubtest

import (
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Git over HTTP: github.com serves a repository at https://github.com/{owner}/{name}.git;
// the stand-in serves it at CloneURL(fullName), with git's own smart HTTP server
// (git http-backend) behind GitHub's rules: anyone may fetch a public repository; a private
// one needs basic authentication whose password is an installation token that covers the
// repository with contents: read (the user is not checked: GitHub documents
// x-access-token). Nothing can be pushed.

// gitPrefix is where repositories are served.
const gitPrefix = "/git/"

// CloneURL is the URL the stand-in serves repository fullName's git at, once ServeGit has
// named its directory; give it as Repo.CloneURL.
func (s *Server) CloneURL(fullName string) string {
	return s.URL + gitPrefix + fullName + ".git"
}

// ServeGit serves the git repository at dir (a bare repository or a work tree's .git) as
// repository fullName's, which AddInstallation must add.
func (s *Server) ServeGit(fullName, dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.repo(fullName).gitDir = dir
}

// GitFetches is how many fetches (upload-pack requests) of fullName were served, and how many
// requests were refused for want of a good credential.
func (s *Server) GitFetches(fullName string) (served, refused int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.repo(fullName)
	return r.gitServed, r.gitRefused
}

func (s *Server) gitRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET "+gitPrefix+"{owner}/{repo}/info/refs", s.serveGit)
	mux.HandleFunc("POST "+gitPrefix+"{owner}/{repo}/git-upload-pack", s.serveGit)
}

func (s *Server) serveGit(w http.ResponseWriter, r *http.Request) {
	name, ok := strings.CutSuffix(r.PathValue("repo"), ".git")
	if !ok || (r.Method == http.MethodGet && r.URL.Query().Get("service") != "git-upload-pack") {
		http.Error(w, "Repository not found.", http.StatusNotFound)
		return
	}
	k := strings.ToLower(r.PathValue("owner") + "/" + name)
	s.mu.Lock()
	repo := s.repos[k]
	allowed := repo != nil && repo.gitDir != "" && (!repo.Private || s.mayRead(r, repo, k))
	switch {
	case repo != nil && !allowed:
		repo.gitRefused++
	case allowed && r.Method == http.MethodPost:
		repo.gitServed++
	}
	var dir string
	if repo != nil {
		dir = repo.gitDir
	}
	s.mu.Unlock()
	if !allowed {
		// GitHub asks for credentials rather than admit that a private repository exists.
		w.Header().Set("WWW-Authenticate", `Basic realm="GitHub"`)
		http.Error(w, "Invalid username or token. Password authentication is not supported for Git operations.", http.StatusUnauthorized)
		return
	}
	git, err := exec.LookPath("git")
	if err != nil {
		http.Error(w, "no git", http.StatusInternalServerError)
		return
	}
	// http-backend finds the repository under GIT_PROJECT_ROOT by PATH_INFO: serve dir as
	// the root and "/" as the path.
	h := &cgi.Handler{
		Path: git, Args: []string{"http-backend"}, Root: r.URL.Path[:len(r.URL.Path)-len(gitSuffix(r.URL.Path))],
		Env: []string{"GIT_PROJECT_ROOT=" + filepath.Clean(dir), "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1",
			"HOME=" + os.TempDir()},
	}
	h.ServeHTTP(w, r)
}

// gitSuffix is the part of a git URL's path after the repository: /info/refs or
// /git-upload-pack.
func gitSuffix(path string) string {
	for _, suf := range []string{"/info/refs", "/git-upload-pack"} {
		if strings.HasSuffix(path, suf) {
			return suf
		}
	}
	return ""
}

// mayRead reports whether the request's basic-auth password is a live installation token that
// covers repository k and may read its contents. s.mu is held.
func (s *Server) mayRead(r *http.Request, repo *repoState, k string) bool {
	_, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	t := s.tokens[pass]
	return t.live() && t.installation == repo.installation && t.covers(k) &&
		t.permits("contents", "read")
}

// IssuedTokens are every installation token the stand-in has issued, for tests that check
// none of them leaked.
func (s *Server) IssuedTokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.tokens))
	for t := range s.tokens {
		out = append(out, t)
	}
	return out
}
