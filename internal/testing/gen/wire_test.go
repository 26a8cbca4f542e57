package gen

import (
	"context"
	"errors"
	"testing"
	"time"
)

// detached has a deadline but never ends by itself, like a command's
// context under rcmd.Uncancelled.
type detached struct{ context.Context }

func (detached) Done() <-chan struct{} { return nil }
func (detached) Err() error            { return nil }

func TestReplyGivenUpAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	done, err, stop := ReplyGivenUp(detached{ctx})
	defer stop()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a wait under a deadline with no Done never ended")
	}
	if !errors.Is(err(), context.DeadlineExceeded) {
		t.Fatalf("err %v, want a deadline", err())
	}
}

func TestReplyGivenUpWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	done, err, stop := ReplyGivenUp(ctx)
	defer stop()
	cancel()
	<-done
	if !errors.Is(err(), context.Canceled) {
		t.Fatalf("err %v, want cancelled", err())
	}
}
