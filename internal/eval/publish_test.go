package eval_test

import (
	"strings"
	"testing"
)

// A source that refers to another source (a builtins.toFile naming a path literal) is published
// with everything it refers to: the cache serves the whole .drv closure, and the signer, which
// never publishes a reference the cache lacks, accepts it.
func TestSourcesArePublishedWithTheirClosure(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	_, commit := h.newProject("nested", map[string]string{
		"data.txt": "data of " + h.salt + "\n",
		"ci.nix": h.lib() + `{
  nested = builtins.derivation { name = "nested"; system = builtins.currentSystem; builder = "/bin/sh";
    args = [ "-c" "echo > $out" ]; wrapper = builtins.toFile "wrapper" "see ${./data.txt}"; };
}`,
	})
	h.startEvaluator("ev-1")
	e, _ := h.trigger("nested", "", commit)
	h.waitSucceeded(e.ID)
	drv := h.attrs(e.ID)["nested"].DrvPath
	if drv == "" {
		t.Fatalf("nested: %+v", h.attrs(e.ID)["nested"])
	}
	ni := h.narInfo(drv)
	var wrapper string
	for _, r := range ni.References {
		if strings.HasSuffix(r, "-wrapper") {
			wrapper = "/nix/store/" + r
		}
	}
	if wrapper == "" {
		t.Fatalf("the .drv's narinfo does not refer to the wrapper: %v", ni.References)
	}
	w := h.narInfo(wrapper)
	if len(w.References) != 1 || !strings.HasSuffix(w.References[0], "-data.txt") {
		t.Fatalf("the wrapper's references %v, want data.txt", w.References)
	}
	if d := h.narInfo("/nix/store/" + w.References[0]); !strings.HasPrefix(d.CA, "fixed:r:") {
		t.Fatalf("data.txt: CA %q, want a recursive source", d.CA)
	}
}
