package systems

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// Trace records what a cacheguard system did in one process, to investigate
// a run: its observer's events (all but hits) and every command its client
// sent. It is safe for concurrent use.
type Trace struct {
	mu     sync.Mutex // guards events
	events []TraceEvent
}

// TraceEvent is one event or command.
type TraceEvent struct {
	At   int64  `json:"at"`            // unix ns; a command's send
	End  int64  `json:"end,omitempty"` // a command's return
	What string `json:"what"`          // the event's kind, or the command's name (with the script's SHA1 prefix)
	Key  string `json:"key,omitempty"` // the event's key, or the command's first key
	Dur  int64  `json:"dur,omitempty"` // a load's duration
	Err  string `json:"err,omitempty"`
}

func (t *Trace) add(e TraceEvent) {
	t.mu.Lock()
	t.events = append(t.events, e)
	t.mu.Unlock()
}

// Events returns what was recorded so far.
func (t *Trace) Events() []TraceEvent {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]TraceEvent(nil), t.events...)
}

func (t *Trace) observe(e cacheguard.Event) {
	if e.Kind == cacheguard.EventHit || e.Kind == cacheguard.EventNearHit {
		return
	}
	ev := TraceEvent{At: time.Now().UnixNano(), What: e.Kind.String(), Key: e.Key, Dur: int64(e.Duration)}
	if e.Err != nil {
		ev.Err = e.Err.Error()
	}
	t.add(ev)
}

// command records cmd, sent at start.
func (t *Trace) command(cmd redis.Cmder, start time.Time, end int64) {
	args := cmd.Args()
	ev := TraceEvent{At: start.UnixNano(), End: end, What: cmd.Name()}
	key := 1
	if ev.What == "evalsha" || ev.What == "eval" {
		if s, ok := args[1].(string); ok && len(s) >= 8 {
			ev.What += " " + s[:8]
		}
		key = 3
	}
	if len(args) > key {
		if s, ok := args[key].(string); ok {
			ev.Key = s
		}
	}
	if err := cmd.Err(); err != nil && err != redis.Nil {
		ev.Err = err.Error()
	}
	t.add(ev)
}

// traceHook records every command of a client in a Trace.
type traceHook struct{ t *Trace }

func (h traceHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h traceHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		h.t.command(cmd, start, time.Now().UnixNano())
		return err
	}
}

func (h traceHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		end := time.Now().UnixNano()
		for _, c := range cmds {
			h.t.command(c, start, end)
		}
		return err
	}
}
