package reliability

import (
	"context"
	_ "embed"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

var (
	//go:embed control_acquire.lua
	controlAcquireLua string
	//go:embed control_release.lua
	controlReleaseLua string

	controlAcquire = redis.NewScript(controlAcquireLua)
	controlRelease = redis.NewScript(controlReleaseLua)
)

// brokenMutex is a negative control: a lock with one of the two checks every
// Redis lock needs removed, to show that the checkers catch the difference.
type brokenMutex struct {
	rdb          redis.Scripter
	name         string
	lease        time.Duration
	noNX         bool // acquire overwrites a holder (SET without NX)
	noTokenCheck bool // release deletes whoever holds the lock (plain DEL)
}

// acquire retries every few milliseconds while wait is set, as naive locks
// do (the control has no push wake-up), for at most twice the lease.
func (m brokenMutex) acquire(ctx context.Context, wait bool) (holding, error) {
	deadline := time.Now().Add(2 * m.lease)
	for {
		h, err := m.try(ctx)
		if err != errRefused || !wait || time.Now().After(deadline) {
			return h, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (m brokenMutex) try(ctx context.Context) (holding, error) {
	tok := locks.NewOwnerID()
	nx := "1"
	if m.noNX {
		nx = "0"
	}
	sent := time.Now()
	f, err := controlAcquire.Run(ctx, m.rdb, []string{"ctl:lock:" + m.name, "ctl:fence:" + m.name}, tok, m.lease.Milliseconds(), nx).Int64()
	if err != nil {
		return nil, err
	}
	if f == 0 {
		return nil, errRefused
	}
	return &brokenHold{m: m, tok: tok, fence: uint64(f), deadline: sent.Add(m.lease)}, nil
}

type brokenHold struct {
	m        brokenMutex
	tok      string
	fence    uint64
	deadline time.Time
}

func (h *brokenHold) Fence() uint64      { return h.fence }
func (h *brokenHold) TTL() time.Duration { return max(0, time.Until(h.deadline)) }

func (h *brokenHold) Unlock(ctx context.Context) error {
	check := "1"
	if h.m.noTokenCheck {
		check = "0"
	}
	n, err := controlRelease.Run(ctx, h.m.rdb, []string{"ctl:lock:" + h.m.name}, h.tok, check).Int()
	switch {
	case err != nil:
		return err
	case n == 0:
		return locks.ErrNotHeld
	}
	return nil
}
