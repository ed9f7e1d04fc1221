package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/harmonia-ci/harmonia-ci/internal/db"
	"github.com/harmonia-ci/harmonia-ci/internal/dbtest"
	"github.com/harmonia-ci/harmonia-ci/internal/httpapi"
	"github.com/harmonia-ci/harmonia-ci/internal/queuetest"
	"github.com/harmonia-ci/harmonia-ci/internal/waittest"
)

// pgProxy forwards TCP connections to a PostgreSQL Unix socket and can stop forwarding, like a
// server that is paused (SIGSTOP) or a network that drops everything: connections are accepted
// and bytes are taken, but nothing comes back until it resumes.
type pgProxy struct {
	ln     net.Listener
	target string // the server's socket file

	mu    sync.Mutex
	open  chan struct{} // closed while forwarding
	conns []net.Conn
	wg    sync.WaitGroup
}

// startPGProxy proxies to the server of url (a dbtest URL, over a Unix socket) until the test
// ends.
func startPGProxy(t *testing.T, url string) *pgProxy {
	t.Helper()
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pgProxy{ln: ln, target: filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port))), open: make(chan struct{})}
	close(p.open)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		p.resume()
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *pgProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.waitOpen() // a paused server accepts, and never answers
			s, err := net.Dial("unix", p.target)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(s, c)
			go p.pipe(c, s)
		}()
	}
}

// pipe copies src to dst, holding every chunk while the proxy is paused.
func (p *pgProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitOpen()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *pgProxy) waitOpen() {
	p.mu.Lock()
	c := p.open
	p.mu.Unlock()
	<-c
}

func (p *pgProxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *pgProxy) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// Handlers that touch the database answer 503 within their bound while it does not answer,
// whether it stops before the pool has a connection or while the pool holds idle ones, and
// answer normally once it is back.
func TestDatabaseNotAnswering(t *testing.T) {
	t.Parallel()
	const (
		slack = 3 * time.Second
		token = "admin-token-for-db-timeout"
	)
	for _, tc := range []struct {
		name         string
		connectFirst bool // use the pool before the pause, so it holds established connections
	}{
		{name: "never answers", connectFirst: false},
		{name: "paused after connecting", connectFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := dbtest.NewDB(t)
			direct, err := pgxpool.New(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(direct.Close)
			queuetest.Enqueue(t, direct, nil, queuetest.Drv("paused", "x86_64-linux"))
			job := queuetest.Job(t, direct, "paused").ID
			queuetest.Exec(t, direct, `UPDATE build_jobs SET status = 'failed' WHERE id = $1`, job) // 404: no log

			proxy := startPGProxy(t, url)
			pc, err := db.ParsePoolConfig(url, db.PoolConfig{})
			if err != nil {
				t.Fatal(err)
			}
			addr := proxy.ln.Addr().(*net.TCPAddr)
			pc.ConnConfig.Host, pc.ConnConfig.Port, pc.ConnConfig.Fallbacks = addr.IP.String(), uint16(addr.Port), nil
			pool, err := pgxpool.NewWithConfig(context.Background(), pc)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(pool.Close)
			if !tc.connectFirst {
				proxy.pause()
			}

			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := NewServer(Config{NodeID: "web-1", AdminToken: token, Gatherer: prometheus.NewRegistry()}, pool, ln, queuetest.TestLogger(t))
			if err := srv.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Stop)
			base := "http://" + ln.Addr().String()

			requests := []struct {
				method, path string
				bound        time.Duration
				ok           int // the answer with the database up
			}{
				{http.MethodGet, "/healthz", healthPingTimeout, http.StatusOK},
				{http.MethodGet, "/api/cluster", httpapi.DBTimeout, http.StatusOK},
				{http.MethodPost, "/api/nodes/web-2/drain", httpapi.DBTimeout, http.StatusNotFound},
				{http.MethodGet, fmt.Sprintf("/api/builds/%d/log", job), logQueryTimeout, http.StatusNotFound},
			}
			do := func(method, path string) (int, string, error) {
				req, err := http.NewRequest(method, base+path, nil)
				if err != nil {
					return 0, "", err
				}
				req.Header.Set("Authorization", "Bearer "+token)
				client := http.Client{Timeout: time.Minute}
				resp, err := client.Do(req)
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				var e struct{ Error string }
				body, _ := io.ReadAll(resp.Body)
				_ = json.Unmarshal(body, &e)
				return resp.StatusCode, e.Error, nil
			}
			if tc.connectFirst {
				for _, r := range requests {
					if code, msg, err := do(r.method, r.path); err != nil || code != r.ok {
						t.Fatalf("%s %s with the database up: %d %q %v, want %d", r.method, r.path, code, msg, err, r.ok)
					}
				}
				proxy.pause()
			}

			var wg sync.WaitGroup
			errs := make(chan error, len(requests))
			for _, r := range requests {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					code, msg, err := do(r.method, r.path)
					took := time.Since(start)
					switch {
					case err != nil:
						errs <- fmt.Errorf("%s %s: %w", r.method, r.path, err)
					case code != http.StatusServiceUnavailable || msg != "database unavailable":
						errs <- fmt.Errorf("%s %s: %d %q, want 503 \"database unavailable\"", r.method, r.path, code, msg)
					case took > r.bound+slack:
						errs <- fmt.Errorf("%s %s answered after %s, want within %s", r.method, r.path, took.Round(time.Millisecond), r.bound)
					default:
						t.Logf("%s %s: 503 after %s", r.method, r.path, took.Round(time.Millisecond))
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}

			proxy.resume()
			for _, r := range requests {
				waittest.For(t, 2*httpapi.DBTimeout, func() bool {
					code, _, err := do(r.method, r.path)
					return err == nil && code == r.ok
				}, "%s %s to answer %d again", r.method, r.path, r.ok)
			}
		})
	}
}

// db.Connect, which a node retries while it reports db.ErrUnavailable: a server that accepts
// and never answers fails the attempt within the connect timeout, however long the caller's
// context; a database that does not exist is not unavailable, so it fails at once for good.
func TestConnectBounded(t *testing.T) {
	t.Parallel()
	url := dbtest.NewDB(t)
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startPGProxy(t, url)
	proxy.pause()
	viaProxy := func(dbname string) string {
		return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", cfg.User, proxy.ln.Addr(), dbname)
	}
	const connectTimeout = time.Second
	for _, tc := range []struct {
		name        string
		url         string
		unavailable bool
	}{
		{name: "paused server", url: viaProxy(cfg.Database), unavailable: true},
		{name: "nothing listening", url: "postgres://" + cfg.User + "@/x?host=" + t.TempDir(), unavailable: true},
		{name: "unknown database", url: url + "&dbname=no_such_database", unavailable: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			pool, err := db.Connect(context.Background(), tc.url, db.PoolConfig{ConnectTimeout: connectTimeout})
			took := time.Since(start)
			if err == nil {
				pool.Close()
				t.Fatal("connected; want an error")
			}
			if got := errors.Is(err, db.ErrUnavailable); got != tc.unavailable {
				t.Errorf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, got, tc.unavailable)
			}
			if took > connectTimeout+3*time.Second {
				t.Errorf("Connect took %s, want within the %s connect timeout", took.Round(time.Millisecond), connectTimeout)
			}
		})
	}
}
