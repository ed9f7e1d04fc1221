package blob

import (
	"time"
)

// SetNow replaces l's clock, which PresignPut and UploadHandler read.
func SetNow(l *Local, now func() time.Time) { l.now = now }

// SignUnchecked returns an upload URL signed with l's secret for exactly these parameters,
// skipping every check PresignPut makes (key kind, NAR name against sum, expiry bounds): what
// a signer with a bug, or an attacker holding the secret, could produce. The handler must
// still refuse what it has to refuse.
func SignUnchecked(l *Local, key string, size int64, sum []byte, contentType string, expires time.Time) Upload {
	return l.signedUpload(key, size, sum, contentType, expires)
}
