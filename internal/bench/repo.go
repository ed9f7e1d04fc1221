package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/jackc/pgx/v5/pgxpool"
)

// MakeRepo commits ci.nix holding expr into a new git repository at dir, for a project to
// evaluate.
func MakeRepo(dir, expr string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "ci.nix"), []byte(expr), 0o644); err != nil {
		return "", err
	}
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "ci.nix"}, {"commit", "-q", "-m", "generated"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_AUTHOR_NAME=bench",
			"GIT_AUTHOR_EMAIL=bench@example.invalid", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@example.invalid")
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("git %s: %w: %s", args[0], err, out)
		}
	}
	return dir, nil
}

// CreateProjects adds a project per entry of shares, with that scheduling share, each on its
// own made-up repository; seed keeps the names of different runs apart.
func CreateProjects(ctx context.Context, pool *pgxpool.Pool, seed uint64, shares []int) ([]int64, error) {
	ids := make([]int64, len(shares))
	for i, s := range shares {
		name := fmt.Sprintf("bench-%d-%d", seed%100000, i)
		if err := pool.QueryRow(ctx, sqlProjectCreate, name, s).Scan(&ids[i]); err != nil {
			return nil, fmt.Errorf("create bench project: %w", err)
		}
	}
	return ids, nil
}
