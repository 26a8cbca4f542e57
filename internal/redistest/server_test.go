package redistest

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestServerLifecycle(t *testing.T) {
	ctx := context.Background()
	s := Start(t)
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause()
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := c.Ping(pctx).Err()
	cancel()
	if err == nil {
		t.Fatal("a paused server answered PING")
	}
	s.Resume()
	if err := waitFor(ctx, func() error { return c.Ping(ctx).Err() }); err != nil {
		t.Fatalf("resumed server: %v", err)
	}

	s.Kill()
	if s.Running() {
		t.Fatal("killed server still running")
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("killed server answered PING")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := waitFor(ctx, func() error { return c.Ping(ctx).Err() }); err != nil {
		t.Fatalf("restarted server: %v", err)
	}
	if n, _ := c.Exists(ctx, "k").Result(); n != 0 {
		t.Fatal("data survived a restart without persistence")
	}
}

func TestRestartPersistent(t *testing.T) {
	ctx := context.Background()
	s := Start(t, AppendFsyncAlways())
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	var v string
	if err := waitFor(ctx, func() (err error) { v, err = c.Get(ctx, "k").Result(); return err }); err != nil || v != "v" {
		t.Fatalf("after restart with appendfsync always: %q, %v", v, err)
	}
}

func TestStartN(t *testing.T) {
	ctx := context.Background()
	ss := StartN(t, 5)
	seen := map[string]bool{}
	for _, s := range ss {
		if seen[s.Addr()] {
			t.Fatalf("duplicate address %s", s.Addr())
		}
		seen[s.Addr()] = true
		if err := s.Client().Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor retries f until it succeeds or 10 s pass.
func waitFor(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("timed out"), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
