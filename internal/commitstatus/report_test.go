package commitstatus

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/harmonia-ci/harmonia-ci/internal/evaluation"
	"github.com/harmonia-ci/harmonia-ci/internal/forge"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

const testBase = "https://ci.example"

var testLinks = Links{Base: testBase}

func ptr[T any](v T) *T { return &v }

func TestCompute(t *testing.T) {
	t.Parallel()
	const evalURL = testBase + "/ci/proj/eval/7"
	tests := []struct {
		name      string
		s         evalState
		want      Report
		wantFinal bool
	}{
		{
			name: "queued",
			s:    evalState{Status: status.EvalQueued},
			want: Report{Eval: Line{forge.StatePending, "queued", evalURL}},
		},
		{
			name: "running",
			s:    evalState{Status: status.EvalRunning},
			want: Report{Eval: Line{forge.StatePending, "evaluating", evalURL}},
		},
		{
			name: "large evaluations report progress in fiftieths",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 5000, Total: 5000, Succeeded: 342, Failed: 30, Pending: 4628},
			want: Report{Eval: Line{forge.StateSuccess, "evaluated 5000 attributes", evalURL},
				Build: Line{forge.StatePending, "300/5000 builds complete, some failed", evalURL}},
		},
		{
			name: "large evaluations: failures in fiftieths too",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 5000, Total: 5000, Succeeded: 342, Failed: 250, Pending: 4408},
			want: Report{Eval: Line{forge.StateSuccess, "evaluated 5000 attributes", evalURL},
				Build: Line{forge.StatePending, "500/5000 builds complete, 200 failed", evalURL}},
		},
		{
			name: "running again after builds were reported: nix-build waits",
			s:    evalState{Status: status.EvalRunning, LastStatus: ptr(`{"eval":{"state":"success"},"build":{"state":"success","description":"3/3 builds complete"}}`)},
			want: Report{Eval: Line{forge.StatePending, "evaluating", evalURL}, Build: Line{forge.StatePending, "waiting for the evaluation", evalURL}},
		},
		{
			name:      "failed: the error's first line",
			s:         evalState{Status: status.EvalFailed, Error: "error: attribute 'foo' missing\n\n       at /nix/store/x/flake.nix:3:5"},
			want:      Report{Eval: Line{forge.StateFailure, "evaluation failed: error: attribute 'foo' missing", evalURL}},
			wantFinal: true,
		},
		{
			name:      "failed: the error's first line that says something",
			s:         evalState{Status: status.EvalFailed, Error: "\n  error: flake has no outputs\n"},
			want:      Report{Eval: Line{forge.StateFailure, "evaluation failed: error: flake has no outputs", evalURL}},
			wantFinal: true,
		},
		{
			name:      "failed: a long error is cut to 120 bytes",
			s:         evalState{Status: status.EvalFailed, Error: strings.Repeat("x", 300)},
			want:      Report{Eval: Line{forge.StateFailure, "evaluation failed: " + strings.Repeat("x", 98) + "...", evalURL}},
			wantFinal: true,
		},
		{
			name:      "cancelled: superseded",
			s:         evalState{Status: status.EvalCancelled, Error: "superseded by evaluation 8"},
			want:      Report{Eval: Line{forge.StateError, "superseded by a newer commit", evalURL}},
			wantFinal: true,
		},
		{
			name:      "cancelled: a pull request that conflicts with its base",
			s:         evalState{Status: status.EvalCancelled, Error: evaluation.ConflictPrefix + "main and the pull request conflict in ci.nix"},
			want:      Report{Eval: Line{forge.StateError, "merge conflict: main and the pull request conflict in ci.nix", evalURL}},
			wantFinal: true,
		},
		{
			name:      "cancelled by hand",
			s:         evalState{Status: status.EvalCancelled, Error: "cancelled by alice"},
			want:      Report{Eval: Line{forge.StateError, "cancelled", evalURL}},
			wantFinal: true,
		},
		{
			name:      "cancelled without a reason",
			s:         evalState{Status: status.EvalCancelled},
			want:      Report{Eval: Line{forge.StateError, "cancelled", evalURL}},
			wantFinal: true,
		},
		{
			name: "succeeded with attribute errors",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 5, AttrErrors: 2, Total: 3, Succeeded: 1, Pending: 2},
			want: Report{
				Eval:  Line{forge.StateFailure, "2 of 5 attributes failed to evaluate", evalURL},
				Build: Line{forge.StatePending, "1/3 builds complete", evalURL},
			},
		},
		{
			name: "skipped: reuses an evaluation of the same tree",
			s:    evalState{Status: status.EvalSkipped, ReusesEval: ptr(int64(3)), Attrs: 1, Total: 1, Succeeded: 1},
			want: Report{
				Eval:  Line{forge.StateSuccess, "same tree as evaluation 3: 1 attribute", evalURL},
				Build: Line{forge.StateSuccess, "1/1 builds complete", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "skipped without a reused evaluation",
			s:    evalState{Status: status.EvalSkipped, Attrs: 2, Total: 2, Succeeded: 2},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 2 attributes", evalURL},
				Build: Line{forge.StateSuccess, "2/2 builds complete", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "succeeded with nothing to build",
			s:    evalState{Status: status.EvalSucceeded},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 0 attributes", evalURL},
				Build: Line{forge.StateSuccess, "nothing to build", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "builds pending",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 42, Total: 42, Succeeded: 3, Pending: 39},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 42 attributes", evalURL},
				Build: Line{forge.StatePending, "3/42 builds complete", evalURL},
			},
		},
		{
			name: "builds pending, one failed",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 42, Total: 42, Succeeded: 2, Failed: 1, Pending: 39, FirstFailedJob: 9},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 42 attributes", evalURL},
				Build: Line{forge.StatePending, "3/42 builds complete, 1 failed", evalURL},
			},
		},
		{
			name: "all builds succeeded",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 42, Total: 42, Succeeded: 42},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 42 attributes", evalURL},
				Build: Line{forge.StateSuccess, "42/42 builds complete", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "builds failed: links the first failed build",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 42, Total: 42, Succeeded: 39, Failed: 2, Cancelled: 1, FirstFailedJob: 99},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 42 attributes", evalURL},
				Build: Line{forge.StateFailure, "2/42 builds failed", testBase + "/ci/proj/build/99"},
			},
			wantFinal: true,
		},
		{
			name: "builds failed: says what is newly failing and fixed",
			s: evalState{Status: status.EvalSucceeded, Attrs: 42, Total: 42, Succeeded: 40, Failed: 2, FirstFailedJob: 99,
				NewlyFailing: 2, NewlyFixed: 1},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 42 attributes", evalURL},
				Build: Line{forge.StateFailure, "2/42 builds failed (2 newly failing, 1 fixed)", testBase + "/ci/proj/build/99"},
			},
			wantFinal: true,
		},
		{
			name: "builds complete: says what was fixed",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 3, Total: 3, Succeeded: 3, NewlyFixed: 1},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 3 attributes", evalURL},
				Build: Line{forge.StateSuccess, "3/3 builds complete (1 fixed)", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "builds complete: names the flaky ones",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 3, Total: 3, Succeeded: 3, NewlyFixed: 1, Flaky: 1},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 3 attributes", evalURL},
				Build: Line{forge.StateSuccess, "3/3 builds complete (1 fixed, 1 flaky)", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "a build failure waiting for its retry is pending, not red",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 2, Total: 2, Succeeded: 1, Pending: 1},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 2 attributes", evalURL},
				Build: Line{forge.StatePending, "1/2 builds complete", evalURL},
			},
		},
		{
			name: "builds failed without a known job: links the evaluation",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 1, Total: 1, Failed: 1},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 1 attribute", evalURL},
				Build: Line{forge.StateFailure, "1/1 builds failed", evalURL},
			},
			wantFinal: true,
		},
		{
			name: "builds cancelled",
			s:    evalState{Status: status.EvalSucceeded, Attrs: 3, Total: 3, Succeeded: 1, Cancelled: 2},
			want: Report{
				Eval:  Line{forge.StateSuccess, "evaluated 3 attributes", evalURL},
				Build: Line{forge.StateError, "2/3 builds cancelled", evalURL},
			},
			wantFinal: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.s.ID, tt.s.Project = 7, "proj"
			got := compute(tt.s, testLinks)
			if got != tt.want {
				t.Errorf("compute:\n got %+v\nwant %+v", got, tt.want)
			}
			if got.Final() != tt.wantFinal {
				t.Errorf("Final() = %v, want %v", got.Final(), tt.wantFinal)
			}
			for _, l := range got.lines() {
				if n := len(l.line.Description); n > 120 {
					t.Errorf("%s description is %d bytes, want at most 120", l.context, n)
				}
			}
			enc := got.encode()
			if back := decodeReport(&enc); back != got {
				t.Errorf("decode(encode) = %+v, want %+v (encoded %s)", back, got, enc)
			}
		})
	}
}

// A long error cut in the middle of a multi-byte character still gives valid UTF-8: forges
// reject or mangle descriptions that are not.
func TestComputeCutsOnCharacterBoundary(t *testing.T) {
	t.Parallel()
	for pad := range 4 {
		s := evalState{ID: 1, Project: "p", Status: status.EvalFailed, Error: strings.Repeat("x", pad) + strings.Repeat("é", 100)}
		d := compute(s, testLinks).Eval.Description
		if !utf8.ValidString(d) || len(d) > 120 || !strings.HasSuffix(d, "...") {
			t.Errorf("pad %d: description %q (%d bytes): want valid UTF-8 of at most 120 bytes ending in ...", pad, d, len(d))
		}
	}
}

func TestLinks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, project, eval, build string
	}{
		{"plain", "proj", testBase + "/ci/proj/eval/12", testBase + "/ci/proj/build/34"},
		{"escaped", "a b/c", testBase + "/ci/a%20b%2Fc/eval/12", testBase + "/ci/a%20b%2Fc/build/34"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := testLinks.Eval(tt.project, 12); got != tt.eval {
				t.Errorf("Eval = %q, want %q", got, tt.eval)
			}
			if got := testLinks.Build(tt.project, 34); got != tt.build {
				t.Errorf("Build = %q, want %q", got, tt.build)
			}
		})
	}
}

func TestReportFinal(t *testing.T) {
	t.Parallel()
	line := func(s forge.State) Line { return Line{State: s, Description: "d", TargetURL: "u"} }
	tests := []struct {
		name string
		r    Report
		want bool
	}{
		{"nothing yet", Report{}, false},
		{"evaluation pending", Report{Eval: line(forge.StatePending)}, false},
		{"evaluation failed, no builds line", Report{Eval: line(forge.StateFailure)}, true},
		{"evaluation cancelled", Report{Eval: line(forge.StateError)}, true},
		{"evaluated, builds pending", Report{Eval: line(forge.StateSuccess), Build: line(forge.StatePending)}, false},
		{"evaluated, builds succeeded", Report{Eval: line(forge.StateSuccess), Build: line(forge.StateSuccess)}, true},
		{"evaluated, builds failed", Report{Eval: line(forge.StateSuccess), Build: line(forge.StateFailure)}, true},
		{"evaluated, builds cancelled", Report{Eval: line(forge.StateSuccess), Build: line(forge.StateError)}, true},
		{"attribute errors, builds pending", Report{Eval: line(forge.StateFailure), Build: line(forge.StatePending)}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Final(); got != tt.want {
				t.Errorf("Final() = %v, want %v", got, tt.want)
			}
		})
	}
}

// The encoding is what evaluations.last_status holds and what the deduplicating UPDATE
// compares as text: it must be stable.
func TestReportEncoding(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		r    Report
		want string
	}{
		{"empty", Report{}, `{"eval":{},"build":{}}`},
		{
			"eval only",
			Report{Eval: Line{forge.StatePending, "queued", "https://ci/e/1"}},
			`{"eval":{"state":"pending","description":"queued","url":"https://ci/e/1"},"build":{}}`,
		},
		{
			"both",
			Report{
				Eval:  Line{forge.StateSuccess, "evaluated 2 attributes", "https://ci/e/1"},
				Build: Line{forge.StateFailure, "1/2 builds failed", "https://ci/b/5"},
			},
			`{"eval":{"state":"success","description":"evaluated 2 attributes","url":"https://ci/e/1"},` +
				`"build":{"state":"failure","description":"1/2 builds failed","url":"https://ci/b/5"}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.r.encode()
			if got != tt.want {
				t.Errorf("encode = %s, want %s", got, tt.want)
			}
			if back := decodeReport(&got); back != tt.r {
				t.Errorf("decode(encode) = %+v, want %+v", back, tt.r)
			}
		})
	}
}

func TestDecodeReportNothing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		s    *string
	}{
		{"NULL", nil},
		{"malformed", ptr("{not json")},
		{"empty object", ptr("{}")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decodeReport(tt.s); got != (Report{}) {
				t.Errorf("decodeReport = %+v, want the empty report", got)
			}
		})
	}
}
