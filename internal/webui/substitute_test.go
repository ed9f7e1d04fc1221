package webui

import (
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/access"
	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/cache"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/nixtest"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// snippet is the text of the page's <pre class="snippet" id="id">, unescaped; "" if absent.
func snippet(body, id string) string {
	m := regexp.MustCompile(`(?s)<pre class="snippet" id="` + id + `">(.*?)</pre>`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// nixOptions turns nix.conf lines ("name = value") into command-line options; the
// netrc-file's path is replaced by netrc (the test writes no /etc/nix/netrc).
func nixOptions(t *testing.T, conf, netrc string) []string {
	t.Helper()
	var args []string
	for line := range strings.Lines(conf) {
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, value, ok := strings.Cut(strings.TrimSpace(line), " = ")
		if !ok {
			t.Fatalf("nix.conf line %q is not name = value", line)
		}
		if name == "netrc-file" {
			if value != netrcPath {
				t.Errorf("netrc-file = %q, want %q", value, netrcPath)
			}
			value = netrc
		}
		args = append(args, "--option", name, value)
	}
	return args
}

// The project page says whether a project is private and where its outputs are substituted
// from, and its snippet is what a real Nix takes: with the nix.conf lines and the netrc line
// (the token minted on the tokens page in place of the placeholder), nix-store -r
// substitutes a private project's output with require-sigs; without the netrc it does not.
func TestSubstituteSnippetWorksWithNix(t *testing.T) {
	fx := newAuthFixture(t)
	secret := fx.project("secret", "github", "octo/secret", true)
	fx.project("app", "github", "octo/app", false)

	src := filepath.Join(t.TempDir(), "harmonia-webui-snippet")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "secret.txt"), []byte("a private project's output\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path, stderr, err := nixtest.Offline(t, "nix-store", "--add", src)
	if err != nil {
		t.Fatalf("nix-store --add: %v\n%s", err, stderr)
	}
	// The path is the output of a build of the private project.
	_, drv := fx.job(secret, 0, status.JobSucceeded)
	fx.id(`INSERT INTO derivation_outputs (drv_path, output_name, output_path) VALUES ($1, 'out', $2) RETURNING 1`, drv, path)

	key, err := nix.GenerateKey("harmonia-webui-snippet-1")
	if err != nil {
		t.Fatal(err)
	}
	store, err := blob.NewLocal(t.TempDir(), "http://unused", []byte(authTestSecret))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	blobtest.PublishPath(t, store, key, path)
	mux := http.NewServeMux()
	cache.New(cache.Config{Store: store, NarinfoCacheBytes: cache.DefaultNarinfoCacheBytes,
		Visibility: &cache.Visibility{DB: fx.pool}}).Register(access.NewRoutes(mux, nil))
	cacheSrv := httptest.NewServer(mux)
	t.Cleanup(cacheSrv.Close)
	cacheURL, err := url.Parse(cacheSrv.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The cluster: a live cache node at that address, and the key its signer signs with.
	fx.id(`INSERT INTO nodes (id, roles, endpoint, incarnation, status, last_seen)
VALUES ('c1', '{cache}', $1, gen_random_uuid(), 'active', now()) RETURNING 1`, cacheSrv.URL)
	fx.id(`INSERT INTO signing_keys (public_key) VALUES ($1) RETURNING 1`, key.Public().String())

	// A public project's page: public, the cache and key, no netrc. The nodes' endpoints are
	// not shown to anonymous viewers (as GET /api/cluster does not show them).
	_, body := fx.browser().get("/ci/app/")
	if snippet(body, "nix-conf") != "" || strings.Contains(body, cacheSrv.URL) || !strings.Contains(body, `id="cache-hidden"`) ||
		!strings.Contains(html.UnescapeString(body), key.Public().String()) {
		t.Errorf("the public project's page shows an anonymous viewer the cache node's endpoint, or not the key:\n%s", body)
	}
	friend := fx.browser().login("friend")
	_, body = friend.get("/ci/app/")
	conf := snippet(body, "nix-conf")
	want := "extra-substituters = " + cacheSrv.URL + "\nextra-trusted-public-keys = " + key.Public().String() + "\n"
	if conf != want || snippet(body, "netrc") != "" || !strings.Contains(body, "<strong>public</strong>") {
		t.Errorf("the public project's snippet is %q (netrc %q), want %q and no netrc", conf, snippet(body, "netrc"), want)
	}
	// [cache] public_url is everyone's, in place of the endpoints.
	fx.u.cfg.CacheURL = "https://cache.example.org/"
	if s, err := fx.u.cacheSources(fx.ctx, true); err != nil || s.Hidden || len(s.URLs) != 1 || s.URLs[0] != "https://cache.example.org" {
		t.Errorf("sources with [cache] public_url, anonymously: %+v, %v; want the public URL alone", s, err)
	}
	fx.u.cfg.CacheURL = ""

	_, body = friend.get("/ci/secret/")
	conf, netrc := snippet(body, "nix-conf"), snippet(body, "netrc")
	if conf != want+"netrc-file = /etc/nix/netrc\n" || !strings.Contains(body, "<strong>private</strong>") || !strings.Contains(body, `href="/ci/tokens"`) {
		t.Fatalf("the private project's page: nix.conf snippet %q, want the public one's and the netrc-file; private, with a link to mint a token:\n%s", conf, body)
	}
	if wantNetrc := "machine " + cacheURL.Hostname() + " login nix password " + tokenPlaceholder + "\n"; netrc != wantNetrc {
		t.Fatalf("the netrc snippet is %q, want %q", netrc, wantNetrc)
	}
	token := friend.mint("nix")
	netrcFile := filepath.Join(t.TempDir(), "netrc")
	if err := os.WriteFile(netrcFile, []byte(strings.ReplaceAll(netrc, tokenPlaceholder, token)), 0o600); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		netrc string
		ok    bool
	}{
		{"without the netrc", filepath.Join(t.TempDir(), "none"), false},
		{"with the snippet's netrc", netrcFile, true},
	} {
		chroot := nixtest.WritableTempDir(t)
		args := append([]string{"--store", chroot, "-r", path, "--option", "require-sigs", "true"}, nixOptions(t, conf, c.netrc)...)
		_, stderr, err := nixtest.Offline(t, "nix-store", args...)
		if !c.ok {
			if err == nil || !strings.Contains(stderr, "don't know how to build") {
				t.Errorf("%s: nix-store -r of the private path: err %v, want no substitute\n%s", c.name, err, stderr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: nix-store -r failed: %v\n%s", c.name, err, stderr)
		}
		got, err := os.ReadFile(filepath.Join(chroot, path, "secret.txt"))
		if err != nil || string(got) != "a private project's output\n" {
			t.Errorf("%s: the substituted path holds %q, %v", c.name, got, err)
		}
	}
}
