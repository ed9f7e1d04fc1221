package blob

// What MinIO enforces on a presigned PUT, observed against the real server
// (github.com/minio/minio v0.0.0-20260212201848-7aac2a2c5b7c, minio-go v7.4.1) by
// TestMinIOPresignEnforcement, TestS3PresignedNARWriteOnce and TestS3PresignCopySource.
// "Signed" means the header is in X-Amz-SignedHeaders via PresignHeader's extraHeaders; each
// row was one real request.
//
//	signed header            request                        MinIO answer                     stored
//	(none)                   any body, any length           200                              yes
//	Content-Length           body one byte short            403 SignatureDoesNotMatch        no
//	Content-Length           other body, same length        200                              yes
//	X-Amz-Content-Sha256     body one byte short            400 XAmzContentSHA256Mismatch    no
//	X-Amz-Content-Sha256     other body, same length        400 XAmzContentSHA256Mismatch    no
//	X-Amz-Content-Sha256     header not sent                400 AccessDenied                 no
//	X-Amz-Content-Sha256     header+body changed            403 SignatureDoesNotMatch        no
//	X-Amz-Checksum-Sha256    body one byte short            400 XAmzContentChecksumMismatch  no
//	X-Amz-Checksum-Sha256    other body, same length        400 XAmzContentChecksumMismatch  no
//	X-Amz-Checksum-Sha256    header not sent                400 AccessDenied                 no
//	X-Amz-Checksum-Sha256    header+body changed            403 SignatureDoesNotMatch        no
//	Content-Type             header not sent / changed      400 AccessDenied / 403 SigMismatch  no
//	(none)                   key exists                     200                              replaced
//	If-None-Match: *         key absent                     200                              yes
//	If-None-Match: *         key exists                     412 PreconditionFailed           no
//	If-None-Match: *         header not sent, key absent    400 AccessDenied                 no
//	If-None-Match: *         header not sent, key exists    400 AccessDenied                 no
//	If-None-Match: *         header changed to an ETag      403 SignatureDoesNotMatch        no
//	all of ours              URL path edited to another key 403 SignatureDoesNotMatch        no
//	all of ours              used after expiry              403 AccessDenied "Request has expired"  no
//
// So MinIO does verify the body against a signed x-amz-content-sha256 (hex) and a signed
// x-amz-checksum-sha256 (base64), and pins the length through a signed Content-Length (it
// signs r.ContentLength). PresignPut signs all of these and Content-Type.
//
// A presigned NAR PUT also signs If-None-Match: *, so it can create its key but never replace
// it, and a client cannot opt out by dropping the header. Put with IfAbsent sends the same
// header: MinIO answered 412 to a second one, also for a 17 MiB body that minio-go sends as a
// multipart upload (leaving no incomplete upload behind; TestS3IfAbsentMultipart), and of 16
// concurrent ones on a key exactly one stored its body (the conformance suite's IfAbsentRace).
//
// One hole the signature alone does not close: an UNSIGNED x-amz-copy-source header added by
// the client turns the PUT into a server-side CopyObject of any object in the bucket; MinIO
// answered 200 and stored the other object's content under the presigned key, ignoring the
// body and both checksums. (Signing an empty x-amz-copy-source is no fix: MinIO's PutObject
// rejects the header even when empty.) PresignPut therefore also signs
// x-amz-copy-source-if-match with an ETag no object has: a plain PUT ignores it, and a copy
// fails its precondition (observed: 412 PreconditionFailed, nothing stored; dropping the
// header: 400 AccessDenied; the same with If-None-Match: * also signed, on a NAR key). Other
// unsigned headers (x-amz-meta-*, Content-Encoding, ...) were not probed; none of them is a
// documented way to replace the body.

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config locates a bucket on an S3-compatible server.
type S3Config struct {
	Endpoint  string // host[:port], no scheme
	Region    string // empty: asked of the server
	Bucket    string
	AccessKey string
	SecretKey string
	UseTLS    bool
	PathStyle bool // path-style bucket addressing (MinIO and most self-hosted servers)
}

// S3 is a Store in an S3 bucket.
type S3 struct {
	client *minio.Client
	bucket string
	now    func() time.Time
}

var _ Store = (*S3)(nil)

// noCopyETag is an ETag no object has (ETags are hex digests).
const noCopyETag = `"harmonia-ci-presigned-put-is-no-copy"`

// NewS3 returns a store on cfg's bucket. It does not contact the server.
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errors.New("blob: S3 endpoint and bucket are required")
	}
	lookup := minio.BucketLookupAuto
	if cfg.PathStyle {
		lookup = minio.BucketLookupPath
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:        credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:       cfg.UseTLS,
		Region:       cfg.Region,
		BucketLookup: lookup,
	})
	if err != nil {
		return nil, fmt.Errorf("blob: S3 client: %w", err)
	}
	return &S3{client: client, bucket: cfg.Bucket, now: time.Now}, nil
}

// mapErr turns minio's "no such key" into ErrNotFound.
func (s *S3) mapErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	if resp.Code == minio.NoSuchKey || (resp.StatusCode == http.StatusNotFound && resp.Code != minio.NoSuchBucket) {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	return fmt.Errorf("blob: s3 %s %s: %w", op, key, err)
}

// Put uploads the object. Unless r holds exactly size bytes (hashing to o.SHA256, if set),
// the last bytes are withheld from the client library, so the upload fails and stores nothing.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64, o PutOptions) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("blob: put %s: negative size %d", key, size)
	}
	if o.SHA256 != nil && len(o.SHA256) != sha256.Size {
		return fmt.Errorf("blob: put %s: sha256 is %d bytes, want %d", key, len(o.SHA256), sha256.Size)
	}
	ct := o.ContentType
	if ct == "" {
		ct = ContentTypeFor(key)
	}
	body := newCheckingReader(r, key, size, o.SHA256)
	opts := minio.PutObjectOptions{ContentType: ct}
	if o.IfAbsent {
		opts.SetMatchETagExcept("*") // If-None-Match: *
	}
	_, err := s.client.PutObject(ctx, s.bucket, key, body, size, opts)
	if err != nil {
		var mm *MismatchError
		if errors.As(err, &mm) {
			return mm
		}
		if o.IfAbsent && minio.ToErrorResponse(err).StatusCode == http.StatusPreconditionFailed {
			return fmt.Errorf("%w: %s", ErrExists, key)
		}
		return fmt.Errorf("blob: s3 put %s: %w", key, err)
	}
	return nil
}

func objectInfo(oi minio.ObjectInfo) Info {
	return Info{Key: oi.Key, Size: oi.Size, ModTime: oi.LastModified, ContentType: oi.ContentType}
}

// Get opens key. The caller must close the reader.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	if err := ValidKey(key); err != nil {
		return nil, Info{}, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, Info{}, s.mapErr("get", key, err)
	}
	oi, err := obj.Stat()
	if err != nil {
		_ = obj.Close()
		return nil, Info{}, s.mapErr("get", key, err)
	}
	return obj, objectInfo(oi), nil
}

// Head describes key.
func (s *S3) Head(ctx context.Context, key string) (Info, error) {
	if err := ValidKey(key); err != nil {
		return Info{}, err
	}
	oi, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.mapErr("head", key, err)
	}
	return objectInfo(oi), nil
}

// Delete removes key; an absent key is not an error.
func (s *S3) Delete(ctx context.Context, key string) error {
	if err := ValidKey(key); err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("blob: s3 delete %s: %w", key, err)
	}
	return nil
}

// MaxBatchDelete is the most keys one DeleteMany request takes (S3's DeleteObjects limit).
const MaxBatchDelete = 1000

// DeleteMany removes keys (at most MaxBatchDelete) in one request; absent keys are not an
// error. It returns the keys it could not delete with the first error.
func (s *S3) DeleteMany(ctx context.Context, keys []string) (failed []string, err error) {
	if len(keys) > MaxBatchDelete {
		return keys, fmt.Errorf("blob: s3 delete: %d keys in one request, at most %d", len(keys), MaxBatchDelete)
	}
	objects := make(chan minio.ObjectInfo, len(keys))
	for _, k := range keys {
		if err := ValidKey(k); err != nil {
			return keys, err
		}
		objects <- minio.ObjectInfo{Key: k}
	}
	close(objects)
	for e := range s.client.RemoveObjects(ctx, s.bucket, objects, minio.RemoveObjectsOptions{}) {
		if e.Err != nil {
			failed = append(failed, e.ObjectName)
			if err == nil {
				err = fmt.Errorf("blob: s3 delete %s: %w", e.ObjectName, e.Err)
			}
		}
	}
	return failed, err
}

// List calls fn for each object whose key starts with prefix, in key order. Info.ContentType
// is empty: S3 listings do not carry it.
func (s *S3) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := validPrefix(prefix); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine if fn stops early
	for oi := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if oi.Err != nil {
			return fmt.Errorf("blob: s3 list %q: %w", prefix, oi.Err)
		}
		if err := fn(objectInfo(oi)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// PresignPut presigns a PUT of key whose signature covers Content-Length, Content-Type and the
// body's sha256 (see the top of this file for what the server checks). The client must send
// every header in Upload.Headers unchanged.
func (s *S3) PresignPut(ctx context.Context, key string, size int64, sum []byte, contentType string, expiry time.Duration) (Upload, error) {
	if err := checkPresign(key, size, sum, expiry); err != nil {
		return Upload{}, err
	}
	if contentType == "" {
		contentType = ContentTypeFor(key)
	}
	h := presignHeaders(size, sum, contentType)
	if IsNAR(key) {
		// Written once: MinIO (and S3) refuse the PUT with 412 when the object exists, and
		// refuse it outright if the client drops this signed header.
		h.Set("If-None-Match", "*")
	}
	start := s.now()
	u, err := s.client.PresignHeader(ctx, http.MethodPut, s.bucket, key, expiry, url.Values{}, h)
	if err != nil {
		return Upload{}, fmt.Errorf("blob: s3 presign %s: %w", key, err)
	}
	// The URL is valid for expiry after its X-Amz-Date, which is in whole seconds.
	if d, err := time.Parse("20060102T150405Z", u.Query().Get("X-Amz-Date")); err == nil {
		start = d
	}
	return Upload{URL: u.String(), Method: http.MethodPut, Headers: h, Expires: start.Add(expiry)}, nil
}

func presignHeaders(size int64, sum []byte, contentType string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	h.Set("X-Amz-Content-Sha256", hex.EncodeToString(sum))
	h.Set("X-Amz-Checksum-Sha256", base64.StdEncoding.EncodeToString(sum))
	// An unsigned x-amz-copy-source would turn the PUT into a server-side copy of any object
	// in the bucket, ignoring the body and its checksums. A signed copy precondition that no
	// object meets makes every such copy fail; a plain PUT ignores it.
	h.Set("X-Amz-Copy-Source-If-Match", noCopyETag)
	return h
}
