package locks

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestGrantRequestNeverResentByGoRedis: a lock request written on a
// connection that then breaks before its reply (the request stuck on the
// wire: in a proxy, a retransmit queue) reaches Redis late — here after the
// call that sent it ended. go-redis used to send the request again at once on
// another connection (MaxRetries): that copy took the lock, its caller used it
// and unlocked, and then the stuck copy took it again, for an acquisition that
// had ended — a hold nobody has, which every other caller waited out for a
// whole lease (found by TestGenLocks with a request run twice). Now a grant's
// request is sent once (rcmd.Script.Grant): its caller hears that the
// connection broke, gives back what the request may take (with a tombstone),
// and the stuck copy takes nothing when it arrives.
func TestGrantRequestNeverResentByGoRedis(t *testing.T) {
	srv := redistest.Start(t)
	stuck := &stuckWrite{}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	rdb.AddHook(stuck)
	t.Cleanup(func() { _ = rdb.Close() })
	c := New(rdb)
	t.Cleanup(func() { _ = c.Close() })

	ctx := context.Background()
	lk, err := c.TryLock(ctx, "warm") // Redis has the script
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	stuck.arm([]byte(acquireS.sha))
	lk, err = c.TryLock(ctx, "stuck", Lease(time.Minute))
	switch {
	case err == nil:
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case !errors.Is(err, ErrUnavailable):
		t.Fatalf("TryLock after a broken connection: %v, want a lock or ErrUnavailable", err)
	}
	if !stuck.caught() {
		t.Fatal("the acquire request was not caught on the wire")
	}
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c.b.drain(ctx2) // the give-back of a failed attempt has been sent
	reply, derr := stuck.deliver()
	if derr != nil {
		t.Fatal(derr)
	}
	t.Logf("TryLock: %v; the stuck request, delivered after it: %q", err, reply)
	key := keys(c.cfg.prefix, "stuck")[0]
	if ttl := srv.Client().PTTL(ctx, key).Val(); ttl > 0 {
		t.Fatalf("after the stuck request arrived, Redis keeps the lock %v more, for an acquisition that ended", ttl)
	}
	other := New(srv.Client())
	defer other.Close()
	if lk, err := other.TryLock(ctx, "stuck"); err != nil {
		t.Fatalf("another client cannot take the lock: %v", err)
	} else {
		_ = lk.Unlock(ctx)
	}
}

// stuckWrite is a dial hook whose connections keep the first write that
// contains match (the request is stuck on the wire) and then break: the
// read of its reply ends with io.EOF, as when a peer closes. deliver writes
// the kept request to Redis afterwards, on its own connection (which go-redis
// has closed by then, as far as it knows), and returns Redis's reply.
type stuckWrite struct {
	match []byte
	mu    sync.Mutex
	kept  []byte
	conn  net.Conn // the real connection the kept request was meant for
}

func (s *stuckWrite) arm(match []byte) {
	s.mu.Lock()
	s.match = match
	s.mu.Unlock()
}

func (s *stuckWrite) caught() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept != nil
}

func (s *stuckWrite) deliver() (string, error) {
	s.mu.Lock()
	kept, conn := s.kept, s.conn
	s.mu.Unlock()
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return "", err
	}
	if _, err := conn.Write(kept); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return line, err
}

func (s *stuckWrite) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &stuckConn{Conn: conn, s: s}, nil
	}
}
func (s *stuckWrite) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (s *stuckWrite) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

type stuckConn struct {
	net.Conn
	s      *stuckWrite
	broken bool // this connection's write was kept: it is broken for go-redis
}

func (c *stuckConn) Write(b []byte) (int, error) {
	c.s.mu.Lock()
	if c.s.kept == nil && c.s.match != nil && bytes.Contains(b, c.s.match) {
		c.s.kept, c.s.conn, c.broken = bytes.Clone(b), c.Conn, true
		c.s.mu.Unlock()
		return len(b), nil
	}
	c.s.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *stuckConn) Read(b []byte) (int, error) {
	if c.broken {
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// Close leaves a broken connection open for deliver.
func (c *stuckConn) Close() error {
	if c.broken {
		return nil
	}
	return c.Conn.Close()
}
