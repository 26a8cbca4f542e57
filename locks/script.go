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
	src, sha any // boxed once
}

func newScript(src string) script {
	return script{src: src, sha: redis.NewScript(src).Hash()}
}

// run sends EVALSHA, and EVAL when the node does not have the script yet (a
// new, restarted or promoted server); EVAL also caches it there.
func (s script) run(ctx context.Context, rdb redis.UniversalClient, keys []any, args ...any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.sha, len(keys))
	a = append(a, keys...)
	a = append(a, args...)
	cmd := rdb.Do(ctx, a...)
	if err := cmd.Err(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		a[0], a[1] = "eval", s.src
		cmd = rdb.Do(ctx, a...)
	}
	return cmd
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
