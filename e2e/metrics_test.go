package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/proctest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// gcMetrics are the garbage collector's series TestMetrics expects on front-1 (a signer, where
// the GC runs: a new GC leader collects at once when none ever succeeded).
var gcMetrics = []string{
	"harmonia_ci_gc_runs_total", "harmonia_ci_gc_deleted_rows_total", "harmonia_ci_gc_deleted_objects_total",
	"harmonia_ci_gc_deleted_bytes_total", "harmonia_ci_gc_scanned_objects_total", "harmonia_ci_gc_narinfo_reads_total",
	"harmonia_ci_gc_duration_seconds", "harmonia_ci_gc_live_set_query_seconds",
	"harmonia_ci_gc_last_success_timestamp_seconds",
}

// exposedBy lists the metric names each node of TestMetrics must expose, by role.
var exposedBy = map[string][]string{
	// The database gauges and the cluster's own series: on every node.
	"": {
		"harmonia_ci_build_jobs", "harmonia_ci_build_jobs_ready", "harmonia_ci_build_jobs_blocked",
		"harmonia_ci_oldest_ready_job_age_seconds", "harmonia_ci_node_jobs", "harmonia_ci_node_max_jobs",
		"harmonia_ci_project_consumed_seconds", "harmonia_ci_evaluations", "harmonia_ci_nodes",
		"harmonia_ci_database_up", "harmonia_ci_scrape_errors_total", "harmonia_ci_heartbeat_failures_total",
	},
	"front-1": {
		// (harmonia_ci_leader_failovers_total has a series only once a failover happened.)
		"harmonia_ci_leader_is_leader", "harmonia_ci_leader_elections_total", "harmonia_ci_leader_tenure_seconds",
		"harmonia_ci_build_failures_total",
		"harmonia_ci_signer_requests_total", "harmonia_ci_signer_narinfos_total", "harmonia_ci_signer_upload_bytes_total",
		"harmonia_ci_builds_flaky_total",
		"harmonia_ci_cache_requests_total", "harmonia_ci_cache_response_bytes_total",
		"harmonia_ci_webhook_deliveries_total", "harmonia_ci_commit_status_calls_total",
		"harmonia_ci_commit_status_call_duration_seconds",
	},
	"eval-1": {"harmonia_ci_evaluations_finished_total", "harmonia_ci_evaluation_duration_seconds",
		"harmonia_ci_eval_worker_restarts_total"},
	"b1": {
		"harmonia_ci_claims_total", "harmonia_ci_claim_duration_seconds", "harmonia_ci_claimed_jobs_total",
		"harmonia_ci_build_duration_seconds", "harmonia_ci_build_failures_total", "harmonia_ci_build_step_seconds",
	},
}

// TestMetrics: after a cluster (connected to Gitea) built a DAG with a success, a failure, a
// build no node can run and their dependents, and while a second evaluation's builds keep jobs
// building, ready and blocked, every node exposes its metrics; the database gauges equal the
// database's counts read in the same moment on every node, and the counters agree with what
// the database recorded.
func TestMetrics(t *testing.T) {
	c := newForgeCluster(t, forgeOptions{builders: 1})
	// Unsupported builds are failed after 2s, not 30 minutes: front-1, the maintenance leader,
	// restarts on a configuration that says so (before anything is counted).
	c.stop("front-1")
	raw, err := os.ReadFile(c.nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	const reap = `reap_interval = "500ms"`
	if !strings.Contains(string(raw), reap) {
		t.Fatalf("no %s in the node configuration", reap)
	}
	cfg := strings.Replace(string(raw), reap, reap+"\nunsupported_interval = \"500ms\"\nunsupported_grace = \"2s\"", 1)
	if err := os.WriteFile(c.nodeCfg, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startNode("front-1", "frontend,signer,cache")
	c.waitActive("front-1")
	c.cacheURL = c.endpoint("front-1")
	c.enable(nil)

	// Phase 1: a success with a dependent (which substitutes its input from the cache), a
	// failure and a build no node can run, each with a dependent.
	salt := uniqueSalt(t)
	first := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": nixtest.Lib(salt) + `
let
  ok = mk "ok" [ ];
  bad = fail "bad" [ ];
  unsupported = builtins.derivation {
    name = "unsupported";
    system = builtins.currentSystem;
    builder = "/bin/sh";
    salt = "` + salt + `";
    requiredSystemFeatures = [ "e2e-no-node-has-this" ];
    args = [ "-c" "echo > $out" ];
  };
in {
  inherit ok bad unsupported;
  above-ok = mk "above-ok" [ ok ];
  above-bad = mk "above-bad" [ bad ];
  above-unsupported = mk "above-unsupported" [ unsupported ];
}`}, false)
	firstEval := c.waitEvaluated(first)
	jobs := c.waitFinished(firstEval, 2*time.Minute)
	want := map[string]status.JobStatus{"ok": status.JobSucceeded, "above-ok": status.JobSucceeded, "bad": status.JobFailed, "above-bad": status.JobDepFailed,
		"unsupported": status.JobFailed, "above-unsupported": status.JobDepFailed}
	var built []jobRow
	for _, j := range jobs {
		if w := want[drvName(j.DrvPath)]; j.Status != w {
			t.Fatalf("%s; want %s", j, w)
		}
		if j.Status == status.JobSucceeded {
			built = append(built, j)
		}
	}
	c.waitStatuses(first, "success", "failure", 2*time.Minute)

	// A fresh store substitutes the outputs: narinfo and NAR hits.
	outs := c.outputPaths(built)
	before := scrape(t, c.endpoint("front-1"))
	c.checkSubstitutable(outs)
	after := scrape(t, c.endpoint("front-1"))
	for _, kind := range []string{"narinfo", "nar"} {
		hits := func(m metricSet) float64 {
			return m.value("harmonia_ci_cache_requests_total", "kind", kind, "result", "hit")
		}
		if n := hits(after) - hits(before); n < float64(len(outs)) {
			t.Errorf("%d outputs substituted, but the cache counted %v %s hits", len(outs), n, kind)
		}
	}

	// Phase 2: three long builds and one above the first: with two slots, two build, one is
	// ready and one is blocked for as long as the test looks.
	slow := c.push(c.owner, c.repo, "main", map[string]string{"ci.nix": shLib(salt) + `
let s1 = sh "slow-1" [ ] "/bin/sleep 600"; in {
  inherit s1;
  s2 = sh "slow-2" [ ] "/bin/sleep 600";
  s3 = sh "slow-3" [ ] "/bin/sleep 600";
  above-slow = sh "above-slow" [ s1 ] "true";
}`}, false)
	c.waitEvaluated(slow)
	proctest.WaitFor(t, time.Minute, "two jobs building, one ready and one blocked", func() bool {
		c.checkRunning()
		q := c.queueState()
		return q.series[`harmonia_ci_build_jobs_ready`] == 1 && q.series[`harmonia_ci_build_jobs_blocked`] == 1 &&
			q.nodeJobs == 2 && q.building == 2
	})

	nodes := []string{"front-1", "eval-1", "b1"}
	for _, id := range nodes {
		m := scrape(t, c.endpoint(id))
		for _, name := range slices.Concat(exposedBy[""], exposedBy[id]) {
			if !m.has(name) {
				t.Errorf("%s does not expose %s", id, name)
			}
		}
		if id == "front-1" {
			for _, name := range gcMetrics {
				if !m.has(name) {
					t.Errorf("%s does not expose %s", id, name)
				}
			}
			c.checkGC(m)
		}
	}
	for _, id := range nodes {
		c.checkGauges(id)
	}
	c.checkCounters()
}

// waitEvaluated waits until the evaluation of commit sha on main succeeded and returns it.
func (c *forgeCluster) waitEvaluated(sha string) int64 {
	c.t.Helper()
	var id int64
	proctest.WaitFor(c.t, 2*time.Minute, "evaluation of "+sha[:12]+" succeeded", func() bool {
		c.checkRunning()
		var st status.EvalStatus
		id, st = c.evalOf(sha, "main")
		if st.Terminal() && st != status.EvalSucceeded {
			c.t.Fatalf("evaluation %d of %s: %s", id, sha[:12], st)
		}
		return st == status.EvalSucceeded
	})
	return id
}

// queueState is what the database gauges should say, read from the database.
type queueState struct {
	series   map[string]float64 // exposition-format series of the exact gauges → value
	oldest   float64            // harmonia_ci_oldest_ready_job_age_seconds, at the time of reading
	building float64            // jobs building or uploading
	nodeJobs float64            // current_jobs of b1
}

// queueState reads the database's counts the way the gauges are defined.
func (c *forgeCluster) queueState() queueState {
	c.t.Helper()
	ctx := context.Background()
	q := queueState{series: map[string]float64{}}
	add := func(sql string, row func(k, k2 string, v float64)) {
		rows, err := c.pool.Query(ctx, sql)
		if err != nil {
			c.t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var k, k2 string
			var v float64
			if err := rows.Scan(&k, &k2, &v); err != nil {
				c.t.Fatal(err)
			}
			row(k, k2, v)
		}
		if err := rows.Err(); err != nil {
			c.t.Fatal(err)
		}
	}
	systems := map[string]bool{}
	add(`SELECT status, system, count(*)::float8 FROM build_jobs WHERE status IN ('pending', 'building', 'uploading')
GROUP BY status, system`, func(st, system string, v float64) {
		systems[system] = true
		q.series[fmt.Sprintf(`harmonia_ci_build_jobs{status=%q,system=%q}`, st, system)] = v
		if st != string(status.JobPending) {
			q.building += v
		}
	})
	for system := range systems {
		for _, st := range status.UnfinishedJobs() {
			k := fmt.Sprintf(`harmonia_ci_build_jobs{status=%q,system=%q}`, st, system)
			q.series[k] += 0
		}
	}
	add(`SELECT 'ready', '', count(*) FILTER (WHERE blocked_inputs = 0)::float8 FROM build_jobs WHERE status = 'pending'
UNION ALL SELECT 'blocked', '', count(*) FILTER (WHERE blocked_inputs > 0)::float8 FROM build_jobs WHERE status = 'pending'
UNION ALL SELECT 'oldest', '', COALESCE(EXTRACT(EPOCH FROM now() - min(created_at)), 0)::float8 FROM build_jobs
  WHERE status = 'pending' AND blocked_inputs = 0`, func(k, _ string, v float64) {
		switch k {
		case "ready", "blocked":
			q.series["harmonia_ci_build_jobs_"+k] = v
		case "oldest":
			q.oldest = v
		}
	})
	add(`SELECT id, 'node_jobs', current_jobs::float8 FROM nodes WHERE status <> 'dead' AND 'builder' = ANY(roles)
UNION ALL SELECT id, 'node_max_jobs', max_jobs::float8 FROM nodes WHERE status <> 'dead' AND 'builder' = ANY(roles)`,
		func(node, name string, v float64) {
			q.series[fmt.Sprintf(`harmonia_ci_%s{node=%q}`, name, node)] = v
			if node == "b1" && name == "node_jobs" {
				q.nodeJobs = v
			}
		})
	// A private or disabled project is labelled by "#" and its id, never by name.
	add(`SELECT CASE WHEN p.enabled AND NOT r.is_private THEN p.name ELSE '#' || p.id END, '', p.consumed_seconds::float8
FROM projects p JOIN repositories r ON r.id = p.repo_id`, func(project, _ string, v float64) {
		q.series[fmt.Sprintf(`harmonia_ci_project_consumed_seconds{project=%q}`, project)] = v
	})
	add(`SELECT s, '', (SELECT count(*) FROM evaluations WHERE status = s)::float8 FROM unnest(ARRAY['queued', 'running']) s`,
		func(status, _ string, v float64) {
			q.series[fmt.Sprintf(`harmonia_ci_evaluations{status=%q}`, status)] = v
		})
	return q
}

// gaugeNames are the metrics queueState predicts exactly.
var gaugeNames = []string{"harmonia_ci_build_jobs", "harmonia_ci_build_jobs_ready", "harmonia_ci_build_jobs_blocked",
	"harmonia_ci_node_jobs", "harmonia_ci_node_max_jobs", "harmonia_ci_project_consumed_seconds", "harmonia_ci_evaluations"}

// checkGauges compares node id's database gauges with the database: a scrape between two equal
// readings of the database must show exactly them (the gauges are computed per scrape).
func (c *forgeCluster) checkGauges(id string) {
	c.t.Helper()
	var last string
	ok := false
	defer func() {
		if !ok {
			c.t.Logf("%s: last comparison:\n%s", id, last)
		}
	}()
	proctest.WaitFor(c.t, 30*time.Second, id+"'s gauges equal to the database", func() bool {
		before := c.queueState()
		m := scrape(c.t, c.endpoint(id))
		after := c.queueState()
		if !maps.Equal(before.series, after.series) {
			last = "the database changed during the scrape"
			return false
		}
		got := map[string]float64{}
		for _, name := range gaugeNames {
			for k, v := range m.series(name) {
				got[k] = v
			}
		}
		var diffs []string
		for k, v := range before.series {
			if g, ok := got[k]; !ok || g != v {
				diffs = append(diffs, fmt.Sprintf("%s: exposed %v (present %v), database %v", k, g, ok, v))
			}
		}
		for k, v := range got {
			if _, ok := before.series[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: exposed %v, not in the database", k, v))
			}
		}
		age := m.value("harmonia_ci_oldest_ready_job_age_seconds")
		if age < before.oldest-1 || age > after.oldest+1 {
			diffs = append(diffs, fmt.Sprintf("oldest ready job age %v, database %v…%v", age, before.oldest, after.oldest))
		}
		sort.Strings(diffs)
		last = strings.Join(diffs, "\n")
		return len(diffs) == 0
	})
	ok = true
	if c.queueState().series["harmonia_ci_build_jobs_ready"] == 0 {
		c.t.Errorf("no ready job when %s was compared: the queue gauges were checked at zero", id)
	}
}

// dbFacts are what the counters are checked against.
type dbFacts struct {
	succeeded, builtFailed, unsupported, depFailed, attempts, evalsSucceeded float64
}

func (c *forgeCluster) facts() dbFacts {
	c.t.Helper()
	var f dbFacts
	err := c.pool.QueryRow(context.Background(), `
SELECT count(*) FILTER (WHERE status = 'succeeded')::float8,
       count(*) FILTER (WHERE status = 'failed' AND attempt > 0)::float8,
       count(*) FILTER (WHERE status = 'failed' AND attempt = 0)::float8,
       count(*) FILTER (WHERE status = 'dep-failed')::float8,
       COALESCE(sum(attempt), 0)::float8,
       (SELECT count(*) FROM evaluations WHERE status = 'succeeded')::float8
FROM build_jobs`).Scan(&f.succeeded, &f.builtFailed, &f.unsupported, &f.depFailed, &f.attempts, &f.evalsSucceeded)
	if err != nil {
		c.t.Fatal(err)
	}
	return f
}

// checkCounters compares the nodes' counters with the database and Gitea. A counter moves just
// after the row it counts is written, so each comparison waits (with a deadline) to agree.
func (c *forgeCluster) checkCounters() {
	c.t.Helper()
	var last []string
	ok := false
	defer func() {
		if !ok {
			c.t.Logf("counters disagreeing with the database:\n%s", strings.Join(last, "\n"))
		}
	}()
	proctest.WaitFor(c.t, 30*time.Second, "the counters to agree with the database", func() bool {
		f := c.facts()
		front, ev, b1 := scrape(c.t, c.endpoint("front-1")), scrape(c.t, c.endpoint("eval-1")), scrape(c.t, c.endpoint("b1"))
		// Every commit evaluated (the pushes, and the head when the project was enabled).
		rows, err := c.pool.Query(context.Background(), `SELECT DISTINCT commit_sha FROM evaluations`)
		if err != nil {
			c.t.Fatal(err)
		}
		shas, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			c.t.Fatal(err)
		}
		statuses := 0
		for _, sha := range shas {
			statuses += len(c.statuses(sha))
		}
		last = nil
		check := func(what string, got, want float64) {
			if got != want {
				last = append(last, fmt.Sprintf("%s = %v, want %v", what, got, want))
			}
		}
		atLeast := func(what string, got, want float64) {
			if got < want {
				last = append(last, fmt.Sprintf("%s = %v, want at least %v", what, got, want))
			}
		}
		// The builder: every claimed job is one attempt; every success and failure it recorded.
		check("b1 claimed jobs", b1.sum("harmonia_ci_claimed_jobs_total"), f.attempts)
		atLeast("b1 claims", b1.value("harmonia_ci_claims_total"), 1)
		check("b1 claim latencies", b1.value("harmonia_ci_claim_duration_seconds"), b1.value("harmonia_ci_claims_total"))
		check("b1 successful build durations", b1.sum("harmonia_ci_build_duration_seconds", "result", "succeeded"), f.succeeded)
		check("b1 permanent failures", b1.value("harmonia_ci_build_failures_total", "kind", "permanent"), f.builtFailed)
		check("b1 failed build durations", b1.sum("harmonia_ci_build_duration_seconds", "result", "failed"),
			b1.value("harmonia_ci_build_failures_total", "kind", "permanent")+
				b1.value("harmonia_ci_build_failures_total", "kind", "transient")+
				b1.value("harmonia_ci_build_failures_total", "kind", "timeout"))
		for _, step := range []string{"fetch", "build", "upload", "sign"} {
			atLeast("b1 "+step+" steps", b1.value("harmonia_ci_build_step_seconds", "step", step), f.succeeded)
		}
		// The maintenance leader's failures, and the dependents of both.
		check("front-1 unsupported failures", front.value("harmonia_ci_build_failures_total", "kind", "unsupported"), f.unsupported)
		check("dep-failed jobs counted", b1.value("harmonia_ci_build_failures_total", "kind", "dep-failed")+
			front.value("harmonia_ci_build_failures_total", "kind", "dep-failed"), f.depFailed)
		// The evaluator.
		check("eval-1 succeeded evaluations", ev.value("harmonia_ci_evaluations_finished_total", "outcome", "succeeded"), f.evalsSucceeded)
		check("eval-1 succeeded evaluation durations", ev.value("harmonia_ci_evaluation_duration_seconds", "outcome", "succeeded"), f.evalsSucceeded)
		// The signer: one build-complete per success; what it published and granted.
		check("front-1 successful build-completes",
			front.value("harmonia_ci_signer_requests_total", "endpoint", "build-complete", "code", "2xx"), f.succeeded)
		atLeast("front-1 successful publishes", front.value("harmonia_ci_signer_requests_total", "endpoint", "publish", "code", "2xx"), 2)
		atLeast("front-1 narinfos written", front.value("harmonia_ci_signer_narinfos_total", "result", "written"), f.succeeded)
		for _, kind := range []string{"nar", "log", "drv"} {
			atLeast("front-1 "+kind+" upload bytes", front.value("harmonia_ci_signer_upload_bytes_total", "kind", kind), 1)
		}
		atLeast("front-1 NAR bytes sent", front.value("harmonia_ci_cache_response_bytes_total", "kind", "nar"), 1)
		// The forge side: both pushes were delivered; every status Gitea holds is one call.
		atLeast("front-1 accepted pushes",
			front.value("harmonia_ci_webhook_deliveries_total", "forge", "gitea", "event", "push", "result", "accepted"), 2)
		check("front-1 commit status calls", front.value("harmonia_ci_commit_status_calls_total", "forge", "gitea", "result", "ok"), float64(statuses))
		check("front-1 failed commit status calls", front.value("harmonia_ci_commit_status_calls_total", "forge", "gitea", "result", "error"), 0)
		check("front-1 timed commit status calls", front.value("harmonia_ci_commit_status_call_duration_seconds", "forge", "gitea"), float64(statuses))
		check("front-1 maintenance leadership", front.value("harmonia_ci_leader_is_leader", "role", "maintenance"), 1)
		return len(last) == 0
	})
	ok = true
}

// metricSet is one scrape: metric families by name.
type metricSet map[string]*dto.MetricFamily

// scrape reads and parses endpoint's /metrics.
func scrape(t *testing.T, endpoint string) metricSet {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(strings.TrimRight(endpoint, "/") + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s", endpoint, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse the metrics of %s: %v", endpoint, err)
	}
	return mfs
}

func (m metricSet) has(name string) bool {
	mf, ok := m[name]
	return ok && len(mf.GetMetric()) > 0
}

// sum adds the values of name's series whose labels include the label pairs: a counter's or
// gauge's value, a histogram's sample count.
func (m metricSet) sum(name string, pairs ...string) float64 {
	var total float64
	for _, s := range m[name].GetMetric() {
		if matches(s, pairs) {
			total += sampleValue(s)
		}
	}
	return total
}

// value is sum for a selection of exactly one series (NaN if there is none).
func (m metricSet) value(name string, pairs ...string) float64 {
	n := 0
	for _, s := range m[name].GetMetric() {
		if matches(s, pairs) {
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return m.sum(name, pairs...)
}

// series returns name's series in the exposition format (labels sorted by name) → value.
func (m metricSet) series(name string) map[string]float64 {
	out := map[string]float64{}
	for _, s := range m[name].GetMetric() {
		var labels []string
		for _, l := range s.GetLabel() {
			labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		sort.Strings(labels)
		k := name
		if len(labels) > 0 {
			k += "{" + strings.Join(labels, ",") + "}"
		}
		out[k] = sampleValue(s)
	}
	return out
}

func matches(s *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range s.GetLabel() {
			if l.GetName() == pairs[i] && l.GetValue() == pairs[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func sampleValue(s *dto.Metric) float64 {
	switch {
	case s.GetCounter() != nil:
		return s.GetCounter().GetValue()
	case s.GetGauge() != nil:
		return s.GetGauge().GetValue()
	case s.GetHistogram() != nil:
		return float64(s.GetHistogram().GetSampleCount())
	case s.GetUntyped() != nil:
		return s.GetUntyped().GetValue()
	}
	return math.NaN()
}

// checkGC asks for a collection with harmonia-ci gc and compares the garbage collector's
// series on front-1 with its gc_runs rows.
func (c *forgeCluster) checkGC(before metricSet) {
	c.t.Helper()
	c.cli.ok("gc")
	after := scrape(c.t, c.endpoint("front-1"))
	runs := func(m metricSet) float64 { return m.value("harmonia_ci_gc_runs_total", "result", "succeeded") }
	if n := runs(after) - runs(before); n != 1 {
		c.t.Errorf("harmonia-ci gc ran one collection; harmonia_ci_gc_runs_total{result=succeeded} grew by %v", n)
	}
	var last float64
	if err := c.pool.QueryRow(context.Background(), `SELECT EXTRACT(EPOCH FROM max(finished_at))::float8
		FROM gc_runs WHERE status = 'succeeded'`).Scan(&last); err != nil {
		c.t.Fatal(err)
	}
	if got := after.value("harmonia_ci_gc_last_success_timestamp_seconds"); got != last {
		c.t.Errorf("harmonia_ci_gc_last_success_timestamp_seconds = %v, gc_runs says %v", got, last)
	}
	if got := after.value("harmonia_ci_gc_scanned_objects_total") - before.value("harmonia_ci_gc_scanned_objects_total"); got <= 0 {
		c.t.Errorf("the collection scanned %v objects of a cache that holds builds", got)
	}
}
