package nixgen_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/nixgen"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
)

// TestDeep instantiates Deep with real Nix into a chroot store: the leaves come first in name
// order (the walk's order), and spine is the top of a chain of exactly chain links.
func TestDeep(t *testing.T) {
	nixtest.RequireNix(t)
	tests := []struct {
		name          string
		leaves, chain int
	}{
		{"leaves and a chain", 3, 4},
		{"a chain alone", 0, 2},
		{"leaves alone", 2, 0},
		{"four-digit leaves", 1001, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			file := filepath.Join(dir, "deep.nix")
			if err := os.WriteFile(file, []byte(nixgen.Deep("test-"+tt.name, tt.leaves, tt.chain, 0.5)), 0o644); err != nil {
				t.Fatal(err)
			}
			store := filepath.Join(dir, "store")
			nixOut := func(tool string, args ...string) string {
				t.Helper()
				args = append([]string{"--store", store, "--option", "substituters", "", "--option", "build-users-group", ""}, args...)
				cmd := exec.Command(tool, args...)
				cmd.Env = append(os.Environ(), "HOME="+dir)
				out, err := cmd.Output()
				if err != nil {
					var stderr []byte
					if ee, ok := err.(*exec.ExitError); ok {
						stderr = ee.Stderr
					}
					t.Fatalf("%s %s: %v: %s", tool, strings.Join(args, " "), err, stderr)
				}
				return string(out)
			}

			var names []string
			if err := json.Unmarshal([]byte(nixOut("nix-instantiate", "--eval", "--strict", "--json", "-E",
				fmt.Sprintf("builtins.attrNames (import %s)", file))), &names); err != nil {
				t.Fatal(err)
			}
			var want []string
			digits := max(3, len(strconv.Itoa(max(tt.leaves, tt.chain)-1)))
			for i := range tt.leaves {
				want = append(want, fmt.Sprintf("leaf-%0*d", digits, i))
			}
			if tt.chain > 0 {
				want = append(want, "spine")
			}
			if !slices.Equal(names, want) {
				t.Errorf("attributes %v…, want %v… (%d, want %d)", names[:min(len(names), 5)], want[:min(len(want), 5)], len(names), len(want))
			}
			if tt.chain == 0 {
				return
			}

			top := strings.TrimSpace(nixOut("nix-instantiate", file, "-A", "spine"))
			var links int
			for p := range strings.FieldsSeq(nixOut("nix-store", "--query", "--requisites", top)) {
				if strings.Contains(p, "-spine-") && strings.HasSuffix(p, ".drv") {
					links++
				}
			}
			if links != tt.chain {
				t.Errorf("the spine's closure holds %d links, want %d", links, tt.chain)
			}
			var inputs []string
			for p := range strings.FieldsSeq(nixOut("nix-store", "--query", "--references", top)) {
				if strings.HasSuffix(p, ".drv") {
					inputs = append(inputs, p)
				}
			}
			wantInputs := 0
			if tt.chain > 1 {
				wantInputs = 1
			}
			if len(inputs) != wantInputs || (wantInputs == 1 && !strings.HasSuffix(inputs[0], fmt.Sprintf("-spine-%0*d.drv", digits, tt.chain-2))) {
				t.Errorf("the top link's input derivations %v, want the link before it", inputs)
			}
		})
	}
}
