package pgembed

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestServerEnvironHoldsNoSecrets reads the server's environment over SQL, as anyone who can run
// SQL as a superuser could (a project's code never should, but one injection is enough), and
// finds none of the secrets the process that started it holds.
func TestServerEnvironHoldsNoSecrets(t *testing.T) {
	// t.Setenv: not parallel; the other tests wait until this one is done.
	secrets := map[string]string{}
	for _, name := range []string{"HARMONIA_CLUSTER_TOKEN", "HARMONIA_ADMIN_TOKEN", "HARMONIA_CLUSTER_SECRET",
		"HARMONIA_S3_SECRET_KEY", "HARMONIA_DATABASE_URL", "AWS_SECRET_ACCESS_KEY"} {
		secrets[name] = "secret-" + rand.Text()
		t.Setenv(name, secrets[name])
	}
	s := startServer(t, testDir(t))
	t.Cleanup(func() { s.Stop() })
	conn := connect(t, s.URL(database))
	ctx := t.Context()

	read := func(path string) string {
		t.Helper()
		var b []byte
		if err := conn.QueryRow(ctx, "SELECT pg_read_binary_file($1)", path).Scan(&b); err != nil {
			t.Fatalf("read %s over SQL: %v", path, err)
		}
		return string(b)
	}
	// The postmaster's pid is line 1 of postmaster.pid in the data directory.
	var pidFile string
	if err := conn.QueryRow(ctx, "SELECT pg_read_file('postmaster.pid')").Scan(&pidFile); err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(pidFile, "\n", 2)[0]))
	if err != nil {
		t.Fatalf("postmaster.pid: %q", pidFile)
	}

	postmaster := filepath.Join("/proc", strconv.Itoa(pid), "environ")
	for _, path := range []string{"/proc/self/environ", postmaster} {
		environ := read(path)
		vars := strings.Split(strings.TrimRight(environ, "\x00"), "\x00")
		// The read works: the postmaster has a PATH to show. (A backend overwrites its
		// environment with its process title.)
		if path == postmaster && !slices.Contains(vars, "PATH="+os.Getenv("PATH")) {
			t.Errorf("%s has no PATH: %q", path, vars)
		}
		for _, kv := range vars {
			if strings.HasPrefix(kv, "HARMONIA_") {
				name, _, _ := strings.Cut(kv, "=")
				t.Errorf("%s holds %s", path, name)
			}
		}
		for name, v := range secrets {
			if strings.Contains(environ, v) {
				t.Errorf("%s holds the value of %s", path, name)
			}
		}
	}
}

// The environment command gives a server program is an allow-list.
func TestCommandEnv(t *testing.T) {
	t.Setenv("PATH", "/usr/bin:/bin")
	t.Setenv("TZ", "Europe/Paris")
	t.Setenv("LC_MESSAGES", "C")
	t.Setenv("PGDATA", "/elsewhere")
	t.Setenv("HARMONIA_CLUSTER_TOKEN", "secret")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("HOME", "/root")
	env := identity{}.command(context.Background(), "true").Env
	for _, want := range []string{"PATH=/usr/bin:/bin", "TZ=Europe/Paris", "LC_MESSAGES=C"} {
		if !slices.Contains(env, want) {
			t.Errorf("env %q lacks %s", env, want)
		}
	}
	if serverEnv(nil) == nil {
		t.Error("an empty allowed environment is nil, which exec takes for the whole environment")
	}
	for _, kv := range env {
		for _, banned := range []string{"PGDATA=", "HARMONIA_", "AWS_", "HOME="} {
			if strings.HasPrefix(kv, banned) {
				t.Errorf("env holds %s", kv)
			}
		}
	}
}
