package signer

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/signerapi"
	"github.com/harmonia-ci/harmonia-ci/internal/substitute"
)

// testDrvs are the .drv texts drvText made, by store path: the inputs of later ones.
var testDrvs sync.Map

// testDrvHash is the derivation hash of a .drv drvText made.
func testDrvHash(p string) (nix.DrvHash, error) {
	text, ok := testDrvs.Load(p)
	if !ok {
		return nix.DrvHash{}, fmt.Errorf("no test derivation %s", p)
	}
	d, err := nix.ParseDerivation([]byte(text.(string)))
	if err != nil {
		return nix.DrvHash{}, err
	}
	return d.Hash(p, testDrvHash)
}

// drvText is the ATerm of a derivation called name, as Nix writes it: one output, at the path
// its text and its inputs (earlier drvText results) give.
func drvText(name string, inputDrvs []string, srcs []string) string {
	d := &nix.Derivation{Outputs: map[string]nix.DerivationOutput{"out": {}}, InputDrvs: map[string][]string{},
		InputSrcs: slices.Clone(srcs), Platform: system, Builder: "/bin/sh", Args: []string{"-c", "echo " + name + " > $out"},
		Env: map[string]string{"builder": "/bin/sh", "name": name, "out": "", "system": system}}
	for _, in := range inputDrvs {
		d.InputDrvs[in] = []string{"out"}
	}
	outs, err := d.OutputPaths(name, testDrvHash)
	if err != nil {
		panic(err)
	}
	d.Outputs["out"] = nix.DerivationOutput{Path: outs["out"]}
	d.Env["out"] = outs["out"]
	return string(d.Unparse())
}

// derivation is the .drv file of drvText at its true store path.
func derivation(t *testing.T, name string, inputDrvs []string, srcs []string) signerapi.DerivationText {
	t.Helper()
	text := drvText(name, inputDrvs, srcs)
	path, _, err := nix.DerivationPath(name+".drv", []byte(text))
	if err != nil {
		t.Fatalf("derivation %s: %v\n%s", name, err, text)
	}
	testDrvs.Store(path, text)
	return signerapi.DerivationText{StorePath: path, Text: text}
}

// checkDrvNarInfo asserts that the cache serves d as Nix would have it: signed, content-addressed
// as text, referring to its inputs, with the NAR of its text.
func (e *env) checkDrvNarInfo(t *testing.T, d signerapi.DerivationText) {
	t.Helper()
	ni, ok := e.narInfo(t, d.StorePath)
	if !ok {
		t.Fatalf("no narinfo for %s", d.StorePath)
	}
	parsed, err := nix.ParseDerivation([]byte(d.Text))
	if err != nil {
		t.Fatal(err)
	}
	wantNAR := nix.FileNAR([]byte(d.Text), false)
	if ni.StorePath != d.StorePath || !ni.Verify(e.key.Public()) ||
		ni.NarHash != nix.FormatSHA256(sha256.Sum256(wantNAR)) || ni.NarSize != int64(len(wantNAR)) ||
		ni.CA != "text:"+nix.FormatSHA256(sha256.Sum256([]byte(d.Text))) ||
		!slices.Equal(slices.Sorted(slices.Values(ni.References)), bases(parsed.References())) {
		t.Fatalf("narinfo of %s: %+v", d.StorePath, ni)
	}
	// Served uncompressed from the database: the file is the NAR.
	file, ok := e.read(t, ni.URL)
	if !ok {
		t.Fatalf("narinfo of %s: no NAR at %s", d.StorePath, ni.URL)
	}
	if ni.Compression != "none" || ni.URL != blob.DrvNARKey(sha256.Sum256(wantNAR)) || !bytes.Equal(file, wantNAR) ||
		int64(len(file)) != ni.FileSize || ni.FileHash != ni.NarHash {
		t.Fatalf("NAR of %s at %s is not the .drv's: %+v", d.StorePath, ni.URL, ni)
	}
}

// An evaluator publishes its .drv files and the sources they use; every path is recomputed from
// its content, and the narinfos say how (CA).
func publishFlow(t *testing.T, e *env) {
	ev := e.evaluation(t, "eval-1")
	tok := e.evaluator(t, "eval-1")
	src := source(t, "src", "the project's sources")
	script := textFile(t, "builder.sh", "cd "+src.path()+"\n", src.path())
	flat := flatFile(t, "tarball.tar", "pretend this is a tarball")
	lib := derivation(t, "lib", nil, []string{src.path(), script.path()})
	app := derivation(t, "app", []string{lib.StorePath}, []string{flat.path()})
	sources := []object{src, script, flat}

	slots := e.upload(t, tok, signerapi.UploadSlotsRequest{Eval: &ev}, nil, sources...)
	for _, s := range slots.Outputs {
		if s.Skipped {
			t.Fatalf("%s skipped before it was uploaded", s.StorePath)
		}
	}
	req := signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{lib, app}}
	for _, s := range sources {
		req.Sources = append(req.Sources, s.out)
	}
	var resp signerapi.PublishResponse
	e.mustPost(t, "/api/publish", tok, req, &resp)
	if resp != (signerapi.PublishResponse{Written: 5}) {
		t.Fatalf("publish answered %+v, want 5 written", resp)
	}
	e.checkNarInfo(t, src, nil, "", "fixed:r:sha256:")
	e.checkNarInfo(t, script, []string{src.path()}, "", "text:sha256:")
	e.checkNarInfo(t, flat, nil, "", "fixed:sha256:")
	e.checkDrvNarInfo(t, lib)
	e.checkDrvNarInfo(t, app)

	// Again (a retried evaluation): nothing to upload, every narinfo skipped.
	var again signerapi.UploadSlotsResponse
	e.mustPost(t, "/api/upload-slots", tok, signerapi.UploadSlotsRequest{Eval: &ev, Outputs: req.Sources}, &again)
	for _, s := range again.Outputs {
		if !s.Skipped || s.Upload != nil {
			t.Fatalf("%s not skipped after its upload: %+v", s.StorePath, s)
		}
	}
	e.mustPost(t, "/api/publish", tok, req, &resp)
	if resp != (signerapi.PublishResponse{Skipped: 5}) {
		t.Fatalf("repeated publish answered %+v, want 5 skipped", resp)
	}

	// A later batch may refer to what the cache has already.
	tests := derivation(t, "tests", []string{app.StorePath}, []string{script.path()})
	e.mustPost(t, "/api/publish", tok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{tests}}, &resp)
	if resp != (signerapi.PublishResponse{Written: 1}) {
		t.Fatalf("publish of a .drv referring to the cache answered %+v", resp)
	}
	e.checkDrvNarInfo(t, tests)

	// But not to what neither it nor the cache has: a narinfo never points at a path the
	// cache cannot serve.
	missing := source(t, "not-published", "never uploaded")
	orphan := derivation(t, "orphan", []string{app.StorePath}, []string{missing.path()})
	before := e.state(t)
	code, body := e.post(t, "/api/publish", tok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{orphan}}, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "neither published with it nor in the cache") {
		t.Fatalf("publish of a .drv referring to an unpublished source: %d %s, want 400", code, body)
	}
	e.unchanged(t, before, "publish of a .drv referring to an unpublished source")

	// Nor a .drv whose output is another derivation's (the poisoning of issue 24): its path and
	// text agree, but its output path is not the one its text gives.
	victim, err := nix.ParseDerivation([]byte(app.Text))
	if err != nil {
		t.Fatal(err)
	}
	poison, err := nix.ParseDerivation([]byte(drvText("poison", nil, nil)))
	if err != nil {
		t.Fatal(err)
	}
	poison.Outputs["out"] = victim.Outputs["out"]
	poison.Env["out"] = victim.Outputs["out"].Path
	poisonText := poison.Unparse()
	poisonPath, _, err := nix.DerivationPath("poison.drv", poisonText)
	if err != nil {
		t.Fatal(err)
	}
	code, body = e.post(t, "/api/publish", tok, signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{{StorePath: poisonPath, Text: string(poisonText)}}}, nil)
	if code != http.StatusBadRequest || !strings.Contains(body, "output paths are not the ones its text gives") {
		t.Fatalf("publish of a .drv claiming another derivation's output: %d %s, want 400", code, body)
	}
	e.unchanged(t, before, "publish of a .drv claiming another derivation's output")

	// Once the evaluation is over, its claim publishes nothing.
	if _, err := e.pool.Exec(ctx(t), `UPDATE evaluations SET status = 'succeeded', finished_at = now() WHERE id = $1`, ev.ID); err != nil {
		t.Fatal(err)
	}
	before = e.state(t)
	late := derivation(t, "late", nil, nil)
	for _, c := range []struct {
		path string
		body any
	}{
		{"/api/publish", signerapi.PublishRequest{Eval: ev, Derivations: []signerapi.DerivationText{late}}},
		{"/api/upload-slots", signerapi.UploadSlotsRequest{Eval: &ev, Outputs: []signerapi.Output{missing.out}}},
	} {
		if code, body := e.post(t, c.path, tok, c.body, nil); code != http.StatusConflict || !strings.Contains(body, "is not running for node eval-1") {
			t.Fatalf("%s under a finished evaluation: %d %s, want 409", c.path, code, body)
		}
	}
	e.unchanged(t, before, "requests under a finished evaluation")
}

func TestPublishLocal(t *testing.T) {
	t.Parallel()
	publishFlow(t, newEnv(t, false))
}

func TestPublishMinIO(t *testing.T) {
	t.Parallel()
	publishFlow(t, newEnv(t, true))
}

// A .drv closure real Nix wrote, published through the signer, is served from the database by a
// cache node byte for byte: real Nix copies it into a fresh store with signatures required, and
// the builder's fetcher finds each .drv signed and its NAR matching, on either back-end.
func TestPublishedDerivationsSubstitute(t *testing.T) {
	t.Parallel()
	for _, s3 := range []bool{false, true} {
		t.Run(map[bool]string{false: "local", true: "minio"}[s3], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, s3)
			salt := fmt.Sprint(time.Now().UnixNano())
			built := t.TempDir()
			top := nixOut(t, "nix-instantiate", "--store", built, "--option", "substituters", "", "-E", `
let mk = name: deps: derivation { inherit name deps; system = builtins.currentSystem; builder = "/bin/sh";
  args = [ "-c" "echo > $out" ]; salt = "`+salt+`"; };
in mk "top" [ (mk "dep" [ ]) ]`)
			closure := strings.Fields(nixOut(t, "nix-store", "--store", built, "-q", "--requisites", top))
			if len(closure) != 2 {
				t.Fatalf("closure of %s: %v, want 2 .drv files", top, closure)
			}
			var drvs []signerapi.DerivationText // requisites come inputs first
			for _, p := range closure {
				text, err := os.ReadFile(filepath.Join(built, p))
				if err != nil {
					t.Fatal(err)
				}
				drvs = append(drvs, signerapi.DerivationText{StorePath: p, Text: string(text)})
			}
			var resp signerapi.PublishResponse
			e.mustPost(t, "/api/publish", e.evaluator(t, "eval-1"), signerapi.PublishRequest{Eval: e.evaluation(t, "eval-1"), Derivations: drvs}, &resp)
			if resp != (signerapi.PublishResponse{Written: 2}) {
				t.Fatalf("publish answered %+v, want 2 written", resp)
			}
			if objects := e.state(t).objects; len(objects) != 0 {
				t.Errorf("publishing .drv files wrote blob objects: %v", slices.Sorted(maps.Keys(objects)))
			}

			mux := http.NewServeMux()
			cache.New(cache.Config{Store: e.store, Derivations: blob.NewDerivations(e.pool)}).Register(access.NewRoutes(mux, nil))
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			fresh := t.TempDir()
			nixOut(t, "nix", "--extra-experimental-features", "nix-command", "copy", "--derivation", "--from", srv.URL,
				"--to", fresh, "--option", "trusted-public-keys", e.key.Public().String(), "--option", "require-sigs", "true", top)
			for _, d := range drvs {
				got, err := os.ReadFile(filepath.Join(fresh, d.StorePath))
				if err != nil || string(got) != d.Text {
					t.Errorf("%s in the fresh store: %v, same bytes %v", d.StorePath, err, string(got) == d.Text)
				}
			}

			f := &substitute.Fetcher{Caches: []string{srv.URL}, Keys: []nix.PublicKey{e.key.Public()}}
			found, err := f.Closure(ctx(t), []string{top}, nil)
			if err != nil || len(found) != 2 {
				t.Fatalf("the builder's fetcher: %d found, %v", len(found), err)
			}
			for i, fd := range found {
				text, err := f.ReadFile(ctx(t), fd, 1<<20)
				if err != nil || string(text) != drvs[i].Text {
					t.Errorf("%s through the builder's fetcher: %v", fd.Path(), err)
				}
			}
		})
	}
}

// nixOut runs a Nix command offline and returns its output.
func nixOut(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+t.TempDir(), "NIX_REMOTE=")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out))
}
