// Package giteatest gives tests a real forge: a private Gitea server, with an administrator and
// an API token, and helpers that drive it the way people would (users, repositories, pushes,
// forks, pull requests, comments) and read back what harmonia-ci posted to it (commit statuses,
// webhooks).
//
// Start runs a server of its own; most packages share one per test binary instead:
//
//	func TestMain(m *testing.M) { os.Exit(giteatest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		srv := giteatest.Shared(t)
//		...
//	}
//
// The Gitea binary is $(go env GOBIN)/gitea, $(go env GOPATH)/bin/gitea or gitea on PATH, with
// its templates, options and public assets in gitea-static next to it; `scripts/deps.sh test`
// builds both. Gitea refuses to run as root, so a test running as root runs it as the
// unprivileged user HARMONIA_GITEA_USER (default harmonia-gitea, which deps.sh creates), in a
// directory that user owns.
package giteatest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/harmonia-ci/harmonia-ci/internal/logtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// DefaultUser is the unprivileged user Gitea runs as when the tests run as root; the
// HARMONIA_GITEA_USER environment variable names another.
const DefaultUser = "harmonia-gitea"

// StaticDirName is the directory, next to the Gitea binary, holding the templates/, options/
// and public/ directories of the same Gitea version.
const StaticDirName = "gitea-static"

// AdminLogin is the login of the administrator Start creates.
const AdminLogin = "admin"

// startTimeout bounds how long Start waits for the API to answer.
const startTimeout = 60 * time.Second

// Server is a running private Gitea.
type Server struct {
	// URL is the server's root, http://127.0.0.1:PORT, without a trailing slash.
	URL string
	// Admin is the site administrator; Admin.Token has every scope.
	Admin User
	// AdminToken is Admin.Token.
	AdminToken string
	// Dir is the server's work directory (configuration, database, repositories, log).
	Dir string
	// SSHPort is the port of Gitea's built-in SSH server on 127.0.0.1 (repositories' ssh_url
	// name it): deploy keys fetch through it.
	SSHPort int

	bin, static string
	env         []string
	cred        *syscall.Credential // nil: Gitea runs as this process's user
	client      *http.Client

	mu     sync.Mutex // guards cmd and exited against concurrent Stop calls
	cmd    *exec.Cmd
	exited chan struct{}
}

// User is a Gitea account.
type User struct {
	// ID is Gitea's numeric user id; it stays when the user is renamed.
	ID       int64
	Login    string
	Password string
	// Token is a personal access token with every scope.
	Token string
}

// Repo is a repository on the server.
type Repo struct {
	Owner string
	Name  string
	// CloneURL is the HTTP clone URL, without credentials.
	CloneURL string
	HTMLURL  string
	Private  bool
	// DefaultBranch is "main" for the repositories CreateRepo makes.
	DefaultBranch string
}

// FullName is owner/name.
func (r Repo) FullName() string { return r.Owner + "/" + r.Name }

// Status is one commit status as Gitea lists it.
type Status struct {
	ID          int64  `json:"id"`
	Context     string `json:"context"`
	State       string `json:"status"`
	Description string `json:"description"`
	TargetURL   string `json:"target_url"`
}

// Hook is a repository webhook.
type Hook struct {
	ID     int64    `json:"id"`
	Type   string   `json:"type"`
	URL    string   `json:"-"` // config.url
	Events []string `json:"events"`
	Active bool     `json:"active"`
	// Config is the hook's configuration as Gitea returns it (url, content_type; never the secret).
	Config map[string]string `json:"config"`
}

// APIError is a response from Gitea's API with an unexpected status.
type APIError struct {
	Method, Path string
	StatusCode   int
	Body         string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d %s: %s", e.Method, e.Path, e.StatusCode, http.StatusText(e.StatusCode), strings.TrimSpace(e.Body))
}

// IsNotFound reports whether err is an API answer of 404 Not Found.
func IsNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound
}

// Binary returns the path of the Gitea binary, or an error naming how to install it.
func Binary() (string, error) { return proctest.Installed("gitea") }

// Need skips t when there is no Gitea binary, or fails it when the CI environment variable is
// "true": CI must run the forge tests.
func Need(t testing.TB) {
	t.Helper()
	if _, err := Binary(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("giteatest: %v", err)
		}
		t.Skipf("giteatest: %v", err)
	}
}

// The shared server of the test binary, started on first use of Shared.
var (
	sharedMu     sync.Mutex
	sharedOnce   sync.Once
	sharedSrv    *Server
	sharedErr    error
	sharedClosed bool
)

// Shared returns the test binary's shared server, starting it on first use; it calls Need
// first. Tests sharing it should name their users and repositories uniquely (UniqueName).
func Shared(t testing.TB) *Server {
	t.Helper()
	Need(t)
	sharedOnce.Do(func() {
		sharedMu.Lock()
		defer sharedMu.Unlock()
		if sharedClosed {
			sharedErr = errors.New("Cleanup already ran")
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*startTimeout)
		defer cancel()
		sharedSrv, sharedErr = Start(ctx)
	})
	if sharedErr != nil {
		t.Fatalf("giteatest: %v", sharedErr)
	}
	return sharedSrv
}

// Cleanup stops the shared server, if one was started. Main calls it; a TestMain that runs
// through dbtest.Main passes it there instead.
func Cleanup() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	sharedClosed = true
	if sharedSrv != nil {
		sharedSrv.Stop()
	}
}

// Main runs the package's tests and stops the shared server afterwards, returning the exit
// code for os.Exit.
func Main(m *testing.M) int {
	code := m.Run()
	Cleanup()
	return code
}

var nameSeq struct {
	sync.Mutex
	n int
}

// UniqueName returns prefix followed by a number no other call in this test binary returned,
// for users and repositories on a shared server.
func UniqueName(prefix string) string {
	nameSeq.Lock()
	defer nameSeq.Unlock()
	nameSeq.n++
	return prefix + strconv.Itoa(nameSeq.n)
}

// Start starts a private Gitea in a fresh directory: listening on 127.0.0.1 on a free port,
// with a SQLite database, webhooks allowed to loopback addresses, its built-in SSH server on
// another free port (for deploy keys), no mail or LFS, and an administrator with an API token. It returns once the API answers.
func Start(ctx context.Context) (*Server, error) {
	s, err := start(ctx)
	if err != nil {
		return nil, fmt.Errorf("start gitea: %w", err)
	}
	return s, nil
}

func start(ctx context.Context) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	static := filepath.Join(filepath.Dir(bin), StaticDirName)
	if _, err := os.Stat(filepath.Join(static, "options")); err != nil {
		return nil, fmt.Errorf("no %s next to %s (its templates, options and public assets); install them with `scripts/deps.sh test`", StaticDirName, bin)
	}
	cred, runUser, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "hci-gitea-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, bin: bin, static: static, cred: cred, client: &http.Client{Timeout: 30 * time.Second}}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	if cred != nil {
		// The user may not reach the binary or its assets (under /root, say): give it links to
		// them in its own directory. Gitea also writes its own path into the git hooks it installs.
		if err := linkOrCopy(bin, filepath.Join(dir, "bin", "gitea")); err != nil {
			return nil, err
		}
		s.bin = filepath.Join(dir, "bin", "gitea")
		if err := linkTree(static, filepath.Join(dir, "static")); err != nil {
			return nil, err
		}
		s.static = filepath.Join(dir, "static")
	}
	for _, d := range []string{"custom/conf", "data", "repos", "log", "home"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	s.env = append(os.Environ(), "GITEA_WORK_DIR="+dir, "GITEA_CUSTOM="+filepath.Join(dir, "custom"),
		"HOME="+filepath.Join(dir, "home"), "USER="+runUser, "GIT_CONFIG_NOSYSTEM=1")

	// A port taken between freePort and Gitea's bind makes Gitea exit; retry a few times.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.run(ctx, runUser); lastErr == nil || ctx.Err() != nil {
			break
		}
	}
	if lastErr != nil {
		return nil, lastErr
	}
	ok = true
	return s, nil
}

// run configures Gitea on a free port, migrates its database, starts it, creates the
// administrator and waits for the API.
func (s *Server) run(ctx context.Context, runUser string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.URL = "http://127.0.0.1:" + strconv.Itoa(port)
	if s.SSHPort, err = freePort(); err != nil {
		return err
	}
	if err := os.WriteFile(s.configPath(), []byte(s.config(port, runUser)), 0o600); err != nil {
		return err
	}
	if err := writeHostKey(filepath.Join(s.Dir, "data", "ssh", "gitea.ed25519")); err != nil {
		return err
	}
	if s.cred != nil {
		if err := chownTree(s.Dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return err
		}
	}
	if out, err := s.gitea(ctx, "migrate"); err != nil {
		return fmt.Errorf("gitea migrate: %w\n%s%s", err, out, s.logTail())
	}

	s.mu.Lock()
	c := exec.Command(s.bin, "web", "--config", s.configPath())
	c.Dir, c.Env = s.Dir, s.env
	logs := &logtest.Buffer{Limit: 1 << 20}
	c.Stdout, c.Stderr = logs, logs
	// Its own process group, so Stop kills Gitea and the git processes it runs.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	if err := c.Start(); err != nil {
		s.mu.Unlock()
		return err
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	s.cmd, s.exited = c, done
	s.mu.Unlock()

	// The administrator, while the server starts (both only need the migrated database).
	pass := randomString(12)
	out, err := s.gitea(ctx, "admin", "user", "create", "--username", AdminLogin, "--password", pass,
		"--email", AdminLogin+"@example.invalid", "--admin", "--must-change-password=false",
		"--access-token", "--access-token-name", "giteatest", "--access-token-scopes", "all")
	if err != nil {
		s.kill()
		return fmt.Errorf("gitea admin user create: %w\n%s", err, out)
	}
	const marker = "Access token was successfully created... "
	i := strings.LastIndex(out, marker)
	if i < 0 {
		s.kill()
		return fmt.Errorf("gitea admin user create printed no token:\n%s", out)
	}
	token := strings.TrimSpace(strings.SplitN(out[i+len(marker):], "\n", 2)[0])
	s.Admin = User{Login: AdminLogin, Password: pass, Token: token}
	s.AdminToken = token

	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	probe := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/user", nil)
		req.Header.Set("Authorization", "token "+token)
		if resp, err := probe.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-done:
			s.kill()
			return fmt.Errorf("gitea exited before answering:\n%s%s", logs.String(), s.logTail())
		case <-ctx.Done():
			s.kill()
			return fmt.Errorf("gitea not answering on %s: %w%s", s.URL, ctx.Err(), s.logTail())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("gitea not answering on %s after %v:\n%s%s", s.URL, startTimeout, logs.String(), s.logTail())
		}
	}
}

func (s *Server) configPath() string { return filepath.Join(s.Dir, "custom", "conf", "app.ini") }

// config is Gitea's app.ini.
func (s *Server) config(port int, runUser string) string {
	d := s.Dir
	return fmt.Sprintf(`APP_NAME = harmonia-ci test forge
RUN_MODE = prod
RUN_USER = %[2]s
WORK_PATH = %[1]s

[server]
PROTOCOL = http
HTTP_ADDR = 127.0.0.1
HTTP_PORT = %[3]d
DOMAIN = 127.0.0.1
ROOT_URL = http://127.0.0.1:%[3]d/
LOCAL_ROOT_URL = http://127.0.0.1:%[3]d/
DISABLE_SSH = false
START_SSH_SERVER = true
SSH_DOMAIN = 127.0.0.1
SSH_PORT = %[8]d
SSH_LISTEN_HOST = 127.0.0.1
SSH_LISTEN_PORT = %[8]d
SSH_SERVER_HOST_KEYS = %[1]s/data/ssh/gitea.ed25519
OFFLINE_MODE = true
LFS_START_SERVER = false
APP_DATA_PATH = %[1]s/data
STATIC_ROOT_PATH = %[4]s

[database]
DB_TYPE = sqlite3
PATH = %[1]s/data/gitea.db
SQLITE_JOURNAL_MODE = WAL

[security]
INSTALL_LOCK = true
SECRET_KEY = %[5]s
INTERNAL_TOKEN = %[6]s
PASSWORD_HASH_ALGO = pbkdf2$1000$50

[oauth2]
JWT_SECRET = %[7]s

[service]
DISABLE_REGISTRATION = true
ENABLE_NOTIFY_MAIL = false
DEFAULT_KEEP_EMAIL_PRIVATE = false
NO_REPLY_ADDRESS = noreply.invalid

[repository]
ROOT = %[1]s/repos
DEFAULT_BRANCH = main

[webhook]
ALLOWED_HOST_LIST = loopback
DELIVER_TIMEOUT = 5
SKIP_TLS_VERIFY = true

[mailer]
ENABLED = false

[lfs]
PATH = %[1]s/data/lfs

[indexer]
ISSUE_INDEXER_TYPE = db
REPO_INDEXER_ENABLED = false

[actions]
ENABLED = false

[packages]
ENABLED = false

[cron]
ENABLED = false

[cron.update_checker]
ENABLED = false

[session]
PROVIDER = memory

[queue]
; In memory: the default LevelDB queues poll, delaying webhooks by about 2 s.
TYPE = channel

[cache]
ADAPTER = memory

[log]
MODE = file
LEVEL = Info
ROOT_PATH = %[1]s/log
`, d, runUser, port, s.static, randomString(32), randomString(52), randomString(43), s.SSHPort)
}

// gitea runs a Gitea subcommand on the server's configuration and returns its output.
func (s *Server) gitea(ctx context.Context, args ...string) (string, error) {
	c := exec.CommandContext(ctx, s.bin, append(args, "--config", s.configPath())...)
	c.Dir, c.Env = s.Dir, s.env
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	out, err := c.CombinedOutput()
	return string(out), err
}

// logTail returns the end of Gitea's log file, prefixed for inclusion in an error.
func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "log", "gitea.log"))
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return "\n--- gitea.log (tail) ---\n" + string(b)
}

// Logs returns the end of Gitea's log file, for failing tests to show.
func (s *Server) Logs() string { return s.logTail() }

// kill stops the process group of the server, if it runs, and waits for it.
func (s *Server) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
	s.cmd, s.exited = nil, nil
}

// Stop kills the server and everything it started, and removes its directory.
func (s *Server) Stop() {
	s.kill()
	if s.Dir != "" {
		_ = os.RemoveAll(s.Dir)
	}
}

// runAs returns the credential to run Gitea with (nil: as this process's user) and that user's
// name.
func runAs() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, "", err
		}
		return nil, u.Username, nil
	}
	name := os.Getenv("HARMONIA_GITEA_USER")
	if name == "" {
		name = DefaultUser
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, "", fmt.Errorf("gitea refuses to run as root and the user %q to run it as is missing: run `scripts/deps.sh test` or set HARMONIA_GITEA_USER: %w", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil || uid == 0 {
		return nil, "", fmt.Errorf("the gitea user %q must be an unprivileged user (uid %s)", name, u.Uid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, name, nil
}

// linkOrCopy makes dst a hard link to src, or a copy when a link is impossible.
func linkOrCopy(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if os.Link(src, dst) == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm()|0o444)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// linkTree reproduces the tree src at dst, linking (or copying) its files.
func linkTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return linkOrCopy(p, target)
	})
}

// chownTree gives dir, and the directories and configuration under it that Gitea writes,
// to uid:gid. Linked binaries and assets keep their owner: Gitea only reads them.
func chownTree(dir string, uid, gid int) error {
	for _, p := range []string{"", "custom", "custom/conf", "custom/conf/app.ini", "data", "data/ssh", "data/ssh/gitea.ed25519", "repos", "log", "home", "bin", "static"} {
		if err := os.Lchown(filepath.Join(dir, p), uid, gid); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func randomString(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Do calls Gitea's API: method on path (below /api/v1, e.g. "/repos/o/r/hooks"), authenticated
// with token (none if empty), sending in as JSON unless nil and decoding the answer into out
// unless nil. An answer outside 2xx is an *APIError.
func (s *Server) Do(ctx context.Context, token, method, path string, in, out any) error {
	_, err := s.do(ctx, token, method, path, in, out)
	return err
}

func (s *Server) do(ctx context.Context, token, method, path string, in, out any) (http.Header, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+"/api/v1"+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.Header, &APIError{Method: method, Path: path, StatusCode: resp.StatusCode, Body: string(b)}
	}
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.Header, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return resp.Header, nil
}

// getAll reads every page of a listing at path (which may hold a query), 50 items a page.
func getAll[T any](ctx context.Context, s *Server, token, path string) ([]T, error) {
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	var all []T
	for page := 1; ; page++ {
		var items []T
		if _, err := s.do(ctx, token, http.MethodGet, path+sep+"limit=50&page="+strconv.Itoa(page), nil, &items); err != nil {
			return nil, err
		}
		all = append(all, items...)
		if len(items) < 50 {
			return all, nil
		}
	}
}

// CreateUser creates an account named login, with a password and an API token with every
// scope.
func (s *Server) CreateUser(ctx context.Context, login string) (User, error) {
	u := User{Login: login, Password: "pw-" + randomString(16)}
	var created struct {
		ID int64 `json:"id"`
	}
	err := s.Do(ctx, s.AdminToken, http.MethodPost, "/admin/users", map[string]any{
		"username": login, "email": login + "-" + randomString(6) + "@example.invalid", "password": u.Password,
		"must_change_password": false, "send_notify": false,
	}, &created)
	u.ID = created.ID
	if err != nil {
		return User{}, fmt.Errorf("create user %s: %w", login, err)
	}
	// A user's token is created with the user's own password (basic authentication).
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/api/v1/users/"+url.PathEscape(login)+"/tokens",
		strings.NewReader(`{"name":"giteatest","scopes":["all"]}`))
	if err != nil {
		return User{}, err
	}
	req.SetBasicAuth(login, u.Password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return User{}, fmt.Errorf("create token for %s: %w", login, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated {
		return User{}, fmt.Errorf("create token for %s: %w", login, &APIError{Method: http.MethodPost, Path: req.URL.Path, StatusCode: resp.StatusCode, Body: string(b)})
	}
	var tok struct {
		SHA1 string `json:"sha1"`
	}
	if err := json.Unmarshal(b, &tok); err != nil || tok.SHA1 == "" {
		return User{}, fmt.Errorf("create token for %s: no token in %s", login, b)
	}
	u.Token = tok.SHA1
	return u, nil
}

// RenameUser renames the account u as its owner could (the site administrator does it here):
// its id stays, and its old login is free for anyone to take. The returned User has the new
// login.
func (s *Server) RenameUser(ctx context.Context, u User, newLogin string) (User, error) {
	err := s.Do(ctx, s.AdminToken, http.MethodPost, "/admin/users/"+url.PathEscape(u.Login)+"/rename",
		map[string]any{"new_username": newLogin}, nil)
	if err != nil {
		return User{}, fmt.Errorf("rename user %s to %s: %w", u.Login, newLogin, err)
	}
	u.Login = newLogin
	return u, nil
}

type apiRepo struct {
	Name  string `json:"name"`
	Owner struct {
		Login string `json:"login"`
	} `json:"owner"`
	CloneURL      string `json:"clone_url"`
	HTMLURL       string `json:"html_url"`
	Private       bool   `json:"private"`
	DefaultBranch string `json:"default_branch"`
}

func (r apiRepo) repo() Repo {
	return Repo{Owner: r.Owner.Login, Name: r.Name, CloneURL: r.CloneURL, HTMLURL: r.HTMLURL, Private: r.Private, DefaultBranch: r.DefaultBranch}
}

// CreateRepo creates an empty repository (no initial commit) named name, owned by owner
// (s.Admin for the administrator), whose default branch is main.
func (s *Server) CreateRepo(ctx context.Context, owner User, name string, private bool) (Repo, error) {
	var r apiRepo
	err := s.Do(ctx, owner.Token, http.MethodPost, "/user/repos", map[string]any{
		"name": name, "private": private, "auto_init": false, "default_branch": "main",
	}, &r)
	if err != nil {
		return Repo{}, fmt.Errorf("create repository %s/%s: %w", owner.Login, name, err)
	}
	return r.repo(), nil
}

// GetRepo returns the repository owner/name.
func (s *Server) GetRepo(ctx context.Context, owner, name string) (Repo, error) {
	var r apiRepo
	if err := s.Do(ctx, s.AdminToken, http.MethodGet, "/repos/"+url.PathEscape(owner)+"/"+url.PathEscape(name), nil, &r); err != nil {
		return Repo{}, fmt.Errorf("get repository %s/%s: %w", owner, name, err)
	}
	return r.repo(), nil
}

// AuthURL is repo's HTTP clone URL with user's login and token in it, for git.
func (s *Server) AuthURL(repo Repo, user User) string {
	u, err := url.Parse(repo.CloneURL)
	if err != nil || u.Host == "" {
		u, _ = url.Parse(s.URL + "/" + repo.Owner + "/" + repo.Name + ".git")
	}
	u.User = url.UserPassword(user.Login, user.Token)
	return u.String()
}

// Push commits files (path → content; written over the branch's tree) as user on top of
// branch's head, or as the first commit of a new branch, and pushes it. With force the commit
// replaces the head instead (amending it: same parents), and is force-pushed; it differs from
// the old head as long as files or message do. Push returns the new head's commit id.
func (s *Server) Push(ctx context.Context, repo Repo, user User, branch string, files map[string]string, message string, force bool) (string, error) {
	sha, err := s.push(ctx, repo, user, branch, files, message, force)
	if err != nil {
		return "", fmt.Errorf("push to %s %s: %w", repo.FullName(), branch, err)
	}
	return sha, nil
}

func (s *Server) push(ctx context.Context, repo Repo, user User, branch string, files map[string]string, message string, force bool) (string, error) {
	dir, err := os.MkdirTemp("", "hci-gitea-push-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	remote := s.AuthURL(repo, user)
	git := func(args ...string) (string, error) {
		c := exec.CommandContext(ctx, "git", append([]string{"-c", "user.name=" + user.Login,
			"-c", "user.email=" + user.Login + "@example.invalid", "-c", "init.defaultBranch=main"}, args...)...)
		c.Dir = dir
		c.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0")
		out, err := c.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %w\n%s", args[0], err, strings.ReplaceAll(string(out), user.Token, "TOKEN"))
		}
		return strings.TrimSpace(string(out)), nil
	}
	if _, err := git("init", "-q", "-b", branch); err != nil {
		return "", err
	}
	heads, err := git("ls-remote", "--heads", remote, "refs/heads/"+branch)
	if err != nil {
		return "", err
	}
	exists := heads != ""
	if exists {
		if _, err := git("fetch", "-q", remote, "refs/heads/"+branch); err != nil {
			return "", err
		}
		if _, err := git("reset", "-q", "--hard", "FETCH_HEAD"); err != nil {
			return "", err
		}
	}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if _, err := git("add", "-A"); err != nil {
		return "", err
	}
	commit := []string{"commit", "-q", "--allow-empty", "-m", message}
	if force && exists {
		commit = append(commit, "--amend")
	}
	if _, err := git(commit...); err != nil {
		return "", err
	}
	pushArgs := []string{"push", "-q"}
	if force {
		pushArgs = append(pushArgs, "--force")
	}
	if _, err := git(append(pushArgs, remote, "HEAD:refs/heads/"+branch)...); err != nil {
		return "", err
	}
	return git("rev-parse", "HEAD")
}

// BranchHead returns the commit id at the head of branch.
func (s *Server) BranchHead(ctx context.Context, repo Repo, branch string) (string, error) {
	var b struct {
		Commit struct {
			ID string `json:"id"`
		} `json:"commit"`
	}
	if err := s.Do(ctx, s.AdminToken, http.MethodGet, repoPath(repo)+"/branches/"+url.PathEscape(branch), nil, &b); err != nil {
		return "", fmt.Errorf("branch %s of %s: %w", branch, repo.FullName(), err)
	}
	return b.Commit.ID, nil
}

func repoPath(r Repo) string {
	return "/repos/" + url.PathEscape(r.Owner) + "/" + url.PathEscape(r.Name)
}

// CreateBranch makes branch in repo at the head of from, as user: a pull request's branch that
// shares the base's history, which Push's new branches do not.
func (s *Server) CreateBranch(ctx context.Context, repo Repo, user User, branch, from string) error {
	err := s.Do(ctx, user.Token, http.MethodPost, repoPath(repo)+"/branches",
		map[string]string{"new_branch_name": branch, "old_ref_name": "refs/heads/" + from}, nil)
	if err != nil {
		return fmt.Errorf("create branch %s of %s: %w", branch, repo.FullName(), err)
	}
	return nil
}

// AddCollaborator gives login permission ("read", "write" or "admin") on repo.
func (s *Server) AddCollaborator(ctx context.Context, repo Repo, login, permission string) error {
	err := s.Do(ctx, s.AdminToken, http.MethodPut, repoPath(repo)+"/collaborators/"+url.PathEscape(login),
		map[string]string{"permission": permission}, nil)
	if err != nil {
		return fmt.Errorf("add collaborator %s to %s: %w", login, repo.FullName(), err)
	}
	return nil
}

// Fork forks repo into user's account.
func (s *Server) Fork(ctx context.Context, repo Repo, user User) (Repo, error) {
	var r apiRepo
	if err := s.Do(ctx, user.Token, http.MethodPost, repoPath(repo)+"/forks", map[string]any{}, &r); err != nil {
		return Repo{}, fmt.Errorf("fork %s for %s: %w", repo.FullName(), user.Login, err)
	}
	return r.repo(), nil
}

// CreatePullRequest opens, as author, a pull request merging headBranch of head (base itself
// or a fork of it) into baseBranch of base, and returns its number.
func (s *Server) CreatePullRequest(ctx context.Context, author User, base Repo, baseBranch string, head Repo, headBranch, title string) (int, error) {
	h := headBranch
	if head.Owner != base.Owner {
		h = head.Owner + ":" + headBranch
	}
	var pr struct {
		Number int `json:"number"`
	}
	err := s.Do(ctx, author.Token, http.MethodPost, repoPath(base)+"/pulls",
		map[string]string{"head": h, "base": baseBranch, "title": title}, &pr)
	if err != nil {
		return 0, fmt.Errorf("open pull request %s into %s %s: %w", h, base.FullName(), baseBranch, err)
	}
	return pr.Number, nil
}

// Comment posts body as user on issue or pull request number of repo.
func (s *Server) Comment(ctx context.Context, repo Repo, user User, number int, body string) error {
	err := s.Do(ctx, user.Token, http.MethodPost, repoPath(repo)+"/issues/"+strconv.Itoa(number)+"/comments",
		map[string]string{"body": body}, nil)
	if err != nil {
		return fmt.Errorf("comment on %s#%d: %w", repo.FullName(), number, err)
	}
	return nil
}

// Statuses returns every status posted on commit sha of repo, oldest first (Gitea keeps each
// one, not only the latest per context).
func (s *Server) Statuses(ctx context.Context, repo Repo, sha string) ([]Status, error) {
	// "highestindex" is Gitea's name for ascending index, the order they were posted in.
	st, err := getAll[Status](ctx, s, s.AdminToken, repoPath(repo)+"/statuses/"+url.PathEscape(sha)+"?sort=highestindex")
	if err != nil {
		return nil, fmt.Errorf("statuses of %s@%s: %w", repo.FullName(), sha, err)
	}
	return st, nil
}

// Hooks returns repo's webhooks.
func (s *Server) Hooks(ctx context.Context, repo Repo) ([]Hook, error) {
	hooks, err := getAll[Hook](ctx, s, s.AdminToken, repoPath(repo)+"/hooks")
	if err != nil {
		return nil, fmt.Errorf("hooks of %s: %w", repo.FullName(), err)
	}
	for i := range hooks {
		hooks[i].URL = hooks[i].Config["url"]
	}
	return hooks, nil
}

// writeHostKey gives the SSH server an Ed25519 host key at path, unless it has one: Gitea would
// generate a 4096-bit RSA key, which takes seconds.
func writeHostKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	block, err := ssh.MarshalPrivateKey(key, "giteatest host key")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(block), 0o600)
}
