package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/harmonia-ci/harmonia-ci/internal/blob"
	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
)

// TestMinIOPresignEnforcement records, header by header, what the real MinIO checks on a
// presigned PUT: a presign that signs one header is used with a body or headers that violate
// it. The summary at the top of s3.go is what this test observes; it fails if MinIO's
// behaviour changes.
func TestMinIOPresignEnforcement(t *testing.T) {
	cfg := blobtest.StartMinIO(t)
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Region: cfg.Region,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := []byte("the signed body, 32 bytes long!!")
	sum := sha256.Sum256(good)
	sameLen := bytes.Repeat([]byte("x"), len(good))
	otherSum := sha256.Sum256(sameLen)
	short := good[:len(good)-1]

	hdr := func(k, v string) http.Header { h := http.Header{}; h.Set(k, v); return h }
	signed := map[string]http.Header{
		"nothing":               {},
		"content-length":        hdr("Content-Length", strconv.Itoa(len(good))),
		"x-amz-content-sha256":  hdr("X-Amz-Content-Sha256", hex.EncodeToString(sum[:])),
		"x-amz-checksum-sha256": hdr("X-Amz-Checksum-Sha256", base64.StdEncoding.EncodeToString(sum[:])),
		"content-type":          hdr("Content-Type", "text/x-nix-narinfo"),
		"if-none-match":         hdr("If-None-Match", "*"),
	}
	// edit makes the request deviate from what was signed.
	type edit func(h http.Header) []byte
	body := func(b []byte) edit { return func(http.Header) []byte { return b } }
	omit := func(h http.Header) []byte {
		for k := range h {
			h.Del(k)
		}
		return good
	}
	change := func(h http.Header) []byte {
		for k := range h {
			switch k {
			case "Content-Type":
				h.Set(k, "text/html")
			case "X-Amz-Content-Sha256":
				h.Set(k, hex.EncodeToString(otherSum[:]))
			case "X-Amz-Checksum-Sha256":
				h.Set(k, base64.StdEncoding.EncodeToString(otherSum[:]))
			case "If-None-Match":
				h.Set(k, `"0123456789abcdef0123456789abcdef"`)
			}
		}
		return sameLen
	}
	old := []byte("the object that was there before")
	const ok, rejected = "stored", "rejected"
	for i, c := range []struct {
		signed, name string
		existing     bool // the key holds old before the PUT
		edit         edit
		want         string // ok or rejected
		code         string // S3 error code when rejected
	}{
		{"nothing", "correct", false, body(good), ok, ""},
		{"nothing", "short body", false, body(short), ok, ""},
		{"nothing", "other body", false, body(sameLen), ok, ""},
		{"content-length", "correct", false, body(good), ok, ""},
		{"content-length", "short body", false, body(short), rejected, "SignatureDoesNotMatch"},
		{"content-length", "other body, same length", false, body(sameLen), ok, ""},
		{"x-amz-content-sha256", "correct", false, body(good), ok, ""},
		{"x-amz-content-sha256", "short body", false, body(short), rejected, "XAmzContentSHA256Mismatch"},
		{"x-amz-content-sha256", "other body, same length", false, body(sameLen), rejected, "XAmzContentSHA256Mismatch"},
		{"x-amz-content-sha256", "header omitted", false, omit, rejected, "AccessDenied"},
		{"x-amz-content-sha256", "header and body changed", false, change, rejected, "SignatureDoesNotMatch"},
		{"x-amz-checksum-sha256", "correct", false, body(good), ok, ""},
		{"x-amz-checksum-sha256", "short body", false, body(short), rejected, "XAmzContentChecksumMismatch"},
		{"x-amz-checksum-sha256", "other body, same length", false, body(sameLen), rejected, "XAmzContentChecksumMismatch"},
		{"x-amz-checksum-sha256", "header omitted", false, omit, rejected, "AccessDenied"},
		{"x-amz-checksum-sha256", "header and body changed", false, change, rejected, "SignatureDoesNotMatch"},
		{"content-type", "correct", false, body(good), ok, ""},
		{"content-type", "header omitted", false, omit, rejected, "AccessDenied"},
		{"content-type", "header changed", false, change, rejected, "SignatureDoesNotMatch"},
		{"nothing", "key exists", true, body(good), ok, ""},
		{"if-none-match", "correct", false, body(good), ok, ""},
		{"if-none-match", "key exists", true, body(good), rejected, "PreconditionFailed"},
		{"if-none-match", "header omitted", false, omit, rejected, "AccessDenied"},
		{"if-none-match", "header omitted, key exists", true, omit, rejected, "AccessDenied"},
		{"if-none-match", "header changed, key exists", true, change, rejected, "SignatureDoesNotMatch"},
	} {
		key := "probe-" + strconv.Itoa(i)
		if c.existing {
			if _, err := client.PutObject(ctx, cfg.Bucket, key, bytes.NewReader(old), int64(len(old)), minio.PutObjectOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		u, err := client.PresignHeader(ctx, http.MethodPut, cfg.Bucket, key, time.Minute, url.Values{}, signed[c.signed])
		if err != nil {
			t.Fatal(err)
		}
		h := signed[c.signed].Clone()
		h.Del("Content-Length") // net/http sends the body's true length
		b := c.edit(h)
		status, code := rawPut(t, u.String(), h, b)
		stored, present := objectContent(t, client, cfg.Bucket, key)
		var got string
		switch {
		case status == http.StatusOK && present && bytes.Equal(stored, b):
			got = ok
		case status != http.StatusOK && !present && !c.existing,
			status != http.StatusOK && present && c.existing && bytes.Equal(stored, old):
			got = rejected
		default:
			t.Errorf("signed %s, %s: status %d, and the key holds %q (present %v)", c.signed, c.name, status, stored, present)
		}
		t.Logf("signed %-22s %-27s -> %d %-28s %s", c.signed, c.name, status, code, got)
		if got != c.want || code != c.code {
			t.Errorf("signed %s, %s: %s (%d %s), want %s %s", c.signed, c.name, got, status, code, c.want, c.code)
		}
	}
}

// objectContent returns what key holds, and whether it exists.
func objectContent(t *testing.T, client *minio.Client, bucket, key string) ([]byte, bool) {
	t.Helper()
	obj, err := client.GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer obj.Close()
	b, err := io.ReadAll(obj)
	if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}

// TestS3PresignedNARWriteOnce: a presigned NAR PUT cannot replace an object under its key
// (its signed If-None-Match: * fails with 412), and dropping that header voids the signature.
func TestS3PresignedNARWriteOnce(t *testing.T) {
	cfg := blobtest.StartMinIO(t)
	s, err := blob.NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	body := []byte("the NAR's compressed bytes")
	sum := sha256.Sum256(body)
	key := narKey(body)
	// What is there already: in practice the same bytes; other bytes show that nothing is
	// written over them.
	there := "bytes already under the key"
	for _, c := range []struct {
		name   string
		exists bool
		drop   bool // remove If-None-Match from the request
		want   int
		code   string
	}{
		{"key exists", true, false, http.StatusPreconditionFailed, "PreconditionFailed"},
		{"key exists, If-None-Match removed", true, true, http.StatusBadRequest, "AccessDenied"},
		{"key absent, If-None-Match removed", false, true, http.StatusBadRequest, "AccessDenied"},
		{"key absent", false, false, http.StatusOK, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := s.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			if c.exists {
				put(t, s, key, there)
			}
			u, err := s.PresignPut(ctx, key, int64(len(body)), sum[:], "", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if got := u.Headers.Get("If-None-Match"); got != "*" {
				t.Fatalf("presigned NAR headers %v, want If-None-Match: *", u.Headers)
			}
			h := u.Headers.Clone()
			h.Del("Content-Length")
			if c.drop {
				h.Del("If-None-Match")
			}
			status, code := rawPut(t, u.URL, h, body)
			if status != c.want || code != c.code {
				t.Errorf("PUT: %d %s, want %d %s", status, code, c.want, c.code)
			}
			got, present := content(t, s, key)
			switch {
			case c.want == http.StatusOK && got != string(body):
				t.Errorf("after the PUT the key holds %q, want the body", got)
			case c.want != http.StatusOK && c.exists && got != there:
				t.Errorf("after the refused PUT the key holds %q, want %q unchanged", got, there)
			case c.want != http.StatusOK && !c.exists && present:
				t.Errorf("after the refused PUT the key holds %q, want nothing", got)
			}
		})
	}
}

// TestS3PresignCopySource checks that an unsigned x-amz-copy-source header cannot turn a
// presigned PUT into a server-side copy of another object (which would store content whose
// sha256 is not the signed one), for a NAR (also signed If-None-Match: *) and for a log (not).
func TestS3PresignCopySource(t *testing.T) {
	cfg := blobtest.StartMinIO(t)
	s, err := blob.NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	good := []byte("the signed body, 32 bytes long!!")
	sum := sha256.Sum256(good)
	victim := "log/" + h32 + "-secret.drv"
	put(t, s, victim, strings.Repeat("s", len(good)))
	for _, key := range []string{narKey(good), "log/" + h32 + "-copy-target.drv"} {
		u, err := s.PresignPut(ctx, key, int64(len(good)), sum[:], "", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name        string
			body        []byte
			dropIfMatch bool
		}{
			{"signed-length body", good, false},
			{"empty body", nil, false},
			{"signed copy precondition dropped", good, true},
		} {
			h := u.Headers.Clone()
			h.Del("Content-Length")
			if c.dropIfMatch {
				h.Del("X-Amz-Copy-Source-If-Match")
			}
			h.Set("X-Amz-Copy-Source", "/"+cfg.Bucket+"/"+victim)
			status, code := rawPut(t, u.URL, h, c.body)
			t.Logf("%s: presigned PUT with x-amz-copy-source, %s: %d %s", key, c.name, status, code)
			if status < 400 {
				t.Errorf("%s: presigned PUT with x-amz-copy-source, %s: status %d, want a rejection", key, c.name, status)
			}
			assertMissing(t, s, key)
		}
	}
}

// rawPut sends a PUT with exactly headers h and returns the status and the S3 error code.
func rawPut(t *testing.T, u string, h http.Header, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	var e struct{ Code string }
	if resp.StatusCode != http.StatusOK {
		_ = xml.Unmarshal(msg, &e)
	}
	return resp.StatusCode, e.Code
}

// TestS3IfAbsentMultipart: a Put with IfAbsent of a body that minio-go uploads in parts stores
// nothing over an existing key, and leaves no incomplete multipart upload in the bucket.
func TestS3IfAbsentMultipart(t *testing.T) {
	cfg := blobtest.StartMinIO(t)
	s, err := blob.NewS3(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""), Region: cfg.Region,
		BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		t.Fatal(err)
	}
	first := bytes.Repeat([]byte("first large body"), (17<<20)/16)
	second := bytes.Repeat([]byte("other large body"), (17<<20)/16)
	key := narKey(first)
	if err := putIfAbsent(s, key, first, nil); err != nil {
		t.Fatal(err)
	}
	// A multipart object's ETag ends in -<parts>.
	oi, err := client.StatObject(context.Background(), cfg.Bucket, key, minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(oi.ETag, "-") {
		t.Fatalf("ETag %q is not a multipart upload's: the test does not test multipart", oi.ETag)
	}
	if err := putIfAbsent(s, key, second, nil); !errors.Is(err, blob.ErrExists) {
		t.Errorf("second large Put with IfAbsent = %v, want ErrExists", err)
	}
	if got, _ := content(t, s, key); got != string(first) {
		t.Errorf("after the second large Put with IfAbsent the object changed (%d bytes)", len(got))
	}
	for u := range client.ListIncompleteUploads(context.Background(), cfg.Bucket, "", true) {
		if u.Err != nil {
			t.Fatal(u.Err)
		}
		t.Errorf("incomplete multipart upload left behind: %s (%s)", u.Key, u.UploadID)
	}
}
