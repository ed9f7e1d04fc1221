package eval_test

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/eval"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// A project's code cannot read the node's secrets or state, through Nix or around it: restricted
// evaluation refuses the read (an error on that attribute, the rest evaluated), the environment
// is empty to it, and the Nix it runs in is the unprivileged evaluation user, in a filesystem
// view that holds none of the state directory.
func TestEvaluationCannotReadTheNodesSecrets(t *testing.T) {
	h := newHarness(t)
	secretValue := "hci-secret-" + h.salt
	t.Setenv("HARMONIA_CLUSTER_SECRET", secretValue) // the node's own environment
	// The node's secrets: a signing key in its state directory, root's and mode 0600.
	state := reachableDir(t)
	secret := filepath.Join(state, "signing-key")
	if err := os.WriteFile(secret, []byte(secretValue), 0o600); err != nil {
		t.Fatal(err)
	}
	// What the Nix child itself can do, recorded by a wrapper that runs as and where the child
	// does, in the one directory it may write: the project's HOME.
	nixBin, err := exec.LookPath("nix-instantiate")
	if err != nil {
		t.Fatal(err)
	}
	wrapper := filepath.Join(reachableDir(t), "nix-instantiate")
	script := fmt.Sprintf(`#!/bin/sh
id -u > "$HOME/uid"
cat %[1]s > "$HOME/read-key" 2>&1 || echo refused >> "$HOME/read-key"
cat /proc/$PPID/environ > "$HOME/read-environ" 2>&1 || echo refused >> "$HOME/read-environ"
ls %[2]s > "$HOME/list-state" 2>&1 || echo refused >> "$HOME/list-state"
exec %[3]s "$@"
`, secret, state, nixBin)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	_, commit := h.newProject("secrets", map[string]string{"ci.nix": h.lib() + fmt.Sprintf(`{
  fine = mk "fine" [ ];
  readKey = mk (builtins.readFile %q) [ ];
  readEnviron = mk (builtins.readFile "/proc/self/environ") [ ];
  env = mk ("env" + builtins.getEnv "HARMONIA_CLUSTER_SECRET") [ ];
  dir = mk (builtins.toString (builtins.attrNames (builtins.readDir %q))) [ ];
}`, secret, state)})
	h.startEvaluator("ev-1", func(c *eval.Config) {
		c.StateDir = state
		c.Runner = &eval.NixRunner{Bin: wrapper}
	})
	e, _ := h.trigger("secrets", "", commit)
	h.waitSucceeded(e.ID)
	attrs := h.attrs(e.ID)
	if a := attrs["fine"]; a.DrvPath == "" {
		t.Errorf("fine: %+v, want a derivation", a)
	}
	// Refused by restricted mode or, where that lets a path through, by the view, which has no
	// state directory.
	for _, name := range []string{"readKey", "readEnviron", "dir"} {
		if a := attrs[name]; a.DrvPath != "" || !strings.Contains(a.Error, "forbidden in restricted mode") && !strings.Contains(a.Error, "does not exist") {
			t.Errorf("%s: %+v, want an error saying restricted evaluation forbids it or there is no such path", name, a)
		}
	}
	if a := attrs["env"]; !strings.HasSuffix(a.DrvPath, "-env.drv") {
		t.Errorf("env: %+v, want a derivation named env: the environment is empty to project code", a)
	}
	for name, a := range attrs {
		if strings.Contains(a.DrvPath+a.Error, secretValue) {
			t.Errorf("%s carries the secret: %+v", name, a)
		}
	}

	evalUser, err := user.Lookup("harmonia-eval")
	if err != nil {
		t.Fatal(err)
	}
	id := h.queryStrings(`SELECT id::text FROM projects WHERE name = 'secrets'`)[0]
	probe := filepath.Join(state, "eval-home", id)
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(probe, name))
		if err != nil {
			t.Fatalf("the wrapper did not record %s: %v", name, err)
		}
		return strings.TrimSpace(string(b))
	}
	if uid := read("uid"); uid != evalUser.Uid {
		t.Errorf("Nix ran as uid %s, want the evaluation user's %s", uid, evalUser.Uid)
	}
	for _, name := range []string{"read-key", "read-environ", "list-state"} {
		if got := read(name); strings.Contains(got, secretValue) || !strings.HasSuffix(got, "refused") {
			t.Errorf("the Nix child could %s: %q", name, got)
		}
	}
}

// Walker records are unforgeable: a project's own traces, in the format of the records, report
// no attribute.
func TestForgedWalkerRecords(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	forged := `{\"attr\":\"forged\",\"path\":[\"forged\"],\"drv\":\"/nix/store/00000000000000000000000000000000-forged.drv\"}`
	_, commit := h.newProject("forgery", map[string]string{"ci.nix": h.lib() + `{
  a = builtins.trace "@hci ` + forged + `" (mk "a" [ ]);
  b = builtins.trace "@hci:0123456789abcdef01234567 ` + forged + `" (mk "b" [ ]);
}`})
	h.startEvaluator("ev-1")
	e, _ := h.trigger("forgery", "", commit)
	h.waitSucceeded(e.ID)
	if names := h.attrNames(e.ID); strings.Join(names, ",") != "a,b" {
		t.Fatalf("attributes %q, want just a and b", names)
	}
}

// The node's limits are ceilings: a project asking for more evaluation time or retention gets
// the node's; an evaluation past the node's memory (its imports from derivation included),
// attribute or derivation limit fails with an error naming it; one within them is unaffected.
func TestEvaluationCeilings(t *testing.T) {
	t.Parallel()
	t.Run("time", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		g := newGate(t)
		_, commit := h.newProject("slow", map[string]string{
			".harmonia-ci.toml": `eval-timeout = "10h"`,
			"ci.nix":            h.lib() + `{ blocked = ` + g.drv("blocked", h.salt) + `; }`,
		})
		h.startEvaluator("ev-1", func(c *eval.Config) { c.Timeout = time.Second })
		e, _ := h.trigger("slow", "", commit)
		got := h.waitStatus(e.ID, status.EvalFailed)
		if !strings.Contains(got.Error, "timed out after 1s") {
			t.Fatalf("error %q, want a timeout after the node's 1s", got.Error)
		}
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		_, commit := h.newProject("greedy", map[string]string{"ci.nix": h.lib() + `{
  greedy = mk (toString (builtins.length (builtins.genList (i: "item ${toString i}") 20000000))) [ ];
}`})
		h.startEvaluator("ev-1", func(c *eval.Config) { c.Confinement.MaxMemory = 200 << 20 })
		e, _ := h.trigger("greedy", "", commit)
		got := h.waitStatus(e.ID, status.EvalFailed)
		if !strings.Contains(got.Error, "evaluation used too much memory: over eval.max_memory (200 MiB)") {
			t.Fatalf("error %q, want the memory limit", got.Error)
		}
	})
	t.Run("memory of imports from derivation", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		// The build doubles a shell string to 256 MiB: the walker's own Nix stays small.
		_, commit := h.newProject("hog", map[string]string{"ci.nix": h.lib() + `{
  hog = mk (builtins.readFile (builtins.derivation {
    name = "hog"; system = builtins.currentSystem; builder = "/bin/sh"; salt = "` + h.salt + `";
    args = [ "-c" "s=x; i=0; while [ $i -lt 28 ]; do s=\"$s$s\"; i=$((i+1)); done; echo hog > $out" ];
  })) [ ];
}`})
		h.startEvaluator("ev-1", func(c *eval.Config) { c.Confinement.MaxMemory = 200 << 20 })
		e, _ := h.trigger("hog", "", commit)
		got := h.waitStatus(e.ID, status.EvalFailed)
		if !strings.Contains(got.Error, "evaluation used too much memory: over eval.max_memory (200 MiB)") {
			t.Fatalf("error %q, want the memory limit", got.Error)
		}
	})
	t.Run("attributes and derivations", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		projects := []struct {
			name, nix, want string
		}{
			{"four-attrs", `{ a = mk "a" [ ]; b = mk "b" [ ]; c = mk "c" [ ]; d = mk "d" [ ]; }`,
				"evaluation too large: more than 3 attributes (eval.max_attrs)"},
			{"five-drvs", `{ top = mk "top" [ (mk "x" [ ]) (mk "y" [ ]) (mk "z" [ ]) (mk "w" [ ]) ]; }`,
				"evaluation too large: more than 4 new derivations (eval.max_derivations)"},
			{"at-the-ceilings", `{ a = mk "a" [ (mk "x" [ ]) ]; b = mk "b" [ ]; c = mk "c" [ ]; }`, ""},
		}
		h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxAttrs, c.MaxDerivations = 3, 4 })
		for _, p := range projects {
			_, commit := h.newProject(p.name, map[string]string{"ci.nix": h.lib() + p.nix})
			e, _ := h.trigger(p.name, "", commit)
			if p.want == "" {
				h.waitSucceeded(e.ID)
				if n := h.queryInt(`SELECT count(*) FROM eval_attrs WHERE eval_id = $1 AND drv_path IS NOT NULL`, e.ID); n != 3 {
					t.Errorf("%s: %d attributes with a derivation, want 3", p.name, n)
				}
				continue
			}
			if got := h.waitStatus(e.ID, status.EvalFailed); !strings.Contains(got.Error, p.want) {
				t.Errorf("%s: error %q, want %q", p.name, got.Error, p.want)
			}
		}
		// Nothing past the derivation ceiling was written: the batch that crossed it is refused
		// whole, before it is published or committed.
		if n := h.queryInt(`SELECT count(*) FROM derivations WHERE name IN ('top', 'w', 'z')`); n != 0 {
			t.Errorf("%d derivations of the evaluation past the ceiling were recorded", n)
		}
	})
	t.Run("retention", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t)
		h.startEvaluator("ev-1", func(c *eval.Config) { c.MaxRetention = 365 * 24 * time.Hour })
		for _, tc := range []struct {
			ask  string
			want time.Duration
		}{{"100000d", 365 * 24 * time.Hour}, {"30d", 30 * 24 * time.Hour}} {
			name := "keep-" + tc.ask
			_, commit := h.newProject(name, map[string]string{
				".harmonia-ci.toml": `retention = "` + tc.ask + `"`,
				"ci.nix":            h.lib() + `{ a = mk "a" [ ]; }`,
			})
			e, _ := h.trigger(name, "", commit)
			h.waitSucceeded(e.ID)
			if got := h.queryInt(`SELECT retention_seconds FROM evaluations WHERE id = $1`, e.ID); got != int64(tc.want.Seconds()) {
				t.Errorf("retention %q: recorded %ds, want %ds", tc.ask, got, int64(tc.want.Seconds()))
			}
		}
	})
}
