package config

import (
	"strings"
	"testing"
)

// The cache and signer sections reject what could not work, naming the key.
func TestCacheConfigRejected(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		want       []string
	}{
		{"unknown store", "[cache]\nstore = \"gcs\"\n", nil, []string{"cache.store", `"gcs"`}},
		{"s3 without endpoint, bucket or credentials", "[cache]\nstore = \"s3\"\n", nil,
			[]string{"cache.s3.endpoint is required", "cache.s3.bucket is required", "credentials are required"}},
		{"s3 endpoint without port", "[cache]\nstore = \"s3\"\n[cache.s3]\nendpoint = \"s3.example.com\"\nbucket = \"b\"\n",
			map[string]string{"HARMONIA_S3_ACCESS_KEY": "a", "HARMONIA_S3_SECRET_KEY": "s"}, []string{"cache.s3.endpoint", "host:port"}},
		{"use_tls not a bool", "[cache.s3]\nuse_tls = \"yes\"\n", nil, []string{"cache.s3.use_tls", "true or false"}},
		{"url expiry zero", "[signer]\nurl_expiry = \"0s\"\n", nil, []string{"signer.url_expiry"}},
		{"missing credential file", "[cache.s3]\nsecret_key_file = \"/nonexistent/s3\"\n", nil, []string{"cache.s3.secret_key_file", "/nonexistent/s3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setup(t)
			path := writeFile(t, t.TempDir(), "c.toml", tc.file)
			_, err := Load(Overrides{ConfigFile: path}, fakeEnv(tc.env))
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	setup(t)
	path := writeFile(t, t.TempDir(), "ok.toml", "[cache]\nstore = \"s3\"\n[cache.s3]\nendpoint = \"127.0.0.1:9000\"\nbucket = \"b\"\npath_style = true\nuse_tls = false\n")
	c, err := Load(Overrides{ConfigFile: path}, fakeEnv(map[string]string{"HARMONIA_S3_ACCESS_KEY": "a", "HARMONIA_S3_SECRET_KEY": "s"}))
	if err != nil {
		t.Fatalf("valid s3 configuration rejected: %v", err)
	}
	if c.Cache.S3.AccessKey != "a" || c.Cache.S3.SecretKey != "s" || !c.Cache.S3.PathStyle || c.Cache.S3.UseTLS {
		t.Fatalf("loaded %v", c.Cache.S3)
	}
	if strings.Contains(c.Cache.S3.String(), "s\"") || strings.Contains(c.Cache.S3.String(), ":a ") {
		t.Fatalf("S3Config.String leaks credentials: %s", c.Cache.S3)
	}
}
