// Package notify multiplexes PostgreSQL LISTEN channels over one dedicated connection per
// process and fans notifications out to in-process subscribers.
//
// NOTIFY is only a wake-up: delivery is at most once and anything sent while the LISTEN session
// is down is lost. The notifier therefore reconnects with backoff and tells every subscriber
// after each (re)connect, through Sub.Resync, so it runs a catch-up; callers keep polling as a
// fallback.
//
// One goroutine owns the connection. It blocks in WaitForNotification and cancels that wait
// when it has something else to do (LISTEN a new channel, ping an idle session, stop). pgx v5's
// deadline context watcher interrupts the read by setting a deadline on the socket, and a read
// timeout does not close a pgconn (pgconn.peekMessage closes on every error except a timeout), so
// the session stays usable after a cancelled wait. The notifier pins that watcher on its
// connection, so a pool configured with a cancel-request watcher cannot change this.
package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harmonia-ci/harmonia-ci/internal/clock"
	"github.com/harmonia-ci/harmonia-ci/internal/startstop"
)

// BufferSize is the capacity of every Sub.C.
const BufferSize = 64

// opTimeout bounds connecting and every statement on the LISTEN session (LISTEN, UNLISTEN,
// ping). A statement that times out closes the session, which then reconnects.
const opTimeout = 10 * time.Second

// Config tunes the notifier.
type Config struct {
	// PingInterval: how often an idle connection is checked (a LISTEN session that died silently
	// would otherwise go unnoticed). Default 5s.
	PingInterval time.Duration
	// MinBackoff / MaxBackoff bound the reconnect delay (doubling, with jitter). Defaults 100ms / 10s.
	MinBackoff, MaxBackoff time.Duration
	// ApplicationName for pg_stat_activity; default "harmonia-ci listen".
	ApplicationName string
}

// Notification is one NOTIFY received on a channel.
type Notification struct{ Channel, Payload string }

// Notifier owns the process's LISTEN session.
type Notifier struct {
	startstop.Base
	cfg    Config
	pool   *pgxpool.Pool
	logger *slog.Logger
	clock  clock.Clock

	mu   sync.Mutex
	subs map[string]map[*Sub]struct{} // channels with at least one subscriber
	// Session state, written by the loop.
	connected bool
	session   uint64          // incremented on every successful connect
	listened  map[string]bool // channels LISTENed on the current session
	pid       uint32
	connects  int64
	// dirty asks the loop to reconcile LISTENs with subs; interrupt, when set, cancels the
	// loop's current WaitForNotification so it does so at once.
	dirty     bool
	interrupt context.CancelCauseFunc
	// waiters are Subscribe calls waiting for their channel's LISTEN; closed by the loop's next
	// reconcile, or when the session ends.
	waiters []chan struct{}
}

// Sub is one subscription to a channel.
type Sub struct {
	// C delivers the channel's notifications. It is never closed.
	C <-chan Notification
	// Resync receives a value (non-blocking send into a 1-buffered channel) once the
	// subscription's LISTEN is in place on a live session — after every successful (re)connect,
	// including the first one, and right away for a subscription made while connected — and
	// after the subscriber's buffer overflowed. The subscriber then runs its catch-up. It is
	// never closed.
	Resync <-chan struct{}

	n       *Notifier
	channel string
	c       chan Notification
	resync  chan struct{}
	once    sync.Once

	// Under n.mu.
	session    uint64 // the session whose LISTEN this subscriber was last told about
	overflowed bool   // a notification was dropped since the last overflow resync
	dropped    int64
}

var (
	channelRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

	errWake    = errors.New("notify: wake")
	errPingDue = errors.New("notify: ping due")
)

// New builds a notifier; Start runs it. Subscriptions may be made before Start.
func New(cfg Config, pool *pgxpool.Pool, logger *slog.Logger, clk clock.Clock) *Notifier {
	if cfg.PingInterval <= 0 {
		cfg.PingInterval = 5 * time.Second
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 100 * time.Millisecond
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = cfg.MinBackoff
	}
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = "harmonia-ci listen"
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if clk == nil {
		clk = clock.Real{}
	}
	return &Notifier{
		cfg: cfg, pool: pool, logger: logger.With("service", "notify"), clock: clk,
		subs: make(map[string]map[*Sub]struct{}),
	}
}

// Start launches the loop, which connects in the background (a database that is down at start
// is retried with backoff like a lost connection). It returns at once.
func (n *Notifier) Start(ctx context.Context) error {
	n.Run(ctx, n.run)
	return nil
}

// Connected reports whether the LISTEN session is up (for health/metrics and tests).
func (n *Notifier) Connected() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.connected
}

// Reconnects counts successful connects after the first (tests/metrics).
func (n *Notifier) Reconnects() int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return max(n.connects-1, 0)
}

// Subscribers is the number of open subscriptions to channel (tests: a service started twice
// must not subscribe twice).
func (n *Notifier) Subscribers(channel string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.subs[channel])
}

// BackendPID is the server pid of the current LISTEN session, 0 if none (tests use it with
// pg_terminate_backend).
func (n *Notifier) BackendPID() uint32 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.pid
}

// Subscribe registers interest in channel and returns a subscription. Notifications for the
// channel are delivered on Sub.C (buffered, capacity 64); when the buffer is full further
// notifications for that subscriber are dropped and it is told via Sub.Resync. Subscribe may be
// called before or after Start. A channel first subscribed while connected is LISTENed before
// Subscribe returns (unless the session fails meanwhile: then on the next connect); otherwise
// on connect. Channel names must match ^[a-z_][a-z0-9_]{0,62}$.
func (n *Notifier) Subscribe(channel string) (*Sub, error) {
	if !channelRE.MatchString(channel) {
		return nil, fmt.Errorf("notify: invalid channel name %q (want ^[a-z_][a-z0-9_]{0,62}$)", channel)
	}
	s := &Sub{
		n: n, channel: channel,
		c: make(chan Notification, BufferSize), resync: make(chan struct{}, 1),
	}
	s.C, s.Resync = s.c, s.resync

	n.mu.Lock()
	set := n.subs[channel]
	if set == nil {
		set = make(map[*Sub]struct{})
		n.subs[channel] = set
	}
	set[s] = struct{}{}
	var wait chan struct{}
	if n.listened[channel] {
		n.resyncLocked(s)
	} else {
		n.wakeLocked()
		if n.connected {
			wait = make(chan struct{})
			n.waiters = append(n.waiters, wait)
		}
	}
	n.mu.Unlock()

	if wait != nil {
		<-wait
	}
	return s, nil
}

// Close unsubscribes; the channel is UNLISTENed when its last subscriber leaves (best effort,
// asynchronously). Idempotent. C and Resync stay open.
func (s *Sub) Close() {
	s.once.Do(func() {
		n := s.n
		n.mu.Lock()
		defer n.mu.Unlock()
		set := n.subs[s.channel]
		delete(set, s)
		if len(set) == 0 {
			delete(n.subs, s.channel)
			if n.listened[s.channel] {
				n.wakeLocked()
			}
		}
	})
}

// wakeLocked asks the loop to reconcile LISTENs, interrupting its wait.
func (n *Notifier) wakeLocked() {
	n.dirty = true
	if n.interrupt != nil {
		n.interrupt(errWake)
	}
}

// resyncLocked tells s, once per session, that its channel is LISTENed on a live session.
func (n *Notifier) resyncLocked(s *Sub) {
	if s.session == n.session {
		return
	}
	s.session = n.session
	signal(s.resync)
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// deliver fans a notification out without ever blocking.
func (n *Notifier) deliver(pn *pgconn.Notification) {
	msg := Notification{Channel: pn.Channel, Payload: pn.Payload}
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.subs[pn.Channel] {
		select {
		case s.c <- msg:
			s.overflowed = false
		default:
			s.dropped++
			if !s.overflowed {
				n.logger.Debug("subscriber buffer full; dropping notifications", "channel", pn.Channel)
			}
			s.overflowed = true
			signal(s.resync)
		}
	}
}

// run is the loop: connect, serve until the session fails, back off, repeat.
func (n *Notifier) run(ctx context.Context) {
	defer n.endSession()
	backoff := n.cfg.MinBackoff
	for {
		conn, err := n.connect(ctx)
		if err == nil {
			backoff = n.cfg.MinBackoff
			err = n.serve(ctx, conn)
			n.endSession()
			closeConn(conn)
			if ctx.Err() != nil {
				return
			}
			n.logger.Warn("LISTEN connection lost; reconnecting", "error", err)
		} else {
			if ctx.Err() != nil {
				return
			}
			n.logger.Warn("LISTEN connection failed", "error", err, "retry_in", backoff)
		}
		d := jitter(backoff)
		backoff = min(2*backoff, n.cfg.MaxBackoff)
		select {
		case <-ctx.Done():
			return
		case <-n.clock.After(d):
		}
	}
}

func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// connConfig is db.DedicatedConn's configuration (the pool's settings, our application name)
// with the deadline context watcher pinned: a cancelled WaitForNotification must leave the
// session usable, which the cancel-request watcher would not guarantee (its cancel request may
// land on a later statement).
func (n *Notifier) connConfig() *pgx.ConnConfig {
	cc := n.pool.Config().ConnConfig.Copy()
	cc.RuntimeParams["application_name"] = n.cfg.ApplicationName
	cc.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: pc.Conn()}
	}
	return cc
}

// connect opens a session, LISTENs every subscribed channel, marks the session up and signals
// Resync to those channels' subscribers.
func (n *Notifier) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, n.connConfig())
	if err != nil {
		return nil, fmt.Errorf("open LISTEN connection: %w", err)
	}

	n.mu.Lock()
	n.dirty = false
	channels := make([]string, 0, len(n.subs))
	for ch := range n.subs {
		channels = append(channels, ch)
	}
	n.mu.Unlock()

	if err := execListen(cctx, conn, channels, nil); err != nil {
		closeConn(conn)
		return nil, err
	}

	n.mu.Lock()
	n.connected = true
	n.session++
	n.connects++
	connects := n.connects
	n.pid = conn.PgConn().PID()
	n.listened = make(map[string]bool, len(channels))
	for _, ch := range channels {
		n.listened[ch] = true
		for s := range n.subs[ch] {
			n.resyncLocked(s)
		}
	}
	n.mu.Unlock()

	if connects == 1 {
		n.logger.Info("LISTEN connection up", "channels", len(channels), "backend_pid", conn.PgConn().PID())
	} else {
		n.logger.Info("LISTEN connection re-established", "channels", len(channels), "backend_pid", conn.PgConn().PID(), "reconnects", connects-1)
	}
	return conn, nil
}

// endSession marks the session down and releases Subscribe calls waiting on it (their channels
// are LISTENed on the next connect).
func (n *Notifier) endSession() {
	n.mu.Lock()
	n.connected = false
	n.listened = nil
	n.pid = 0
	waiters := n.waiters
	n.waiters = nil
	n.mu.Unlock()
	for _, w := range waiters {
		close(w)
	}
}

// execListen runs LISTEN for listen and UNLISTEN for unlisten in one simple-protocol round trip.
func execListen(ctx context.Context, conn *pgx.Conn, listen, unlisten []string) error {
	if len(listen)+len(unlisten) == 0 {
		return nil
	}
	sort.Strings(listen)
	sort.Strings(unlisten)
	var b strings.Builder
	for _, ch := range listen {
		b.WriteString("LISTEN " + pgx.Identifier{ch}.Sanitize() + ";")
	}
	for _, ch := range unlisten {
		b.WriteString("UNLISTEN " + pgx.Identifier{ch}.Sanitize() + ";")
	}
	if _, err := conn.PgConn().Exec(ctx, b.String()).ReadAll(); err != nil {
		return fmt.Errorf("LISTEN/UNLISTEN: %w", err)
	}
	return nil
}

// serve runs the session until it fails or ctx ends.
func (n *Notifier) serve(ctx context.Context, conn *pgx.Conn) error {
	lastActive := n.clock.Now()
	for {
		if err := n.reconcile(ctx, conn); err != nil {
			return err
		}
		n.drainBuffered(conn)

		if now := n.clock.Now(); !now.Before(lastActive.Add(n.cfg.PingInterval)) {
			pctx, cancel := context.WithTimeout(ctx, opTimeout)
			err := conn.Ping(pctx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			lastActive = n.clock.Now()
			n.drainBuffered(conn)
		}

		wctx, cancel := context.WithCancelCause(ctx)
		n.mu.Lock()
		if n.dirty {
			n.mu.Unlock()
			cancel(nil)
			continue
		}
		n.interrupt = cancel
		n.mu.Unlock()

		timerDone := make(chan struct{})
		pingIn := lastActive.Add(n.cfg.PingInterval).Sub(n.clock.Now())
		go func() {
			select {
			case <-n.clock.After(pingIn):
				cancel(errPingDue)
			case <-timerDone:
			}
		}()

		var err error
		for {
			var pn *pgconn.Notification
			pn, err = conn.WaitForNotification(wctx)
			if pn != nil {
				n.deliver(pn)
				lastActive = n.clock.Now()
			}
			if err != nil {
				break
			}
		}

		close(timerDone)
		n.mu.Lock()
		n.interrupt = nil
		n.mu.Unlock()
		interrupted := wctx.Err() != nil
		cancel(nil)

		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case conn.IsClosed():
			return err
		case !interrupted:
			// An error the wait did not cause itself, on a session pgx still considers open:
			// its state is unknown, so start over.
			return err
		}
		// Interrupted (new work or ping due); the session is intact.
	}
}

// drainBuffered delivers notifications pgx buffered while a statement ran. With an already
// cancelled context, WaitForNotification returns a buffered notification or fails at once
// without touching the connection.
func (n *Notifier) drainBuffered(conn *pgx.Conn) {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		pn, _ := conn.WaitForNotification(done)
		if pn == nil {
			return
		}
		n.deliver(pn)
	}
}

// reconcile LISTENs channels that gained subscribers and UNLISTENs those that lost them all,
// then releases the Subscribe calls waiting for it.
func (n *Notifier) reconcile(ctx context.Context, conn *pgx.Conn) error {
	n.mu.Lock()
	n.dirty = false
	var listen, unlisten []string
	for ch := range n.subs {
		if !n.listened[ch] {
			listen = append(listen, ch)
		}
	}
	for ch := range n.listened {
		if len(n.subs[ch]) == 0 {
			unlisten = append(unlisten, ch)
			// No longer counted as LISTENed from now on: a Subscribe racing with the UNLISTEN
			// must wait for the next reconcile to LISTEN again.
			delete(n.listened, ch)
		}
	}
	waiters := n.waiters
	n.waiters = nil
	n.mu.Unlock()
	defer func() {
		for _, w := range waiters {
			close(w)
		}
	}()

	if len(listen)+len(unlisten) == 0 {
		return nil
	}
	ectx, cancel := context.WithTimeout(ctx, opTimeout)
	err := execListen(ectx, conn, listen, unlisten)
	cancel()
	if err != nil {
		return err
	}

	n.mu.Lock()
	for _, ch := range listen {
		n.listened[ch] = true
		for s := range n.subs[ch] {
			n.resyncLocked(s)
		}
	}
	n.mu.Unlock()
	return nil
}
