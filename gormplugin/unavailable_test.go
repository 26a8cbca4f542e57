package gormplugin_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/gormplugin"
	"github.com/cacheguard/cacheguard/locks"
)

// A Redis that does not answer (a stopped server: connections are accepted,
// nothing is replied) costs each write the UnavailableAfter bound, not
// go-redis's read timeouts and retries or a Redlock's wait budget: five writes
// fit in one 10 s context, each failing with locks.ErrUnavailable (never the
// context's error), or with FailOpen going through (issue 15 C).
func TestUnansweredRedisBounded(t *testing.T) {
	forLockers(t, testUnansweredRedisBounded)
}

func testUnansweredRedisBounded(t *testing.T, e *env) {
	closed := e.guarded(t, gormplugin.UnavailableAfter(200*time.Millisecond))
	open := e.guarded(t, gormplugin.UnavailableAfter(200*time.Millisecond), gormplugin.FailOpen())
	if err := closed.Create(&Counter{ID: 1}).Error; err != nil {
		t.Fatal(err)
	}
	e.srv.Pause()
	defer e.srv.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	for i := range 5 {
		err := closed.WithContext(ctx).Model(&Counter{ID: 1}).Update("n", 100+i).Error
		if !errors.Is(err, gormplugin.ErrLock) || !errors.Is(err, locks.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("write %d with Redis not answering: %v, want ErrLock and locks.ErrUnavailable", i, err)
		}
		if err := open.WithContext(ctx).Model(&Counter{ID: 1}).Update("n", i).Error; err != nil {
			t.Fatalf("FailOpen write %d with Redis not answering: %v", i, err)
		}
	}
	t.Logf("10 writes with Redis not answering took %v", time.Since(start))
	var c Counter
	closed.First(&c, 1)
	if c.N != 4 {
		t.Fatalf("n = %d, want the last FailOpen write's 4", c.N)
	}
}
