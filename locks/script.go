package locks

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script sent as EVALSHA with keys and arguments that the
// caller boxed once: go-redis's Script.Run boxes every key and argument into
// an interface on every call, which made up a third of a lock cycle's
// allocations.
type script struct {
	sha any // boxed once
}

// sources maps each script's SHA1 to its source, for falling back to EVAL
// (written only while the package initialises).
var sources = map[string]string{}

func newScript(src string) script {
	sha := redis.NewScript(src).Hash()
	sources[sha] = src
	return script{sha: sha}
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

// run sends EVALSHA, and EVAL when the node does not have the script yet (a
// new, restarted or promoted server); EVAL also caches it there.
func (s script) run(ctx context.Context, rdb redis.UniversalClient, keys []any, args ...any) *redis.Cmd {
	a := s.call(keys, args)
	cmd := rdb.Do(ctx, a...)
	if noScript(cmd.Err()) && toEval(a) {
		cmd = rdb.Do(ctx, a...)
	}
	return cmd
}

// runVia is run through a batcher, which falls back to EVAL itself: the call
// may share its round trip with others. abandon (may be nil) gets the reply
// when it came after ctx ended.
func (s script) runVia(ctx context.Context, b *batcher, abandon func(*redis.Cmd), keys []any, args ...any) *redis.Cmd {
	return b.do(ctx, s.call(keys, args), abandon)
}

// call is the EVALSHA command line.
func (s script) call(keys, args []any) []any {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.sha, len(keys))
	a = append(a, keys...)
	return append(a, args...)
}

func noScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

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
