package faultproxy

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

// TestFaults pings a real redis-server through the proxy under each fault.
func TestFaults(t *testing.T) {
	s := redistest.Start(t)
	p, err := New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, DialTimeout: 300 * time.Millisecond})
	defer rdb.Close()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err()
	}
	if err := ping(); err != nil {
		t.Fatalf("pass: %v", err)
	}
	for _, f := range []Fault{BlackHole, DropReplies, Reset} {
		p.Set(f)
		if err := ping(); err == nil {
			t.Errorf("%v: PING answered", f)
		}
		p.Set(Pass)
		redistest.Eventually(t, 5*time.Second, "PING answered after "+f.String(), func() bool { return ping() == nil })
	}
	p.SetLatency(50 * time.Millisecond)
	p.Set(Latency)
	start := time.Now()
	if err := ping(); err != nil || time.Since(start) < 50*time.Millisecond {
		t.Errorf("latency: %v after %v", err, time.Since(start))
	}
	p.Set(Pass)
	if p.Accepted() == 0 || p.Forwarded() == 0 || p.Dropped() == 0 {
		t.Errorf("accepted %d, forwarded %d, dropped %d: want all counted", p.Accepted(), p.Forwarded(), p.Dropped())
	}
}

// TestHoldNextRequest: a held request has not run while held, and runs at
// Release even though its client closed meanwhile (a request on the wire
// when its sender died).
func TestHoldNextRequest(t *testing.T) {
	s := redistest.Start(t)
	p, err := New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	direct := s.Client()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, PoolSize: 1})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	holding := p.HoldNextRequest()
	done := make(chan error, 1)
	go func() { done <- rdb.Set(ctx, "held", "1", 0).Err() }()
	select {
	case <-holding:
	case <-time.After(5 * time.Second):
		t.Fatal("no request held")
	}
	if n, err := direct.Exists(ctx, "held").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS while the request is held = %d, %v; want 0", n, err)
	}
	rdb.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("SET answered while its request was held")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("SET did not return when its client closed")
	}
	p.Release()
	redistest.Eventually(t, 5*time.Second, "the held SET ran after its client closed", func() bool {
		n, err := direct.Exists(ctx, "held").Result()
		return err == nil && n == 1
	})
}
