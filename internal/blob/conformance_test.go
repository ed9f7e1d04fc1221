package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
)

// testSecret keys the local store's upload signatures in tests.
var testSecret = []byte("0123456789abcdef0123456789abcdef")

type backend struct {
	name string
	new  func(t *testing.T) blob.Store
}

// newLocal returns a local store whose uploads are served by an httptest server.
func newLocal(t *testing.T) *blob.Local {
	var h http.Handler = http.NotFoundHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	l, err := blob.NewLocal(t.TempDir(), srv.URL, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	h = l.UploadHandler()
	return l
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
			t.Run("Presign", func(t *testing.T) { testPresign(t, s) })
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

func testPresign(t *testing.T, s blob.Store) {
	ctx := context.Background()
	body := []byte(strings.Repeat("presigned nar content ", 500))
	sum := sha256.Sum256(body)
	size := int64(len(body))
	n := 0
	newKey := func() string {
		n++
		return fmt.Sprintf("nar/%d%s.nar.zst", n%10, h52[1:])
	}
	presign := func(key string, expiry time.Duration) blob.Upload {
		t.Helper()
		u, err := s.PresignPut(ctx, key, size, sum[:], "application/x-nix-nar", expiry)
		if err != nil {
			t.Fatalf("PresignPut(%s): %v", key, err)
		}
		if u.Method != http.MethodPut || u.Headers.Get("Content-Type") != "application/x-nix-nar" {
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
		k := newKey()
		u := presign(k, time.Minute)
		if code, msg := upload(t, u, body); code != http.StatusOK && code != http.StatusCreated {
			t.Fatalf("upload: %d %s", code, msg)
		}
		got, info := get(t, s, k)
		if got != string(body) || info.ContentType != "application/x-nix-nar" {
			t.Errorf("after upload Get = %d bytes, %+v", len(got), info)
		}
		// Idempotent: the same upload again succeeds and changes nothing.
		if code, msg := upload(t, u, body); code != http.StatusOK && code != http.StatusCreated {
			t.Errorf("repeated upload: %d %s", code, msg)
		}
		if got, _ := get(t, s, k); got != string(body) {
			t.Errorf("after repeated upload Get = %d bytes", len(got))
		}
	})
	t.Run("ShortBody", func(t *testing.T) {
		k := newKey()
		code, msg := upload(t, presign(k, time.Minute), body[:len(body)-1])
		rejected("body one byte short", k, code, msg)
	})
	t.Run("LongBody", func(t *testing.T) {
		k := newKey()
		code, msg := upload(t, presign(k, time.Minute), append(slices.Clone(body), 'x'))
		rejected("body one byte long", k, code, msg)
	})
	t.Run("WrongContentSameLength", func(t *testing.T) {
		k := newKey()
		other := slices.Clone(body)
		other[len(other)/2] ^= 1
		code, msg := upload(t, presign(k, time.Minute), other)
		rejected("one bit flipped", k, code, msg)
	})
	t.Run("OtherContentType", func(t *testing.T) {
		k := newKey()
		u := presign(k, time.Minute)
		u.Headers.Set("Content-Type", "text/html")
		code, msg := upload(t, u, body)
		rejected("other content type", k, code, msg)
	})
	t.Run("OtherKey", func(t *testing.T) {
		k, other := newKey(), newKey()
		u := presign(k, time.Minute)
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
		code, msg := upload(t, u, body)
		rejected("URL edited to another key", other, code, msg)
		assertMissing(t, s, k)
	})
	t.Run("Expired", func(t *testing.T) {
		k := newKey()
		u := presign(k, time.Second)
		// Wait for the clock to pass the expiry (bounded), then use the URL.
		deadline := time.Now().Add(10 * time.Second)
		for !time.Now().After(u.Expires.Add(10 * time.Millisecond)) {
			if time.Now().After(deadline) {
				t.Fatalf("clock did not pass %v", u.Expires)
			}
			time.Sleep(20 * time.Millisecond)
		}
		code, msg := upload(t, u, body)
		rejected("expired URL", k, code, msg)
	})
}
