package ginmw_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/locks"
)

// A lock lost while the handler ran — its key deleted, so the renewal finds
// another owner — and a handler that stops without answering (its write was
// refused, or it saw its context end) must not leave the request answered
// 200: Lock answers 409 lock lost.
func TestLockLostWithoutAnswerIsNot200(t *testing.T) {
	l, rdb, _ := newLocker(t)
	entered := make(chan struct{})
	r := newEngine()
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WithLease(150*time.Millisecond))), func(c *gin.Context) {
		close(entered)
		<-c.Request.Context().Done() // the write it was about to make would be refused: it gives up
	})
	done := make(chan int, 1)
	go func() { done <- serve(r, http.MethodPut, "/repos/15").Code }()
	within(t, 10*time.Second, entered, "the handler")
	if err := rdb.Del(context.Background(), "cg:lock:{repos:15}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != http.StatusConflict {
			t.Fatalf("status %d after the lock was lost mid-handler, want 409", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("request never finished")
	}
}

// statusErr is an application error that knows its HTTP status.
type statusErr struct{ code int }

func (e statusErr) Error() string   { return fmt.Sprintf("app error %d", e.code) }
func (e statusErr) HTTPStatus() int { return e.code }
