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
