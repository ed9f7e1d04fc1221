package cachebench

import "testing"

func TestParseWrk(t *testing.T) {
	out := `Running 10s test @ http://127.0.0.1:1/nar/x.nar.zst
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   503.45ms  116.02ms   1.01s    71.00%
    Req/Sec    31.92     14.55    80.00     68.18%
  604 requests in 10.01s, 2.84GB read
  Socket errors: connect 0, read 3, write 0, timeout 0
Requests/sec:     60.32
Transfer/sec:    290.50MB
`
	r, err := parseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.requestsPerSec != 60.32 || r.bytesPerSec != 290.5*(1<<20) || r.socketErrors != "connect 0, read 3, write 0, timeout 0" {
		t.Fatalf("got %+v", r)
	}
	if _, err := parseWrk(out + "  Non-2xx or 3xx responses: 7\n"); err == nil {
		t.Fatal("non-2xx responses were not an error")
	}
	if _, err := parseWrk("garbage"); err == nil {
		t.Fatal("garbage parsed")
	}
}
