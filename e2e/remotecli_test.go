package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/apiv1"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// remoteToken mints the API token the remote command line uses on cluster c: a machine token
// with the admin's rights (harmonia-ci api-token --admin), as a deploy script would hold.
func remoteToken(t *testing.T, c *buildCluster) string {
	t.Helper()
	for _, line := range strings.Split(c.cli.ok("api-token", "--name", "remote-cli", "--admin"), "\n") {
		if tok := strings.TrimSpace(line); apiTokenRE.MatchString(tok) {
			return tok
		}
	}
	t.Fatal("harmonia-ci api-token printed no token")
	return ""
}

// remoteCLI runs harmonia-ci as on a laptop: a HOME and config directory of its own, no
// database URL or other harmonia-ci setting in its environment, a server and a token.
type remoteCLI struct {
	t      *testing.T
	server string
	token  string
	home   string
}

// run runs harmonia-ci args --server …, with the token in HARMONIA_CI_TOKEN; it returns the
// exit code, stdout and stderr.
func (r *remoteCLI) run(args ...string) (int, string, string) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, proctest.Binary(r.t), append(args, "--server", r.server)...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "HARMONIA_") && !strings.HasPrefix(name, "PG") && name != "HOME" && name != "XDG_CONFIG_HOME" {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "HOME="+r.home, "XDG_CONFIG_HOME="+filepath.Join(r.home, ".config"), "HARMONIA_CI_TOKEN="+r.token)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		r.t.Fatalf("run %v: %v", args, err)
	}
	if strings.Contains(stdout.String()+stderr.String(), r.token) {
		r.t.Errorf("harmonia-ci %v printed the token", args)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// expect runs args and fails the test unless they exit with code; it returns stdout.
func (r *remoteCLI) expect(code int, args ...string) string {
	r.t.Helper()
	got, stdout, stderr := r.run(args...)
	if got != code {
		r.t.Fatalf("harmonia-ci %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), got, code, stdout, stderr)
	}
	r.t.Logf("harmonia-ci %s: exit %d\n%s%s", strings.Join(args, " "), got, stdout, stderr)
	return stdout
}

// The command line on a machine without the database follows a cluster's evaluations over
// HTTP with a token: watch exits 1 when an attribute failed and 0 when everything succeeded,
// failures shows the failed build's log tail, job show --json is the API's build, log prints a
// finished build's log, job rebuild queues the failed build again, and a refused token exits 3
// with nothing changed.
func TestRemoteCLI(t *testing.T) {
	c := newBuildCluster(t, buildClusterOptions{builders: 1, frontendEnv: []string{"HARMONIA_ADMIN_TOKEN=" + adminToken}})
	r := &remoteCLI{t: t, server: c.endpoint("front-1"), token: remoteToken(t, c), home: t.TempDir()}
	salt := uniqueSalt(t)

	c.repo.Commit("one fails", map[string]string{"ci.nix": nixtest.Lib(salt) + `
{ bad = fail "bad" [ ]; ok = mk "ok" [ ]; }
`})
	failing := evalID(t, c.cli.ok("eval", c.project))
	id := strconv.FormatInt(failing, 10)
	if out := r.expect(1, "watch", id); !strings.Contains(out, "evaluation "+id+" of build") {
		t.Errorf("watch printed no progress line:\n%s", out)
	}
	_, _, stderr := r.run("watch", id)
	if !strings.Contains(stderr, "bad (failed)") || strings.Contains(stderr, "ok (") {
		t.Errorf("watch does not name the failed attribute alone:\n%s", stderr)
	}

	out := r.expect(0, "failures", id)
	if !strings.Contains(out, "=== bad: failed") || !strings.Contains(out, "failing bad") {
		t.Errorf("failures lacks bad's heading or its log tail:\n%s", out)
	}
	var fl apiv1.FailureList
	decodeJSONOutput(t, r.expect(0, "failures", id, "--json"), &fl)
	if len(fl.Failures) != 1 || fl.Failures[0].Name != "bad" || fl.Failures[0].BuildID == nil {
		t.Fatalf("failures --json: %+v", fl)
	}
	bad := *fl.Failures[0].BuildID
	badID := strconv.FormatInt(bad, 10)

	var b apiv1.Build
	decodeJSONOutput(t, r.expect(0, "job", "show", badID, "--json"), &b)
	if b.ID != bad || b.Status != status.JobFailed || b.Project != c.project || !strings.Contains(b.DrvPath, "-bad") {
		t.Fatalf("job show --json: %+v", b)
	}
	if out := r.expect(1, "log", badID); !strings.Contains(out, "failing bad") {
		t.Errorf("log of the failed build lacks its output:\n%s", out)
	}

	// A token the server refuses: exit 3, a message that says so, the build untouched.
	refused := *r
	refused.token = "not-a-token-" + salt
	code, _, stderr := refused.run("job", "cancel", badID)
	if code != 3 || !strings.Contains(stderr, "refused the token") {
		t.Errorf("a refused token: exit %d, want 3 with a clear message:\n%s", code, stderr)
	}

	before := c.job(b.DrvPath)
	if out := r.expect(0, "job", "rebuild", badID); !strings.Contains(out, "queued again") {
		t.Errorf("job rebuild: %s", out)
	}
	c.waitJob(b.DrvPath, time.Minute, "failed again", func(j jobRow) bool { return j.Status == status.JobFailed && j.Attempt > before.Attempt })

	c.repo.Commit("all good", map[string]string{"ci.nix": nixtest.Lib(salt) + `
let a = mk "a" [ ]; in { inherit a; b = mk "b" [ a ]; }
`})
	green := strconv.FormatInt(evalID(t, c.cli.ok("eval", c.project)), 10)
	var done apiv1.EvaluationDetail
	decodeJSONOutput(t, r.expect(0, "watch", green, "--json"), &done)
	if done.Status != status.EvalSucceeded || done.Builds[status.JobSucceeded] < 2 || len(done.Attributes) != 2 {
		t.Fatalf("watch --json of the green evaluation: %+v", done)
	}
	var es []apiv1.Evaluation
	decodeJSONOutput(t, r.expect(0, "eval", "list", c.project, "--json"), &es)
	if len(es) < 2 || strconv.FormatInt(es[0].ID, 10) != green || es[1].ID != failing {
		t.Errorf("eval list --json: %+v, want %s then %d first", es, green, failing)
	}
	if out := r.expect(0, "eval", "show", green); !strings.Contains(out, fmt.Sprintf("evaluation %s of %s", green, c.project)) {
		t.Errorf("eval show:\n%s", out)
	}
}
