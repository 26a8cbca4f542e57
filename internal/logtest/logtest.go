// Package logtest captures slog records in tests, so that a test can wait
// for a warning as an event instead of polling a buffer.
package logtest

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// Handler is a slog.Handler that sends each record's message to a channel
// (dropping it when the channel is full).
type Handler struct{ C chan string }

// New returns a Handler with room for n messages.
func New(n int) *Handler { return &Handler{C: make(chan string, n)} }

func (h *Handler) Enabled(context.Context, slog.Level) bool { return true }

func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h.C <- r.Message:
	default:
	}
	return nil
}

func (h *Handler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *Handler) WithGroup(string) slog.Handler      { return h }

// Logger returns a *slog.Logger writing to h.
func (h *Handler) Logger() *slog.Logger { return slog.New(h) }

// Default makes h the handler of slog.Default() for the rest of the test.
// Tests that call it must not run in parallel.
func (h *Handler) Default(t testing.TB) {
	prev := slog.Default()
	slog.SetDefault(slog.New(h))
	t.Cleanup(func() { slog.SetDefault(prev) })
}

// Wait returns the next message, failing the test when none comes within d.
func (h *Handler) Wait(t testing.TB, d time.Duration) string {
	t.Helper()
	select {
	case m := <-h.C:
		return m
	case <-time.After(d):
		t.Fatalf("no log message within %v", d)
		return ""
	}
}

// None fails the test if h has received a message.
func (h *Handler) None(t testing.TB) {
	t.Helper()
	select {
	case m := <-h.C:
		t.Fatalf("unexpected log message %q", m)
	default:
	}
}
