package locks

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// script is a Lua script of this package, run through internal/rcmd as every
// Redis call of ours is: EVALSHA, alone or in a pipeline, with NOSCRIPT (a
// node that has not seen the script yet: new, restarted, promoted) answered
// once by EVAL, and every call bounded by the command timeout. Keys and
// arguments are boxed by the caller, once: go-redis's Script.Run boxes every
// key and argument into an interface on every call, which made up a third of
// a lock cycle's allocations.
type script struct {
	*rcmd.Script
	sha string // its SHA1, as EVALSHA carries it (tests)
}

func newScript(src string) script {
	s := rcmd.NewScript(src)
	return script{Script: s, sha: s.SHA()}
}

// newGrant is newScript for a script that grants a lock: go-redis never
// sends its calls again on its own (see rcmd.Script.Grant).
func newGrant(src string) script {
	s := newScript(src)
	s.Grant()
	return s
}

// call is the EVALSHA command line.
func (s script) call(keys, args []any) []any { return s.Args(keys, args...) }

// cmd is the EVALSHA command, for a pipeline (exec).
func (s script) cmd(ctx context.Context, keys []any, args ...any) *redis.Cmd {
	return s.Cmd(ctx, keys, args...)
}

// runVia sends the script through a batcher (see batcher.do): the call may
// share its round trip with others. cleanup (may be nil) names the call that
// undoes this one, should it run after ctx ended, and whether to keep it then
// (see batcher.do).
func (s script) runVia(ctx context.Context, b *batcher, cleanup func() ([]any, func() bool), keys []any, args ...any) *redis.Cmd {
	return b.do(ctx, s.call(keys, args), cleanup)
}

// exec sends cmds in one pipeline on p through run (see rcmd.Runner.Exec:
// bounded by the command timeout plus extra, NOSCRIPT answered with EVAL,
// whole re-sending every command then).
func exec(ctx context.Context, run *rcmd.Runner, p rcmd.Pipeliner, cmds []*redis.Cmd, extra time.Duration, whole bool) {
	cs := make([]redis.Cmder, len(cmds))
	for i, c := range cmds {
		cs[i] = c
	}
	run.Exec(ctx, p, cs, extra, whole)
}

var (
	acquireS = newGrant(acquireLua)
	releaseS = newScript(releaseLua)
	extendS  = newScript(extendLua)
)

// boxKeys boxes a lock's keys once for every script call on it.
func boxKeys(ks []string) []any {
	v := make([]any, len(ks))
	for i, k := range ks {
		v[i] = k
	}
	return v
}
