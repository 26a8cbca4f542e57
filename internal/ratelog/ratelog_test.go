package ratelog

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOncePerIntervalWithSuppressedCount(t *testing.T) {
	var buf bytes.Buffer
	r := New(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	ctx := context.Background()
	for range 5 {
		r.Warn(ctx, "a", "first kind")
	}
	r.Warn(ctx, "b", "second kind")
	if n := strings.Count(buf.String(), "first kind"); n != 1 {
		t.Fatalf("%d lines of key a in an hour, want 1:\n%s", n, &buf)
	}
	if !strings.Contains(buf.String(), "second kind") {
		t.Fatalf("key b not logged:\n%s", &buf)
	}
	r.every = 0
	r.Warn(ctx, "a", "first kind")
	if !strings.Contains(buf.String(), "suppressed=4") {
		t.Fatalf("no suppressed count:\n%s", &buf)
	}
}

func TestNilReceiverDiscards(t *testing.T) {
	var r *Logger
	r.Warn(context.Background(), "k", "m")
}

// A Logger made with nil writes to slog.Default() as it is when it warns.
func TestNilLoggerIsTheDefaultAtWarnTime(t *testing.T) {
	r := New(nil, time.Hour)
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	defer slog.SetDefault(prev)
	r.Warn(context.Background(), "k", "to the default")
	if !strings.Contains(buf.String(), "to the default") {
		t.Fatalf("slog.Default() got %q", &buf)
	}
}
