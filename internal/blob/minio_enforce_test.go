package blob_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/xml"
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
			}
		}
		return sameLen
	}
	const ok, rejected = "stored", "rejected"
	for i, c := range []struct {
		signed, name string
		edit         edit
		want         string // ok or rejected
		code         string // S3 error code when rejected
	}{
		{"nothing", "correct", body(good), ok, ""},
		{"nothing", "short body", body(short), ok, ""},
		{"nothing", "other body", body(sameLen), ok, ""},
		{"content-length", "correct", body(good), ok, ""},
		{"content-length", "short body", body(short), rejected, "SignatureDoesNotMatch"},
		{"content-length", "other body, same length", body(sameLen), ok, ""},
		{"x-amz-content-sha256", "correct", body(good), ok, ""},
		{"x-amz-content-sha256", "short body", body(short), rejected, "XAmzContentSHA256Mismatch"},
		{"x-amz-content-sha256", "other body, same length", body(sameLen), rejected, "XAmzContentSHA256Mismatch"},
		{"x-amz-content-sha256", "header omitted", omit, rejected, "AccessDenied"},
		{"x-amz-content-sha256", "header and body changed", change, rejected, "SignatureDoesNotMatch"},
		{"x-amz-checksum-sha256", "correct", body(good), ok, ""},
		{"x-amz-checksum-sha256", "short body", body(short), rejected, "XAmzContentChecksumMismatch"},
		{"x-amz-checksum-sha256", "other body, same length", body(sameLen), rejected, "XAmzContentChecksumMismatch"},
		{"x-amz-checksum-sha256", "header omitted", omit, rejected, "AccessDenied"},
		{"x-amz-checksum-sha256", "header and body changed", change, rejected, "SignatureDoesNotMatch"},
		{"content-type", "correct", body(good), ok, ""},
		{"content-type", "header omitted", omit, rejected, "AccessDenied"},
		{"content-type", "header changed", change, rejected, "SignatureDoesNotMatch"},
	} {
		key := "probe-" + strconv.Itoa(i)
		u, err := client.PresignHeader(ctx, http.MethodPut, cfg.Bucket, key, time.Minute, url.Values{}, signed[c.signed])
		if err != nil {
			t.Fatal(err)
		}
		h := signed[c.signed].Clone()
		h.Del("Content-Length") // net/http sends the body's true length
		b := c.edit(h)
		status, code := rawPut(t, u.String(), h, b)
		_, statErr := client.StatObject(ctx, cfg.Bucket, key, minio.StatObjectOptions{})
		got := rejected
		if status == http.StatusOK && statErr == nil {
			got = ok
		} else if statErr == nil {
			t.Errorf("signed %s, %s: status %d but the object was stored", c.signed, c.name, status)
		}
		t.Logf("signed %-22s %-24s -> %d %-28s %s", c.signed, c.name, status, code, got)
		if got != c.want || code != c.code {
			t.Errorf("signed %s, %s: %s (%d %s), want %s %s", c.signed, c.name, got, status, code, c.want, c.code)
		}
	}
}

// TestS3PresignCopySource checks that an unsigned x-amz-copy-source header cannot turn a
// presigned PUT into a server-side copy of another object (which would store content whose
// sha256 is not the signed one).
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
	u, err := s.PresignPut(ctx, kNar, int64(len(good)), sum[:], "", time.Minute)
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
		t.Logf("presigned PUT with x-amz-copy-source, %s: %d %s", c.name, status, code)
		if status < 400 {
			t.Errorf("presigned PUT with x-amz-copy-source, %s: status %d, want a rejection", c.name, status)
		}
		assertMissing(t, s, kNar)
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
