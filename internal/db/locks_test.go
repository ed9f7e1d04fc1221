package db_test

import (
	"testing"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
)

// TestLockKeysUnique: no two named locks share a key, and the request locks' class is not the
// named locks' (a project's request lock would otherwise collide with one of them).
func TestLockKeysUnique(t *testing.T) {
	t.Parallel()
	seen := map[[2]int32]string{}
	for name, key := range db.LockKeys() {
		if other, ok := seen[key]; ok {
			t.Errorf("locks %s and %s share the key %v", name, other, key)
		}
		seen[key] = name
		if key[0] == db.RequestLockClass {
			t.Errorf("lock %s is in the request locks' class", name)
		}
	}
}
