package blob

import (
	"encoding/hex"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// SetNow replaces l's clock, which PresignPut and UploadHandler read.
func SetNow(l *Local, now func() time.Time) { l.now = now }

// SignUnchecked returns an upload URL signed with l's secret for exactly these parameters,
// skipping every check PresignPut makes (key kind, NAR name against sum, expiry bounds): what
// a signer with a bug, or an attacker holding the secret, could produce. The handler must
// still refuse what it has to refuse.
func SignUnchecked(l *Local, key string, size int64, sum []byte, contentType string, expires time.Time) Upload {
	sumHex := hex.EncodeToString(sum)
	q := url.Values{}
	q.Set("expires", strconv.FormatInt(expires.Unix(), 10))
	q.Set("size", strconv.FormatInt(size, 10))
	q.Set("sha256", sumHex)
	q.Set("sig", hex.EncodeToString(l.sign(http.MethodPut, key, expires.Unix(), size, sumHex, contentType)))
	h := http.Header{}
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.FormatInt(size, 10))
	return Upload{
		URL:     l.uploadBase + "/api/blob/" + escapeKey(key) + "?" + q.Encode(),
		Method:  http.MethodPut,
		Headers: h,
		Expires: expires,
	}
}
