package locks

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script sent as EVALSHA with keys and arguments that the
// caller boxed once: go-redis's Script.Run boxes every key and argument into
// an interface on every call, which made up a third of a lock cycle's
// allocations.
//
// NOSCRIPT — a node that has not seen the script yet (new, restarted,
// promoted) — is handled one way throughout the package: the call is sent
// again as EVAL, which also caches the script there (toEval; pipelines do it
// in pipeline). SCRIPT LOAD is never used: on a cluster it goes to every
// master and fails while one is down.
type script struct {
	sha any // boxed once
}

// sources maps each script's SHA1 to its source, for falling back to EVAL
// (written only while the package initialises).
var sources = map[string]string{}

func newScript(src string) script {
	sum := sha1.Sum([]byte(src))
	sha := hex.EncodeToString(sum[:])
	sources[sha] = src
	return script{sha: sha}
}

// call is the EVALSHA command line.
func (s script) call(keys, args []any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.sha, len(keys))
	a = append(a, keys...)
	return append(a, args...)
}

// cmd is the EVALSHA command, for a pipeline.
func (s script) cmd(ctx context.Context, keys []any, args ...any) *redis.Cmd {
	return redis.NewCmd(ctx, s.call(keys, args)...)
}

// runVia sends the script through a batcher (see batcher.do): the call may
// share its round trip with others. cleanup (may be nil) names the call that
// undoes this one, should it run after ctx ended.
func (s script) runVia(ctx context.Context, b *batcher, cleanup func() []any, keys []any, args ...any) *redis.Cmd {
	return b.do(ctx, s.call(keys, args), cleanup)
}

// toEval turns an EVALSHA command line of a known script into EVAL in place.
func toEval(a []any) bool {
	if len(a) < 2 || a[0] != "evalsha" {
		return false
	}
	sha, _ := a[1].(string)
	src, ok := sources[sha]
	if ok {
		a[0], a[1] = "eval", src
	}
	return ok
}

func noScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// pipeline sends cmds in one pipeline on rdb; the script calls that failed
// with NOSCRIPT are sent again as EVAL, in place in cmds — in a second
// pipeline of their own, or, when whole is set, with every other command of
// cmds again too (a WAIT must follow the write it waits for, on the same
// connection). Each command carries its own error.
func pipeline(ctx context.Context, rdb interface{ Pipeline() redis.Pipeliner }, cmds []*redis.Cmd, whole bool) {
	send := func(cs []*redis.Cmd) {
		pipe := rdb.Pipeline()
		for _, c := range cs {
			_ = pipe.Process(ctx, c)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	send(cmds)
	var again []*redis.Cmd
	for i, c := range cmds {
		if noScript(c.Err()) && toEval(c.Args()) {
			cmds[i] = redis.NewCmd(ctx, c.Args()...)
			again = append(again, cmds[i])
		}
	}
	switch {
	case len(again) == 0:
	case whole:
		for i, c := range cmds {
			cmds[i] = redis.NewCmd(ctx, c.Args()...)
		}
		send(cmds)
	default:
		send(again)
	}
}

var (
	acquireS = newScript(acquireLua)
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
