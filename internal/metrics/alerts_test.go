package metrics_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/builder"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/cluster"
	"github.com/harmonia-ci/harmonia-ci/internal/commitstatus"
	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/gc"
	"github.com/harmonia-ci/harmonia-ci/internal/metrics"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nodetoken"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/signer"
	"github.com/harmonia-ci/harmonia-ci/internal/signerclient"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

const alertRules = "../../deploy/prometheus/alerts.yml"

// recorder is a Registerer that keeps what is registered, so its descriptions can be listed
// (a vector with no children yet gathers nothing).
type recorder struct{ cs []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error   { r.cs = append(r.cs, c); return nil }
func (r *recorder) MustRegister(cs ...prometheus.Collector) { r.cs = append(r.cs, cs...) }
func (r *recorder) Unregister(prometheus.Collector) bool    { return false }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exported lists the metric names a node with every role exports, built the way node.Run
// builds them.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	r := &recorder{}
	r.MustRegister(cluster.NewNodeCountCollector(nil), metrics.NewCollector(nil))
	cluster.NewMetrics(r)
	handler := func(context.Context, queue.Job) queue.Result { return queue.Result{} }
	if _, err := queue.NewWorker(queue.WorkerConfig{
		Claimer: queue.Claimer{NodeID: "n", Systems: []string{"x86_64-linux"}}, Handler: handler, Registerer: r,
	}, nil, qt.Logger(), clock.Real{}); err != nil {
		t.Fatal(err)
	}
	if _, err := builder.New(builder.Config{NodeID: "n", Signer: &signerclient.Client{}, Registerer: r}, nil, qt.Logger(), clock.Real{}); err != nil {
		t.Fatal(err)
	}
	queue.MaintenanceTasks(queue.MaintenanceConfig{Registerer: r}, qt.Logger())
	if _, err := eval.New(eval.Config{NodeID: "n", StateDir: t.TempDir(), Confinement: eval.Confinement{User: "harmonia-eval"}, Registerer: r}, nil, qt.Logger(), clock.Real{}); err != nil {
		t.Fatal(err)
	}
	store, err := blob.NewLocal(t.TempDir(), "http://unused", make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	cache.New(cache.Config{Store: store, Registerer: r})
	key, err := nix.GenerateKey("alerts-test-1")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := nodetoken.NewKey("alerts-test-cluster-secret")
	if err != nil {
		t.Fatal(err)
	}
	// A pool that never connects: the signer only needs one to exist.
	pool, err := pgxpool.New(context.Background(), "postgres://unused.invalid/db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, err := signer.New(signer.Config{Store: store, Key: key, Tokens: tokens, Registerer: r}, pool); err != nil {
		t.Fatal(err)
	}
	webhook.New(webhook.Config{Logger: qt.Logger(), Registerer: r}, nil)
	commitstatus.New(commitstatus.Config{Logger: qt.Logger(), Registerer: r}, nil)
	gc.NewMetrics(r)
	names := map[string]bool{}
	for _, c := range r.cs {
		ch := make(chan *prometheus.Desc, 100)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			names[m[1]] = true
		}
	}
	return names
}

// TestAlertRules: the shipped alert rules pass promtool and name only metrics harmonia-ci
// exports.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	names := exported(t)
	used := regexp.MustCompile(`harmonia_ci_[a-z0-9_]+`).FindAllString(string(src), -1)
	if len(used) == 0 {
		t.Fatal("the alert rules name no harmonia-ci metric")
	}
	for _, name := range used {
		base := name
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if trimmed, ok := strings.CutSuffix(name, suffix); ok && names[trimmed] {
				base = trimmed
			}
		}
		if !names[base] {
			t.Errorf("%s names %s, which harmonia-ci does not export", alertRules, name)
		}
	}

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is missing (scripts/deps.sh test installs it)")
		}
		t.Skip("promtool is missing (scripts/deps.sh test installs it)")
	}
	out, err := exec.Command(promtool, "check", "rules", alertRules).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules %s: %v\n%s", alertRules, err, out)
	}
}
