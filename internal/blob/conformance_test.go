package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// testSecret keys the local store's upload signatures in tests.
var testSecret = []byte("0123456789abcdef0123456789abcdef")

type backend struct {
	name string
	new  func(t *testing.T) blob.Store
}

// newLocal returns a local store whose uploads are served by an httptest server.
func newLocal(t *testing.T) *blob.Local {
	l, _ := newLocalServer(t)
	return l
}

// newLocalServer is newLocal that also returns the upload server's URL.
func newLocalServer(t *testing.T) (*blob.Local, string) {
	var h http.Handler = http.NotFoundHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	l := openLocal(t, t.TempDir(), srv.URL, testSecret)
	h = l.UploadHandler(slog.New(slog.DiscardHandler))
	return l, srv.URL
}

// openLocal opens a local store on dir, closed when the test ends.
func openLocal(t *testing.T, dir, uploadBase string, secret []byte) *blob.Local {
	t.Helper()
	l, err := blob.NewLocal(dir, uploadBase, secret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// narKey is the key of a NAR whose compressed content is body: its sha256, in nix32.
func narKey(body []byte) string {
	return nix.NarURL(nix.FormatSHA256(sha256.Sum256(body)))
}

var backends = []backend{
	{"local", func(t *testing.T) blob.Store { return newLocal(t) }},
	{"s3", func(t *testing.T) blob.Store {
		s, err := blob.NewS3(blobtest.StartMinIO(t))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}},
}

// Keys of every layout kind.
var (
	kCacheInfo = "nix-cache-info"
	kNarinfo   = h32 + ".narinfo"
	kNarinfo2  = "1123456789abcdfghijklmnpqrsvwxyz.narinfo"
	kListing   = h32 + ".ls"
	kNar       = "nar/" + h52 + ".nar.zst"
	kNar2      = "nar/1" + h52[1:] + ".nar.zst"
	kLog       = "log/" + h32 + "-hello-2.12.1.drv"
	kLogOdd    = "log/" + h32 + "-we?rd=name+x.drv"
	kReal      = "realisations/" + h32 + "!out.doi"
)

func put(t *testing.T, s blob.Store, key, body string) {
	t.Helper()
	if err := s.Put(context.Background(), key, strings.NewReader(body), int64(len(body)), blob.PutOptions{}); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func get(t *testing.T, s blob.Store, key string) (string, blob.Info) {
	t.Helper()
	rc, info, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	return string(b), info
}

func assertMissing(t *testing.T, s blob.Store, key string) {
	t.Helper()
	ctx := context.Background()
	if info, err := s.Head(ctx, key); !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Head(%s) = %+v, %v; want ErrNotFound", key, info, err)
	}
	rc, _, err := s.Get(ctx, key)
	if err == nil {
		rc.Close()
	}
	if !errors.Is(err, blob.ErrNotFound) {
		t.Errorf("Get(%s) error = %v; want ErrNotFound", key, err)
	}
}

func list(t *testing.T, s blob.Store, prefix string) []string {
	t.Helper()
	var keys []string
	err := s.List(context.Background(), prefix, func(i blob.Info) error {
		keys = append(keys, fmt.Sprintf("%s:%d", i.Key, i.Size))
		return nil
	})
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	slices.Sort(keys)
	return keys
}

// upload performs u as a client would, with body (net/http sends its true length).
func upload(t *testing.T, u blob.Upload, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(u.Method, u.URL, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range u.Headers {
		if k != "Content-Length" {
			req.Header[k] = v
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("upload: %v", err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(msg))
}

func TestConformance(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			s := b.new(t)
			t.Run("RoundTrip", func(t *testing.T) { testRoundTrip(t, s) })
			t.Run("Missing", func(t *testing.T) { assertMissing(t, s, "nar/"+strings.Repeat("0", 52)+".nar.zst") })
			t.Run("InvalidKeys", func(t *testing.T) { testInvalidKeys(t, s) })
			t.Run("PutVerifies", func(t *testing.T) { testPutVerifies(t, s) })
			t.Run("LargePutVerifies", func(t *testing.T) { testLargePutVerifies(t, s) })
			t.Run("ListStops", func(t *testing.T) { testListStops(t, s) })
			t.Run("IfAbsent", func(t *testing.T) { testIfAbsent(t, s) })
			t.Run("IfAbsentRace", func(t *testing.T) { testIfAbsentRace(t, s) })
			t.Run("IfAbsentLarge", func(t *testing.T) { testIfAbsentLarge(t, s) })
			t.Run("Presign", func(t *testing.T) { testPresign(t, s) })
			t.Run("PresignRefusals", func(t *testing.T) { testPresignRefusals(t, s) })
		})
	}
}

func testRoundTrip(t *testing.T, s blob.Store) {
	ctx := context.Background()
	bodies := map[string]string{
		kCacheInfo: "StoreDir: /nix/store\nWantMassQuery: 1\nPriority: 40\n",
		kNarinfo:   "StorePath: /nix/store/" + h32 + "-hello\n",
		kNarinfo2:  "StorePath: /nix/store/1" + h32[1:] + "-x\n",
		kListing:   `{"version":1}`,
		kNar:       strings.Repeat("nar bytes ", 1000),
		kNar2:      "",
		kLog:       "zstd log",
		kLogOdd:    "odd name log",
		kReal:      `{"id":"x"}`,
	}
	for k, v := range bodies {
		put(t, s, k, v)
	}
	for k, v := range bodies {
		got, info := get(t, s, k)
		if got != v || info.Key != k || info.Size != int64(len(v)) || info.ContentType != blob.ContentTypeFor(k) {
			t.Errorf("Get(%s) = %q, %+v; want %q, size %d, type %s", k, got, info, v, len(v), blob.ContentTypeFor(k))
		}
		hi, err := s.Head(ctx, k)
		if err != nil || hi.Size != int64(len(v)) || hi.Key != k || hi.ContentType != blob.ContentTypeFor(k) {
			t.Errorf("Head(%s) = %+v, %v", k, hi, err)
		}
		if since := time.Since(hi.ModTime); since < -time.Minute || since > time.Minute {
			t.Errorf("Head(%s).ModTime = %v, not about now", k, hi.ModTime)
		}
	}
	entry := func(k string) string { return fmt.Sprintf("%s:%d", k, len(bodies[k])) }
	all := []string{}
	for k := range bodies {
		all = append(all, entry(k))
	}
	slices.Sort(all)
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{"", all},
		{"nar/", []string{entry(kNar), entry(kNar2)}},
		{"nar/0", []string{entry(kNar)}},
		{"log/", []string{entry(kLog), entry(kLogOdd)}},
		{"realisations/", []string{entry(kReal)}},
		{"0", []string{entry(kListing), entry(kNarinfo)}},
		{"n", []string{entry(kNar), entry(kNar2), entry(kCacheInfo)}},
		{"nix", []string{entry(kCacheInfo)}},
		{"zzz", nil},
		{"nosuchdir/", nil},
	} {
		if got := list(t, s, c.prefix); !slices.Equal(got, c.want) {
			t.Errorf("List(%q) = %v, want %v", c.prefix, got, c.want)
		}
	}

	// Overwrite replaces the content.
	put(t, s, kNarinfo, "replaced")
	if got, _ := get(t, s, kNarinfo); got != "replaced" {
		t.Errorf("after overwrite Get = %q", got)
	}

	for _, k := range []string{kNar, kLog} {
		if err := s.Delete(ctx, k); err != nil {
			t.Fatalf("Delete(%s): %v", k, err)
		}
		assertMissing(t, s, k)
		if err := s.Delete(ctx, k); err != nil {
			t.Errorf("second Delete(%s) = %v, want nil", k, err)
		}
	}
	if got, want := list(t, s, "nar/"), []string{entry(kNar2)}; !slices.Equal(got, want) {
		t.Errorf("List(nar/) after delete = %v, want %v", got, want)
	}
	if got, want := list(t, s, "log/"), []string{entry(kLogOdd)}; !slices.Equal(got, want) {
		t.Errorf("List(log/) after delete = %v, want %v", got, want)
	}
}

func testInvalidKeys(t *testing.T, s blob.Store) {
	ctx := context.Background()
	sum := sha256.Sum256(nil)
	for _, k := range []string{"../x", "/abs", "nar/../../etc/passwd", "a//b", "", "foo"} {
		if err := s.Put(ctx, k, strings.NewReader("x"), 1, blob.PutOptions{}); err == nil || errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Put(%q) = %v, want an invalid key error", k, err)
		}
		if _, _, err := s.Get(ctx, k); err == nil || errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want an invalid key error", k, err)
		}
		if _, err := s.Head(ctx, k); err == nil || errors.Is(err, blob.ErrNotFound) {
			t.Errorf("Head(%q) = %v, want an invalid key error", k, err)
		}
		if err := s.Delete(ctx, k); err == nil {
			t.Errorf("Delete(%q) = nil, want an invalid key error", k)
		}
		if _, err := s.PresignPut(ctx, k, 0, sum[:], "", time.Minute); err == nil {
			t.Errorf("PresignPut(%q) = nil error, want an invalid key error", k)
		}
	}
	for _, p := range []string{"../", "/", "nar/../"} {
		if err := s.List(ctx, p, func(blob.Info) error { return nil }); err == nil {
			t.Errorf("List(%q) = nil, want an error", p)
		}
	}
	if _, err := s.PresignPut(ctx, kNarinfo, 1, []byte{1, 2, 3}, "", time.Minute); err == nil {
		t.Errorf("PresignPut with a 3-byte sum = nil error")
	}
}

func testPutVerifies(t *testing.T, s blob.Store) {
	ctx := context.Background()
	body := []byte(strings.Repeat("verified ", 100))
	sum := sha256.Sum256(body)
	k := "log/" + h32 + "-verified.drv"
	if err := s.Put(ctx, k, bytes.NewReader(body), int64(len(body)), blob.PutOptions{SHA256: sum[:]}); err != nil {
		t.Fatalf("Put with the right sha256: %v", err)
	}
	if got, _ := get(t, s, k); got != string(body) {
		t.Fatalf("Get = %q", got)
	}

	bad := "log/" + h32 + "-badsum.drv"
	other := bytes.Repeat([]byte("x"), len(body))
	err := s.Put(ctx, bad, bytes.NewReader(other), int64(len(other)), blob.PutOptions{SHA256: sum[:]})
	var mm *blob.MismatchError
	if !errors.As(err, &mm) || mm.What != "sha256" {
		t.Errorf("Put with the wrong sha256 = %v, want a sha256 MismatchError", err)
	}
	assertMissing(t, s, bad)

	short := "log/" + h32 + "-short.drv"
	if err := s.Put(ctx, short, bytes.NewReader(body[:10]), int64(len(body)), blob.PutOptions{}); err == nil {
		t.Errorf("Put of a short body = nil error")
	}
	assertMissing(t, s, short)
	long := "log/" + h32 + "-long.drv"
	if err := s.Put(ctx, long, bytes.NewReader(body), 10, blob.PutOptions{SHA256: sum[:]}); err == nil {
		t.Errorf("Put of a long body = nil error")
	}
	assertMissing(t, s, long)
}

// testLargePutVerifies puts a body larger than minio-go's 16 MiB part size, so S3 uploads it
// in parts: a wrong sha256 must still store nothing.
func testLargePutVerifies(t *testing.T, s blob.Store) {
	ctx := context.Background()
	body := bytes.Repeat([]byte("0123456789abcdef"), (17<<20)/16)
	sum := sha256.Sum256(body)
	bad := "nar/2" + h52[1:] + ".nar.zst"
	body[len(body)-1] ^= 1
	err := s.Put(ctx, bad, bytes.NewReader(body), int64(len(body)), blob.PutOptions{SHA256: sum[:]})
	var mm *blob.MismatchError
	if !errors.As(err, &mm) || mm.What != "sha256" {
		t.Errorf("large Put with the wrong sha256 = %v, want a sha256 MismatchError", err)
	}
	assertMissing(t, s, bad)
	body[len(body)-1] ^= 1
	good := "nar/3" + h52[1:] + ".nar.zst"
	if err := s.Put(ctx, good, bytes.NewReader(body), int64(len(body)), blob.PutOptions{SHA256: sum[:]}); err != nil {
		t.Fatalf("large Put: %v", err)
	}
	if info, err := s.Head(ctx, good); err != nil || info.Size != int64(len(body)) {
		t.Errorf("Head after large Put = %+v, %v", info, err)
	}
	if err := s.Delete(ctx, good); err != nil {
		t.Fatal(err)
	}
}

func testListStops(t *testing.T, s blob.Store) {
	ctx := context.Background()
	for i := range 3 {
		put(t, s, fmt.Sprintf("realisations/%s!out%d.doi", h32, i), "{}")
	}
	stop := errors.New("stop")
	n := 0
	err := s.List(ctx, "realisations/", func(blob.Info) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Errorf("List with fn failing: err=%v after %d calls; want the fn's error after 1", err, n)
	}
}

// content returns what key holds, or "" and false if it is absent.
func content(t *testing.T, s blob.Store, key string) (string, bool) {
	t.Helper()
	rc, _, err := s.Get(context.Background(), key)
	if errors.Is(err, blob.ErrNotFound) {
		return "", false
	}
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	return string(b), true
}

func putIfAbsent(s blob.Store, key string, body []byte, sum []byte) error {
	return s.Put(context.Background(), key, bytes.NewReader(body), int64(len(body)), blob.PutOptions{SHA256: sum, IfAbsent: true})
}

// testIfAbsent: a Put with IfAbsent stores a key once; a second one, whatever its bytes, stores
// nothing and says ErrExists; a Put without IfAbsent still replaces.
func testIfAbsent(t *testing.T, s blob.Store) {
	ctx := context.Background()
	first, second, third := []byte("first writer's bytes"), []byte("second writer's other bytes"), []byte("a plain Put replaces")
	for _, key := range []string{
		"z" + h32[1:] + ".narinfo",
		narKey(first),
		"log/" + h32 + "-ifabsent.drv",
		"realisations/" + h32 + "!ifabsent.doi",
	} {
		t.Run(key, func(t *testing.T) {
			sum := sha256.Sum256(first)
			if err := putIfAbsent(s, key, first, sum[:]); err != nil {
				t.Fatalf("first Put with IfAbsent: %v", err)
			}
			if got, _ := content(t, s, key); got != string(first) {
				t.Fatalf("after the first Put: %q, want %q", got, first)
			}
			for _, c := range []struct {
				name string
				body []byte
				sum  bool
			}{
				{"other bytes", second, false},
				{"other bytes with their sha256", second, true},
				{"the same bytes", first, true},
			} {
				var sum []byte
				if c.sum {
					s := sha256.Sum256(c.body)
					sum = s[:]
				}
				if err := putIfAbsent(s, key, c.body, sum); !errors.Is(err, blob.ErrExists) {
					t.Errorf("second Put with IfAbsent, %s = %v, want ErrExists", c.name, err)
				}
				if got, _ := content(t, s, key); got != string(first) {
					t.Errorf("after a second Put with IfAbsent, %s: %q, want the first %q", c.name, got, first)
				}
			}
			if err := s.Put(ctx, key, bytes.NewReader(third), int64(len(third)), blob.PutOptions{}); err != nil {
				t.Fatalf("Put without IfAbsent: %v", err)
			}
			if got, _ := content(t, s, key); got != string(third) {
				t.Errorf("after a Put without IfAbsent: %q, want %q", got, third)
			}
		})
	}
	t.Run("WrongSumStoresNothing", func(t *testing.T) {
		key := "log/" + h32 + "-ifabsent-badsum.drv"
		sum := sha256.Sum256(second)
		var mm *blob.MismatchError
		if err := putIfAbsent(s, key, first, sum[:]); !errors.As(err, &mm) {
			t.Errorf("Put with IfAbsent and a wrong sha256 = %v, want a MismatchError", err)
		}
		assertMissing(t, s, key)
		if err := putIfAbsent(s, key, second, sum[:]); err != nil {
			t.Errorf("Put with IfAbsent after the refused one: %v", err)
		}
	})
}

// testIfAbsentRace: of writers racing with IfAbsent on one key, exactly one stores its bytes.
// Many rounds of small bodies, so that a check-then-write would let two through.
func testIfAbsentRace(t *testing.T, s blob.Store) {
	const writers, rounds = 16, 100
	for round := range rounds {
		key := fmt.Sprintf("log/%s-race-%d.drv", h32, round)
		bodies := make([][]byte, writers)
		errs := make([]error, writers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range writers {
			bodies[i] = []byte(fmt.Sprintf("writer %d", i))
			wg.Go(func() {
				<-start
				errs[i] = putIfAbsent(s, key, bodies[i], nil)
			})
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Errorf("round %d: writers %d and %d both stored %s", round, winner, i, key)
			case err == nil:
				winner = i
			case !errors.Is(err, blob.ErrExists):
				t.Errorf("round %d: writer %d: %v, want nil or ErrExists", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no writer stored %s: %v", round, key, errs)
		}
		if got, _ := content(t, s, key); got != string(bodies[winner]) {
			t.Errorf("round %d: %s holds %q, want writer %d's %q", round, key, got, winner, bodies[winner])
		}
	}
}

// testIfAbsentLarge: IfAbsent holds for a body that S3 receives in parts.
func testIfAbsentLarge(t *testing.T, s blob.Store) {
	ctx := context.Background()
	first := bytes.Repeat([]byte("first large body"), (17<<20)/16)
	second := bytes.Repeat([]byte("other large body"), (17<<20)/16)
	key := narKey(first)
	if err := putIfAbsent(s, key, first, nil); err != nil {
		t.Fatalf("first large Put with IfAbsent: %v", err)
	}
	if err := putIfAbsent(s, key, second, nil); !errors.Is(err, blob.ErrExists) {
		t.Errorf("second large Put with IfAbsent = %v, want ErrExists", err)
	}
	if got, _ := content(t, s, key); got != string(first) {
		t.Errorf("after the second large Put with IfAbsent the object changed (%d bytes)", len(got))
	}
	if err := s.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// presignKind is a kind of key clients upload through presigned URLs.
type presignKind struct {
	name        string
	key         func(body []byte, n int) string
	contentType string
	writeOnce   bool // a second upload stores nothing
}

var presignKinds = []presignKind{
	{"nar", func(body []byte, _ int) string { return narKey(body) }, "application/x-nix-nar", true},
	{"log", func(_ []byte, n int) string { return fmt.Sprintf("log/%s-presign-%d.drv", h32, n) }, "text/plain; charset=utf-8", false},
}

func testPresign(t *testing.T, s blob.Store) {
	for _, kind := range presignKinds {
		t.Run(kind.name, func(t *testing.T) { testPresignKind(t, s, kind) })
	}
}

func testPresignKind(t *testing.T, s blob.Store, kind presignKind) {
	ctx := context.Background()
	n := 0
	// newBody returns a body of its own for each case, and its key: a NAR key is its content's
	// sha256, so two cases cannot share a body.
	newBody := func() ([]byte, string) {
		n++
		body := []byte(strings.Repeat(fmt.Sprintf("presigned %s content %d ", kind.name, n), 500))
		return body, kind.key(body, n)
	}
	presign := func(key string, body []byte, expiry time.Duration) blob.Upload {
		t.Helper()
		sum := sha256.Sum256(body)
		u, err := s.PresignPut(ctx, key, int64(len(body)), sum[:], kind.contentType, expiry)
		if err != nil {
			t.Fatalf("PresignPut(%s): %v", key, err)
		}
		if u.Method != http.MethodPut || u.Headers.Get("Content-Type") != kind.contentType {
			t.Fatalf("PresignPut = %+v", u)
		}
		return u
	}
	rejected := func(what, key string, code int, msg string) {
		t.Helper()
		if code < 400 || code >= 500 {
			t.Errorf("%s: status %d (%s), want a 4xx rejection", what, code, msg)
		} else {
			t.Logf("%s: rejected with %d: %.200s", what, code, msg)
		}
		assertMissing(t, s, key)
	}

	t.Run("Correct", func(t *testing.T) {
		body, k := newBody()
		u := presign(k, body, time.Minute)
		if code, msg := upload(t, u, body); code != http.StatusOK && code != http.StatusCreated {
			t.Fatalf("upload: %d %s", code, msg)
		}
		got, info := get(t, s, k)
		if got != string(body) || info.ContentType != kind.contentType {
			t.Errorf("after upload Get = %d bytes, %+v", len(got), info)
		}
		// The same upload again changes nothing. A NAR is written once: the local store
		// answers 200 (the object is there), S3 412 (If-None-Match: * failed); both store
		// nothing. A log is written again, with the same bytes.
		code, msg := upload(t, u, body)
		ok := code == http.StatusOK || code == http.StatusCreated || (kind.writeOnce && code == http.StatusPreconditionFailed)
		if !ok {
			t.Errorf("repeated upload: %d %s", code, msg)
		}
		if got, _ := get(t, s, k); got != string(body) {
			t.Errorf("after repeated upload Get = %d bytes", len(got))
		}
	})
	t.Run("ShortBody", func(t *testing.T) {
		body, k := newBody()
		code, msg := upload(t, presign(k, body, time.Minute), body[:len(body)-1])
		rejected("body one byte short", k, code, msg)
	})
	t.Run("LongBody", func(t *testing.T) {
		body, k := newBody()
		code, msg := upload(t, presign(k, body, time.Minute), append(slices.Clone(body), 'x'))
		rejected("body one byte long", k, code, msg)
	})
	t.Run("WrongContentSameLength", func(t *testing.T) {
		body, k := newBody()
		other := slices.Clone(body)
		other[len(other)/2] ^= 1
		code, msg := upload(t, presign(k, body, time.Minute), other)
		rejected("one bit flipped", k, code, msg)
	})
	t.Run("OtherContentType", func(t *testing.T) {
		body, k := newBody()
		u := presign(k, body, time.Minute)
		u.Headers.Set("Content-Type", "text/html")
		code, msg := upload(t, u, body)
		rejected("other content type", k, code, msg)
	})
	t.Run("OtherKey", func(t *testing.T) {
		body, k := newBody()
		otherBody, other := newBody()
		u := presign(k, body, time.Minute)
		pu, err := url.Parse(u.URL)
		if err != nil {
			t.Fatal(err)
		}
		pu.Path = strings.Replace(pu.Path, k, other, 1)
		pu.RawPath = ""
		if !strings.Contains(pu.Path, other) {
			t.Fatalf("key %s not in URL path %s", k, pu.Path)
		}
		u.URL = pu.String()
		for _, b := range []struct {
			what string
			body []byte
		}{{"the signed body", body}, {"the other key's body", otherBody}} {
			code, msg := upload(t, u, b.body)
			rejected("URL edited to another key, "+b.what, other, code, msg)
		}
		assertMissing(t, s, k)
	})
	t.Run("Expired", func(t *testing.T) {
		body, k := newBody()
		u := presign(k, body, time.Second)
		waittest.For(t, 10*time.Second, func() bool { return time.Now().After(u.Expires.Add(10 * time.Millisecond)) },
			"the clock to pass the URL's expiry %v", u.Expires)
		code, msg := upload(t, u, body)
		rejected("expired URL", k, code, msg)
	})
}

// testPresignRefusals: PresignPut refuses what no upload may do, and presigns nothing then.
func testPresignRefusals(t *testing.T, s blob.Store) {
	ctx := context.Background()
	body := []byte("a NAR's compressed bytes")
	sum := sha256.Sum256(body)
	other := sha256.Sum256([]byte("other bytes"))
	key := narKey(body)
	log := "log/" + h32 + "-refusals.drv"
	for _, c := range []struct {
		name   string
		key    string
		sum    []byte
		expiry time.Duration
		ok     bool
	}{
		{"expiry 2h", key, sum[:], 2 * time.Hour, false},
		{"expiry 2h, log", log, sum[:], 2 * time.Hour, false},
		{"expiry just over MaxURLExpiry", key, sum[:], blob.MaxURLExpiry + time.Second, false},
		{"expiry 500ms", key, sum[:], 500 * time.Millisecond, false},
		{"expiry 0", key, sum[:], 0, false},
		{"negative expiry", key, sum[:], -time.Minute, false},
		{"NAR key with another sum", key, other[:], time.Minute, false},
		{"NAR key that is no nix32 sha256", "nar/z" + h52[1:] + ".nar.zst", sum[:], time.Minute, false},
		{"expiry MaxURLExpiry", key, sum[:], blob.MaxURLExpiry, true},
		{"expiry 1s", key, sum[:], time.Second, true},
		{"log key with any sum", log, other[:], time.Minute, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, err := s.PresignPut(ctx, c.key, int64(len(body)), c.sum, "", c.expiry)
			if c.ok {
				if err != nil || u.URL == "" {
					t.Errorf("PresignPut = %+v, %v; want an upload", u, err)
				}
				return
			}
			if err == nil {
				t.Errorf("PresignPut = nil error, want a refusal")
			}
			if u.URL != "" || u.Method != "" || u.Headers != nil {
				t.Errorf("refused PresignPut still returned %+v", u)
			}
		})
	}
}
