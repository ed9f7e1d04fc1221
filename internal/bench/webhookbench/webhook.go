// Package webhookbench is `harmonia-ci bench webhook`: webhook deliveries accepted per second by
// one receiver, and the latency from a finished build to its commit status call.
package webhookbench

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/bench"
	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/commitstatus"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/notify"
	"github.com/harmonia-ci/harmonia-ci/internal/project"
	"github.com/harmonia-ci/harmonia-ci/internal/webhook"
)

// giteaPush is a push delivery as a real Gitea 1.26 sent it (internal/giteatest recorded it);
// the benchmark varies its commit and repository.
//
//go:embed testdata/gitea_push.json
var giteaPush []byte

// WebhookOptions configures `harmonia-ci bench webhook`.
type WebhookOptions struct {
	Deliveries  int // default 5000
	Concurrency int // concurrent senders; default 16
	Repos       int // repositories the pushes spread over; default 50
	Statuses    int // build notifications timed to their status call; default 500
	Logger      *slog.Logger
}

// WebhookReport is what the benchmark measured.
type WebhookReport struct {
	Date        string `json:"date"`
	Machine     string `json:"machine"`
	Postgres    string `json:"postgres"`
	Deliveries  int    `json:"deliveries"`
	Concurrency int    `json:"concurrency"`
	Repos       int    `json:"repos"`
	// DeliveriesPerSecond counts deliveries answered 202: signature checked, evaluation row
	// written (superseding the branch's previous one).
	DeliveriesPerSecond float64 `json:"deliveries_per_second"`
	DeliveryP50Ms       float64 `json:"delivery_p50_ms"`
	DeliveryP99Ms       float64 `json:"delivery_p99_ms"`
	// Status latency: from a terminal build notification's arrival to the status call leaving
	// the node, the debounce excluded.
	Statuses       int     `json:"statuses"`
	StatusP50Ms    float64 `json:"status_p50_ms"`
	StatusP99Ms    float64 `json:"status_p99_ms"`
	StatusMaxMs    float64 `json:"status_max_ms"`
	ForgeCalls     int64   `json:"forge_calls"`
	DuplicateCalls int64   `json:"duplicate_calls"`
}

func (o *WebhookOptions) defaults() {
	o.Deliveries = bench.Positive(o.Deliveries, 5000)
	o.Concurrency = bench.Positive(o.Concurrency, 16)
	o.Repos = bench.Positive(o.Repos, 50)
	o.Statuses = bench.Positive(o.Statuses, 500)
	o.Logger = bench.Logger(o.Logger)
}

const benchSecret = "bench-webhook-secret"

// Webhook measures the forge side of a frontend on a private PostgreSQL: deliveries accepted
// per second by one webhook receiver over loopback HTTP, and the latency from a build's
// terminal notification to its commit status call, against a forge that answers at once.
func Webhook(ctx context.Context, o WebhookOptions) (WebhookReport, error) {
	o.defaults()
	r := WebhookReport{
		Date: time.Now().UTC().Format(time.RFC3339), Deliveries: o.Deliveries, Concurrency: o.Concurrency, Repos: o.Repos,
		Machine: bench.Machine(),
	}
	dir, err := os.MkdirTemp("", "hci-bench-webhook-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // the embedded server runs as postgres when root
		return r, err
	}
	d, err := bench.OpenDatabase(ctx, bench.DatabaseOptions{URL: "", Dir: filepath.Join(dir, "pg"), MaxServerConns: 100, App: "harmonia-ci bench webhook", PoolConns: int32(o.Concurrency + 8), Logger: o.Logger})
	if err != nil {
		return r, err
	}
	defer d.Close()
	r.Postgres = d.Version

	// The forge: status calls answered 201 at once, counted.
	fs := &fakeStatusForge{seen: map[string]bool{}}
	forgeSrv, forgeURL, err := serve(http.HandlerFunc(fs.serveHTTP))
	if err != nil {
		return r, err
	}
	defer forgeSrv.Close()
	g, err := forge.NewGitea(forge.GiteaConfig{Name: "gitea", URL: forgeURL, Token: "bench", WebhookSecret: []byte(benchSecret)})
	if err != nil {
		return r, err
	}
	forges := forge.Set{"gitea": g}
	repos, err := benchProjects(ctx, d.Pool, o.Repos)
	if err != nil {
		return r, err
	}
	if err := deliveries(ctx, d.Pool, forges, repos, o, &r); err != nil {
		return r, err
	}
	if err := statusLatency(ctx, d.Pool, forges, o, fs, &r); err != nil {
		return r, err
	}
	return r, nil
}

// benchProjects records o.Repos enabled Gitea projects and returns their full names.
func benchProjects(ctx context.Context, pool *pgxpool.Pool, n int) ([]string, error) {
	var repos []forge.Repository
	for i := range n {
		repos = append(repos, forge.Repository{Repo: forge.Repo{Owner: "bench", Name: fmt.Sprintf("repo%d", i), ForgeID: int64(i + 1)},
			CloneURL: fmt.Sprintf("http://gitea.invalid/bench/repo%d.git", i), DefaultBranch: "main"})
	}
	if _, err := project.SyncRepositories(ctx, pool, "gitea", repos); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, sqlProjectsFromRepos); err != nil {
		return nil, err
	}
	names := make([]string, n)
	for i, rp := range repos {
		names[i] = rp.FullName()
	}
	return names, nil
}

// deliveries posts o.Deliveries signed pushes, o.Concurrency at a time.
func deliveries(ctx context.Context, pool *pgxpool.Pool, forges forge.Set, repos []string, o WebhookOptions, r *WebhookReport) error {
	mux := http.NewServeMux()
	webhook.New(webhook.Config{Forges: forges, Logger: o.Logger}, pool).Register(access.NewRoutes(mux, nil))
	srv, base, err := serve(mux)
	if err != nil {
		return err
	}
	defer srv.Close()
	var template map[string]any
	if err := json.Unmarshal(giteaPush, &template); err != nil {
		return fmt.Errorf("the recorded gitea push: %w", err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.Concurrency}}
	lat := make([]time.Duration, o.Deliveries)
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= o.Deliveries || ctx.Err() != nil {
					return
				}
				k := i % len(repos)
				body, h, err := pushDelivery(template, repos[k], int64(k+1), i)
				if err == nil {
					t0 := time.Now()
					err = post(ctx, client, fmt.Sprintf("%s/webhook/gitea/%d", base, k+1), body, h)
					lat[i] = time.Since(t0)
				}
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("delivery %d: %w", i, err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	elapsed := time.Since(start)
	var n int
	if err := pool.QueryRow(ctx, sqlEvalCount).Scan(&n); err != nil {
		return err
	}
	if n != o.Deliveries {
		return fmt.Errorf("%d deliveries made %d evaluations", o.Deliveries, n)
	}
	r.DeliveriesPerSecond = float64(o.Deliveries) / elapsed.Seconds()
	r.DeliveryP50Ms, r.DeliveryP99Ms = bench.PercentileMs(lat, 50), bench.PercentileMs(lat, 99)
	return nil
}

// pushDelivery makes delivery i: the recorded push, to repo (whose forge id is forgeID), with a
// new commit and delivery id, to a branch of its own (a new commit on a branch with another
// one's evaluation would ask the forge for the branch's head first).
func pushDelivery(template map[string]any, repo string, forgeID int64, i int) ([]byte, http.Header, error) {
	p := map[string]any{}
	for k, v := range template {
		p[k] = v
	}
	sha := fmt.Sprintf("%040x", i+1)
	p["after"] = sha
	p["ref"] = fmt.Sprintf("refs/heads/bench-%d", i)
	owner, name, _ := cutSlash(repo)
	rp, _ := p["repository"].(map[string]any)
	rc := map[string]any{}
	for k, v := range rp {
		rc[k] = v
	}
	rc["id"], rc["full_name"], rc["name"] = forgeID, repo, name
	rc["clone_url"] = "http://gitea.invalid/" + repo + ".git"
	rc["default_branch"] = "main"
	rc["owner"] = map[string]any{"login": owner, "username": owner}
	p["repository"] = rc
	body, err := json.Marshal(p)
	if err != nil {
		return nil, nil, err
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("X-Gitea-Event", "push")
	h.Set("X-Gitea-Event-Type", "push")
	h.Set("X-Gitea-Delivery", fmt.Sprintf("bench-%d-%s", i, bench.RandomHex(4)))
	h.Set("X-Gitea-Signature", forge.Sign(forge.RepositorySecret([]byte(benchSecret), forgeID), body))
	return body, h, nil
}

func cutSlash(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

func post(ctx context.Context, c *http.Client, url string, body []byte, h http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = h
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("answer %d: %s", resp.StatusCode, msg)
	}
	return nil
}

// statusLatency makes o.Statuses evaluations wait for one build each, finishes the builds one
// at a time with the notification the queue sends, and times each to its status call.
func statusLatency(ctx context.Context, pool *pgxpool.Pool, forges forge.Set, o WebhookOptions, fs *fakeStatusForge, r *WebhookReport) error {
	// One evaluation per build, succeeded, its build pending: the state in which a finished
	// build decides the commit's nix-build status.
	_, err := pool.Exec(ctx, sqlStatusFixture, o.Statuses)
	if err != nil {
		return fmt.Errorf("prepare the status benchmark: %w", err)
	}
	notifier := notify.New(notify.Config{}, pool, o.Logger, clock.Real{})
	if err := notifier.Start(ctx); err != nil {
		return err
	}
	defer notifier.Stop()
	var mu sync.Mutex
	var lat []time.Duration
	finals := make(chan struct{}, o.Statuses)
	rep := commitstatus.New(commitstatus.Config{
		NodeID: "bench", Forges: forges, Links: commitstatus.Links{Base: "http://ci.invalid"},
		Debounce: 0, Notifier: notifier, Logger: o.Logger,
		Observe: func(_ int64, s forge.Status, since time.Duration) {
			if s.Context != commitstatus.ContextBuild || s.State != forge.StateSuccess {
				return
			}
			mu.Lock()
			lat = append(lat, since)
			mu.Unlock()
			finals <- struct{}{}
		},
	}, pool)
	if err := rep.Start(ctx); err != nil {
		return err
	}
	defer rep.Stop()
	// The reporter reconciles at start: wait until every evaluation shows nix-build pending.
	if err := bench.WaitUntil(ctx, time.Minute, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, sqlPendingReportedCount).Scan(&n)
		return n == o.Statuses, err
	}); err != nil {
		return fmt.Errorf("initial statuses: %w", err)
	}
	rows, err := pool.Query(ctx, sqlBenchJobs)
	if err != nil {
		return err
	}
	var drvs []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return err
		}
		drvs = append(drvs, s)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, drv := range drvs {
		// Finished as a builder's finish and the announcer's batch do it.
		payload, _ := json.Marshal(map[string]any{"status": "succeeded", "drv_paths": []string{drv}})
		if _, err := pool.Exec(ctx, sqlJobSucceed, drv, string(payload)); err != nil {
			return err
		}
		select {
		case <-finals:
		case <-time.After(30 * time.Second):
			return errors.New("no status call within 30 s of a finished build")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.Statuses = len(lat)
	r.StatusP50Ms, r.StatusP99Ms, r.StatusMaxMs = bench.PercentileMs(lat, 50), bench.PercentileMs(lat, 99), bench.PercentileMs(lat, 100)
	r.ForgeCalls, r.DuplicateCalls = fs.calls.Load(), fs.duplicates.Load()
	return nil
}

// fakeStatusForge answers Gitea's status API at once and counts calls and exact repeats.
type fakeStatusForge struct {
	calls, duplicates atomic.Int64
	mu                sync.Mutex
	seen              map[string]bool
}

func (f *fakeStatusForge) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.calls.Add(1)
	key := r.URL.Path + " " + string(body)
	f.mu.Lock()
	if f.seen[key] {
		f.duplicates.Add(1)
	}
	f.seen[key] = true
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"id":1}`))
}

// serve runs h on a loopback listener.
func serve(h http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), nil
}
