package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/giteatest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
)

// The admin of one enabled repository reads its hook's secret in Gitea and signs deliveries
// for another project with it: every such delivery is refused (401) and nothing is recorded.
// The victim's hook, registered before at the forge-wide URL with the forge's secret, is
// re-registered by enabling; Gitea's own deliveries then pass, and a replayed body or a late
// push of an older commit does nothing.
func TestWebhookSignedForAnotherRepository(t *testing.T) {
	ctx := context.Background()
	var mine giteatest.Repo // the attacker's repository
	c := newForgeCluster(t, forgeOptions{prepare: func(g *giteatest.Server, owner giteatest.User) (string, []string) {
		var err error
		if mine, err = g.CreateRepo(ctx, owner, giteatest.UniqueName("mallory"), false); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Push(ctx, mine, owner, "main", map[string]string{"README": "mine\n"}, "init", false); err != nil {
			t.Fatal(err)
		}
		return "", nil
	}})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("front-1:\n%s", lastLines(c.procs["front-1"].Logs(), 60))
		}
	})
	var mineRow, mineID int64
	proctest.WaitFor(t, 30*time.Second, "repository "+mine.FullName()+" discovered", func() bool {
		return c.pool.QueryRow(ctx, `SELECT id, forge_id FROM repositories WHERE forge = 'gitea' AND full_name = $1 AND forge_id IS NOT NULL`,
			mine.FullName()).Scan(&mineRow, &mineID) == nil
	})

	// The victim's hook as an earlier version registered it: the forge-wide URL and secret.
	old := map[string]any{"type": "gitea", "active": true, "events": []string{"push"},
		"config": map[string]string{"url": c.endpoint("front-1") + "/webhook/gitea", "content_type": "json", "secret": giteaWebhookSecret}}
	if err := c.gitea.Do(ctx, c.owner.Token, http.MethodPost, "/repos/"+c.repo.FullName()+"/hooks", old, nil); err != nil {
		t.Fatal(err)
	}
	c.enable(nil)
	if code, out := c.admin("front-1", http.MethodPost, fmt.Sprintf("/api/projects/%d/enable", mineRow), nil); code != http.StatusOK {
		t.Fatalf("enable %s: %d %s", mine.FullName(), code, out)
	}
	hooks, err := c.gitea.Hooks(ctx, c.repo)
	if want := fmt.Sprintf("%s/webhook/gitea/%d", c.endpoint("front-1"), c.forgeID); err != nil || len(hooks) != 1 || hooks[0].Config["url"] != want {
		t.Fatalf("victim's hooks after enable: %+v (%v); want one, re-registered at %s", hooks, err, want)
	}

	mySecret := forge.RepositorySecret([]byte(giteaWebhookSecret), mineID)
	forged := strings.Repeat("e", 40)
	victimBody := giteaPushBody(t, c.repo, c.forgeID, forged)
	renamedBody := giteaPushBody(t, c.repo, mineID, forged) // my id, the victim's name
	for _, a := range []struct {
		name, path string
		secret     []byte
		body       []byte
	}{
		{"the victim's URL", fmt.Sprintf("/webhook/gitea/%d", c.forgeID), mySecret, victimBody},
		{"my URL", fmt.Sprintf("/webhook/gitea/%d", mineID), mySecret, victimBody},
		{"my URL and id, the victim's name", fmt.Sprintf("/webhook/gitea/%d", mineID), mySecret, renamedBody},
		{"the forge-wide URL and secret", "/webhook/gitea", []byte(giteaWebhookSecret), victimBody},
	} {
		if code, out := c.deliverBody("front-1", a.path, "e2e-attack-"+strconv.Itoa(len(a.name)), a.secret, a.body); code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want 401", a.name, code, out)
		}
	}
	if n := c.evaluations(forged); n != 0 {
		t.Fatalf("deliveries signed with another repository's secret made %d evaluations", n)
	}
	var recorded int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id LIKE 'e2e-attack-%'`).Scan(&recorded); err != nil || recorded != 0 {
		t.Fatalf("refused deliveries recorded: %d (%v)", recorded, err)
	}

	// Gitea's own deliveries, signed with the re-registered hook's secret, are acted on.
	salt := uniqueSalt(t)
	older := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt)}, false)
	olderEval, _ := c.evalOf(older, "main")
	newer := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt + "-2")}, false)
	newerEval, _ := c.evalOf(newer, "main")

	// A late (or replayed, past the retention) push of the older commit, in a body not seen
	// before, once the newer evaluation is under way: the branch has moved on, so the older
	// commit is neither evaluated again nor allowed to supersede the newer one.
	victimSecret := forge.RepositorySecret([]byte(giteaWebhookSecret), c.forgeID)
	state := func(id int64) string {
		var st, errText string
		if err := c.pool.QueryRow(ctx, `SELECT status, COALESCE(error, '') FROM evaluations WHERE id = $1`, id).Scan(&st, &errText); err != nil {
			t.Fatal(err)
		}
		return st + " " + errText
	}
	olderBefore := state(olderEval)
	lateBody := giteaPushBody(t, c.repo, c.forgeID, older)
	code, out := c.deliverBody("front-1", fmt.Sprintf("/webhook/gitea/%d", c.forgeID), "e2e-late", victimSecret, lateBody)
	// "evaluation exists" when the older evaluation finished before the newer one came.
	if code/100 != 2 || !(strings.Contains(out, "no longer the head") || strings.Contains(out, "evaluation exists")) {
		t.Fatalf("late push of %s: %d %s, want 200 no longer the head (or evaluation exists)", older[:12], code, out)
	}
	if s := state(newerEval); strings.Contains(s, "superseded") {
		t.Fatalf("the newer evaluation after a late push of an older commit: %s; want not superseded", s)
	}
	if s := state(olderEval); s != olderBefore && !strings.HasPrefix(olderBefore, "queued") && !strings.HasPrefix(olderBefore, "running") {
		t.Fatalf("the older evaluation after its late push: %q, was %q; want unchanged", s, olderBefore)
	}

	// A captured body replayed under a new delivery id is a no-op.
	side := giteaPushBody(t, c.repo, c.forgeID, strings.Repeat("d", 40))
	side = bytes.Replace(side, []byte(`"refs/heads/main"`), []byte(`"refs/heads/replayed"`), 1)
	path := fmt.Sprintf("/webhook/gitea/%d", c.forgeID)
	if code, out := c.deliverBody("front-1", path, "e2e-replay-1", victimSecret, side); code != http.StatusAccepted {
		t.Fatalf("first delivery: %d %s, want 202", code, out)
	}
	if code, out := c.deliverBody("front-1", path, "e2e-replay-2", victimSecret, side); code != http.StatusOK || !strings.Contains(out, "received before") {
		t.Fatalf("replayed body under a new delivery id: %d %s, want 200 received before", code, out)
	}
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE delivery_id = 'e2e-replay-2'`).Scan(&recorded); err != nil || recorded != 0 {
		t.Fatalf("replayed delivery recorded: %d (%v)", recorded, err)
	}
	if n := c.evaluations(strings.Repeat("d", 40)); n != 1 {
		t.Fatalf("%d evaluations of the replayed push, want 1", n)
	}

	// An upgrade finds enabled projects' hooks at the forge-wide URL: the repository discovery
	// registers them again, each with its own secret.
	if err := c.gitea.Do(ctx, c.owner.Token, http.MethodPost, "/repos/"+c.repo.FullName()+"/hooks", old, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.pool.Exec(ctx, `UPDATE repositories SET hook_url = NULL WHERE id = $1`, c.repoID); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s/webhook/gitea/%d", c.endpoint("front-1"), c.forgeID)
	proctest.WaitFor(t, 30*time.Second, "the victim's hook registered again", func() bool {
		hooks, err := c.gitea.Hooks(ctx, c.repo)
		var url string
		return err == nil && len(hooks) == 1 && hooks[0].Config["url"] == want &&
			c.pool.QueryRow(ctx, `SELECT COALESCE(hook_url, '') FROM repositories WHERE id = $1`, c.repoID).Scan(&url) == nil && url != ""
	})
	again := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": okNix(salt + "-3")}, false)
	c.evalOf(again, "main")
}

// vmHWM is a process's peak resident set size, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/pid/status")
	return 0
}

// floodBody is a reader of n bytes that costs the sender no memory.
type floodBody struct{ left int64 }

func (f *floodBody) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), f.left)
	for i := range p[:n] {
		p[i] = '{'
	}
	f.left -= n
	return int(n), nil
}

// 200 deliveries of 24 MB each with bad signatures, all at once: the frontend reads and hashes
// them as they stream, keeping a small window of each in memory, so its peak RSS grows by far
// less than one body per delivery.
func TestWebhookFloodMemoryBounded(t *testing.T) {
	const (
		n    = 200
		size = 24_000_000
	)
	c := newForgeCluster(t, forgeOptions{frontendLines: "max_webhooks_in_flight = 256\n",
		prepare: func(*giteatest.Server, giteatest.User) (string, []string) {
			return "max_webhook_body = \"25MB\"\n", nil
		}})
	c.enable(nil)
	pid := c.procs["front-1"].Pid()
	before := vmHWM(t, pid)
	url := fmt.Sprintf("%s/webhook/gitea/%d", c.endpoint("front-1"), c.forgeID)
	client := &http.Client{Timeout: 5 * time.Minute}
	codes := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			req, err := http.NewRequest(http.MethodPost, url, &floodBody{left: size})
			if err != nil {
				t.Error(err)
				return
			}
			req.ContentLength = size
			req.Header.Set("X-Gitea-Event", "push")
			req.Header.Set("X-Gitea-Delivery", fmt.Sprintf("flood-%d", i))
			req.Header.Set("X-Gitea-Signature", strings.Repeat("0", 64))
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("delivery %d: %v", i, err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusUnauthorized {
			t.Errorf("flood delivery %d: %d, want 401", i, code)
		}
	}
	after := vmHWM(t, pid)
	// Bodies read whole would need n*size (4.8 GB); streamed, each costs a spool window, a
	// copy buffer and a goroutine.
	const bound = 128 << 20
	t.Logf("front-1 peak RSS %d MiB before the flood, %d MiB after (%d deliveries of %d MB in flight at once)",
		before>>20, after>>20, n, size/1_000_000)
	if after-before > bound {
		t.Fatalf("front-1's peak RSS grew by %d MiB for %d bad deliveries of %d MB; want at most %d MiB",
			(after-before)>>20, n, size/1_000_000, bound>>20)
	}
	var recorded int
	if err := c.pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_deliveries WHERE delivery_id LIKE 'flood-%'`).Scan(&recorded); err != nil || recorded != 0 {
		t.Fatalf("flood deliveries recorded: %d (%v)", recorded, err)
	}
}
