package main

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestEmbeddedCommands checks that the embedded server answers every command
// the library sends outside a cluster, inside Lua scripts too.
func TestEmbeddedCommands(t *testing.T) {
	e, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rdb := redis.NewClient(&redis.Options{Addr: e.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	for _, cmd := range [][]any{
		{"SET", "k", "v", "PX", 10000, "NX"},
		{"GET", "k"},
		{"EXISTS", "k", "missing"},
		{"INCR", "n"},
		{"HSET", "h", "o", "me", "n", 1},
		{"HMGET", "h", "o", "a", "n"},
		{"HINCRBY", "h", "n", -1},
		{"PEXPIRE", "h", 10000},
		{"PTTL", "h"},
		{"ZADD", "z", "NX", 1700000000123456, "m"},
		{"ZRANGE", "z", 0, 0},
		{"ZRANGEBYSCORE", "z", "-inf", 1800000000000000},
		{"ZREMRANGEBYSCORE", "z", "-inf", 1},
		{"ZREM", "z", "m"},
		{"PUBLISH", "c", "x"},
		{"DEL", "k", "h"},
		{"SCAN", 0, "MATCH", "*", "COUNT", 10},
		// Scripts: TIME, packed numbers, a publish from inside, a number reply.
		{"EVAL", `local t = redis.call('TIME')
			local f = tonumber(t[1]) * 1000000 + tonumber(t[2])
			redis.call('SET', KEYS[1], string.format('%.0f', f), 'PX', 1000)
			redis.call('ZADD', KEYS[2], 'NX', f, 'm')
			redis.call('PUBLISH', KEYS[3], 'w ' .. string.format('%.0f', f))
			return {1, f}`, 3, "f", "q", "c"},
	} {
		if err := rdb.Do(ctx, cmd...).Err(); err != nil && err != redis.Nil {
			t.Errorf("%v: %v", cmd[0], err)
		}
	}
	// EVALSHA after EVAL cached the script.
	s := redis.NewScript("return redis.call('TIME')[1]")
	if err := s.Run(ctx, rdb, nil).Err(); err != nil {
		t.Errorf("script: %v", err)
	}
	if err := rdb.EvalSha(ctx, s.Hash(), nil).Err(); err != nil {
		t.Errorf("EVALSHA: %v", err)
	}
	// SUBSCRIBE, then a message published by a script.
	ps := rdb.Subscribe(ctx, "wake")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatalf("SUBSCRIBE: %v", err)
	}
	if err := rdb.Eval(ctx, "return redis.call('PUBLISH', KEYS[1], 'hello')", []string{"wake"}).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-ps.Channel():
		if m.Payload != "hello" {
			t.Errorf("message %q", m.Payload)
		}
	case <-time.After(5 * time.Second):
		t.Error("no message")
	}
}

// TestEmbeddedExpiry checks that keys expire in real time (miniredis alone
// never expires them).
func TestEmbeddedExpiry(t *testing.T) {
	e, err := startEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rdb := redis.NewClient(&redis.Options{Addr: e.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	start := time.Now()
	if err := rdb.Set(ctx, "lease", "x", 50*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	for rdb.Exists(ctx, "lease").Val() == 1 {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the key never expired")
		}
		time.Sleep(time.Millisecond) // polling an observable condition, bounded above
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("expired after %v, before its 50ms", d)
	}
	e.Close()
	e.Close() // idempotent
}
