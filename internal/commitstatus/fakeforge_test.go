package commitstatus

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/gitrepo"
)

// errForgeDown is what the fake answers to a call told to fail.
var errForgeDown = errors.New("fake forge: 502 bad gateway")

// sentStatus is one status the fake forge accepted.
type sentStatus struct {
	Repo   forge.Repo
	Commit string
	forge.Status
}

// gate holds one ReportStatus call until released or its context ends.
type gate struct {
	// recordFirst: the forge has the status before the caller hears back (a node that dies
	// during the call never learns it arrived); otherwise it arrives only on release.
	recordFirst bool
	entered     chan struct{} // closed when the call reaches the gate
	release     chan struct{} // closed to let it return
}

// fakeForge is a forge.Forge that records commit statuses and answers LatestStatus from them.
// Every other method fails: the reporter must not call them.
type fakeForge struct {
	name string

	mu       sync.Mutex
	sent     []sentStatus
	attempts int // ReportStatus calls, failed ones included
	latest   int // LatestStatus calls
	passNext int // calls to let through before failNext applies
	failNext int
	gate     *gate
}

var _ forge.Forge = (*fakeForge)(nil)

func newFakeForge(name string) *fakeForge { return &fakeForge{name: name} }

// fail makes the next n ReportStatus calls fail without recording anything.
func (f *fakeForge) fail(n int) { f.failAfter(0, n) }

// failAfter lets pass calls through, then makes n fail.
func (f *fakeForge) failAfter(pass, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.passNext, f.failNext = pass, n
}

// block makes the next ReportStatus call wait at a gate: entered is closed when the call
// arrives, release lets it return (nil error) and is safe to call more than once. A call whose
// context ends first returns the context's error.
func (f *fakeForge) block(recordFirst bool) (entered <-chan struct{}, release func()) {
	g := &gate{recordFirst: recordFirst, entered: make(chan struct{}), release: make(chan struct{})}
	f.mu.Lock()
	f.gate = g
	f.mu.Unlock()
	var once sync.Once
	return g.entered, func() { once.Do(func() { close(g.release) }) }
}

// statuses returns what the forge accepted, in order.
func (f *fakeForge) statuses() []sentStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentStatus(nil), f.sent...)
}

// calls returns how many ReportStatus and LatestStatus calls were made.
func (f *fakeForge) calls() (report, latest int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.attempts, f.latest
}

// has reports whether the forge shows s as the latest status of its context.
func (f *fakeForge) has(s forge.Status) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.sent) - 1; i >= 0; i-- {
		if f.sent[i].Context == s.Context {
			return f.sent[i].Status == s
		}
	}
	return false
}

func (f *fakeForge) record(repo forge.Repo, sha string, s forge.Status) {
	f.sent = append(f.sent, sentStatus{Repo: repo, Commit: sha, Status: s})
}

func (f *fakeForge) ReportStatus(ctx context.Context, repo forge.Repo, sha string, s forge.Status) error {
	f.mu.Lock()
	f.attempts++
	if f.passNext > 0 {
		f.passNext--
	} else if f.failNext > 0 {
		f.failNext--
		f.mu.Unlock()
		return errForgeDown
	}
	g := f.gate
	f.gate = nil
	if g == nil || g.recordFirst {
		f.record(repo, sha, s)
	}
	f.mu.Unlock()
	if g == nil {
		return nil
	}
	close(g.entered)
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !g.recordFirst {
		f.mu.Lock()
		f.record(repo, sha, s)
		f.mu.Unlock()
	}
	return nil
}

func (f *fakeForge) LatestStatus(_ context.Context, repo forge.Repo, sha, context string) (forge.Status, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latest++
	for i := len(f.sent) - 1; i >= 0; i-- {
		if s := f.sent[i]; s.Repo == repo && s.Commit == sha && s.Context == context {
			return s.Status, true, nil
		}
	}
	return forge.Status{}, false, nil
}

func (f *fakeForge) Name() string { return f.name }
func (f *fakeForge) Type() string { return forge.TypeGitea }

var errUnexpected = errors.New("fake forge: the commit status reporter must not call this")

func (f *fakeForge) WebhookVerifier(http.Header, int64) (*forge.Verifier, error) {
	return nil, errUnexpected
}
func (f *fakeForge) ParseWebhook(http.Header, []byte) (forge.Event, error) {
	return forge.Event{}, errUnexpected
}
func (f *fakeForge) ListRepositories(context.Context) ([]forge.Repository, error) {
	return nil, errUnexpected
}
func (f *fakeForge) PullRequestCommits(context.Context, forge.Repo, int) ([]forge.Commit, error) {
	return nil, errUnexpected
}

func (f *fakeForge) Permission(context.Context, forge.Repo, string) (forge.Permission, error) {
	return forge.PermissionNone, errUnexpected
}
func (f *fakeForge) UserID(context.Context, string) (int64, error) {
	return 0, errUnexpected
}
func (f *fakeForge) PullRequest(context.Context, forge.Repo, int) (forge.PullRequest, error) {
	return forge.PullRequest{}, errUnexpected
}
func (f *fakeForge) BranchHead(context.Context, forge.Repo, string) (string, error) {
	return "", errUnexpected
}
func (f *fakeForge) RegisterWebhook(context.Context, forge.Repo, string) (string, error) {
	return "", errUnexpected
}
func (f *fakeForge) DeleteWebhook(context.Context, forge.Repo, string) error { return errUnexpected }
func (f *fakeForge) CommitURL(forge.Repo, string) string                     { return "" }
func (f *fakeForge) ReadCredential(context.Context, forge.Repository) (gitrepo.Credential, error) {
	return gitrepo.Credential{}, errUnexpected
}
