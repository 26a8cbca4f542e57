// Package ratelog rate-limits warnings to a *slog.Logger: each message key is
// logged at most once per interval, with the number of times it was
// suppressed since it was last logged.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Logger logs warnings through a *slog.Logger, at most once per interval for
// each key. A nil *Logger discards everything.
type Logger struct {
	l     *slog.Logger
	every time.Duration

	mu   sync.Mutex // guards keys
	keys map[string]*entry
}

type entry struct {
	last       time.Time
	suppressed int
}

// New returns a Logger writing to l at most once per interval for each key;
// when l is nil, to slog.Default() as it is when each warning is logged (so
// a program that sets its default logger after New still gets them). Keys should come from a small fixed set (one per kind of
// warning): each is remembered for the Logger's life.
func New(l *slog.Logger, interval time.Duration) *Logger {
	return &Logger{l: l, every: interval, keys: map[string]*entry{}}
}

// Warn logs msg with attrs at level Warn, unless key was logged less than the
// interval ago; then it only counts it. A logged message carries the count of
// those suppressed since the last one ("suppressed").
func (r *Logger) Warn(ctx context.Context, key, msg string, attrs ...slog.Attr) {
	if r == nil {
		return
	}
	l := r.l
	if l == nil {
		l = slog.Default()
	}
	if !l.Enabled(ctx, slog.LevelWarn) {
		return
	}
	now := time.Now()
	r.mu.Lock()
	e := r.keys[key]
	if e == nil {
		e = &entry{}
		r.keys[key] = e
	} else if now.Sub(e.last) < r.every {
		e.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := e.suppressed
	e.last, e.suppressed = now, 0
	r.mu.Unlock()
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed", suppressed))
	}
	l.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}
