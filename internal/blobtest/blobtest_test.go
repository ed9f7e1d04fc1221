package blobtest_test

import (
	"context"
	"os"
	"regexp"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/harmonia-ci/harmonia-ci/internal/blobtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	blobtest.Cleanup()
	os.Exit(code)
}

var bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$`)

func TestBucketName(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int64
		want string
	}{
		{"TestFoo", 1, "t-testfoo-1"},
		{"TestFoo/sub case#01", 12, "t-testfoo-sub-case-01-12"},
		{"Test__Ünïcode--x/", 3, "t-test-n-code-x-3"},
		{"TestAVeryLongNameThatGoesOnAndOnAndOnForeverAndEverAndEverAndEver/sub", 7, "t-testaverylongnamethatgoesonandonandonforeverandeverandeverand-7"[:61] + "-7"},
	} {
		got := blobtest.BucketName(c.in, c.n)
		if got != c.want {
			t.Errorf("BucketName(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
		if !bucketRE.MatchString(got) {
			t.Errorf("BucketName(%q, %d) = %q is not a valid bucket name", c.in, c.n, got)
		}
	}
}

func TestStartMinIOGivesFreshBuckets(t *testing.T) {
	a, b := blobtest.StartMinIO(t), blobtest.StartMinIO(t)
	if a.Bucket == b.Bucket || a.Endpoint != b.Endpoint {
		t.Fatalf("configs %+v and %+v: want one server, two buckets", a, b)
	}
	client, err := minio.New(a.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(a.AccessKey, a.SecretKey, ""), Region: a.Region})
	if err != nil {
		t.Fatal(err)
	}
	for _, bucket := range []string{a.Bucket, b.Bucket} {
		ok, err := client.BucketExists(context.Background(), bucket)
		if err != nil || !ok {
			t.Errorf("BucketExists(%s) = %v, %v", bucket, ok, err)
		}
	}
}
