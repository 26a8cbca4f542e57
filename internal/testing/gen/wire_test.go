package gen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
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

// TestStuckConnDeliversLate: a kept write succeeds at once, the connection
// reads as closed by the peer and refuses writes, and the kept bytes reach
// the server d later, after which landed is called; a write not kept passes.
func TestStuckConnDeliversLate(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the stuck connection closes
		got <- string(b)
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	landed := make(chan time.Time, 1)
	const d = 50 * time.Millisecond
	c := &StuckConn{Conn: raw, Keep: func(b []byte) (time.Duration, func(), bool) {
		return d, func() { landed <- time.Now() }, bytes.Contains(b, []byte("stuck"))
	}}
	if _, err := c.Write([]byte("passes ")); err != nil {
		t.Fatal(err)
	}
	kept := time.Now()
	if n, err := c.Write([]byte("stuck")); n != 5 || err != nil {
		t.Fatalf("kept write: %d, %v", n, err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after a kept write: %v, want EOF", err)
	}
	if _, err := c.Write([]byte("after")); err == nil {
		t.Fatal("a write after a kept one succeeded")
	}
	_ = c.Close() // the kept request's goroutine closes it
	select {
	case at := <-landed:
		if at.Sub(kept) < d {
			t.Fatalf("landed %v after the write, before its %v", at.Sub(kept), d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the kept request never landed")
	}
	if s := <-got; s != "passes stuck" {
		t.Fatalf("the server read %q", s)
	}
}
