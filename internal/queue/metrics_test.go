package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/queue"
	qt "github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

type timeoutErr struct{}

func (timeoutErr) Error() string { return "build timed out" }
func (timeoutErr) Timeout() bool { return true }

// TestWorkerMetrics: the worker counts its claims and claimed jobs, times every recorded
// attempt by system and result, and counts failures by kind, with the dependents a permanent
// failure marks dep-failed.
func TestWorkerMetrics(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	reg := prometheus.NewRegistry()
	handler := func(_ context.Context, j queue.Job) queue.Result {
		switch {
		case strings.Contains(j.DrvPath, "-bad"):
			return queue.Result{Err: errors.New("builder said no"), Kind: queue.Permanent}
		case strings.Contains(j.DrvPath, "-slow"):
			return queue.Result{Err: timeoutErr{}, Kind: queue.Permanent}
		}
		return queue.Result{}
	}
	startWorker(t, pool, queue.WorkerConfig{
		Claimer: claimer("metrics"), MaxJobs: 2, PollInterval: 50 * time.Millisecond, Handler: handler,
		Registerer: reg,
	})
	qt.Enqueue(t, pool, nil, qt.Drv("good", sys), qt.Drv("bad", sys), qt.Drv("above-bad", sys, "bad"),
		qt.Drv("slow", sys))
	done := func() bool {
		return qt.Status(t, pool, "good") == status.JobSucceeded && qt.Status(t, pool, "above-bad") == status.JobDepFailed &&
			qt.Status(t, pool, "slow") == status.JobFailed
	}
	qt.WaitFor(t, 20*time.Second, done, "the jobs to finish")
	qt.WaitFor(t, 5*time.Second, func() bool {
		return failures(t, reg, "timeout") == 1
	}, "the last failure to be counted")

	want := map[string]float64{"permanent": 1, "timeout": 1, "dep-failed": 1, "transient": 0}
	for kind, n := range want {
		if got := failures(t, reg, kind); got != n {
			t.Errorf("harmonia_ci_build_failures_total{kind=%q} = %v, want %v", kind, got, n)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	var claimed, claims float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "harmonia_ci_build_duration_seconds":
				for _, l := range m.GetLabel() {
					if l.GetName() == "result" {
						counts[l.GetValue()] = m.GetHistogram().GetSampleCount()
					}
				}
			case "harmonia_ci_claimed_jobs_total":
				claimed += m.GetCounter().GetValue()
			case "harmonia_ci_claims_total":
				claims = m.GetCounter().GetValue()
			}
		}
	}
	if counts["succeeded"] != 1 || counts["failed"] != 2 {
		t.Errorf("harmonia_ci_build_duration_seconds sample counts by result = %v, want succeeded 1, failed 2", counts)
	}
	if claimed != 3 {
		t.Errorf("harmonia_ci_claimed_jobs_total = %v, want 3 (the dep-failed job is never claimed)", claimed)
	}
	if claims < 1 {
		t.Errorf("harmonia_ci_claims_total = %v, want at least 1", claims)
	}
}

// failures is the value of the failure counter of kind, found by gathering reg.
func failures(t *testing.T, reg *prometheus.Registry, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "harmonia_ci_build_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == kind {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no harmonia_ci_build_failures_total{kind=%q}", kind)
	return 0
}
