package cacheguard_test

import (
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// item is the value type most tests cache.
type item struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

// testKey is a key unique to the test and the run (tests may run with -count).
func testKey(t testing.TB, suffix ...string) string {
	return strings.ReplaceAll(t.Name(), "/", ":") + ":" + rand.Text()[:8] + ":" + strings.Join(suffix, ":")
}

// shared returns a client of the server TestMain started, closed at cleanup.
func shared(t testing.TB) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// newGuard returns a Guard on its own client of the shared server (a Guard
// with its own client behaves like another process), closed at cleanup.
func newGuard(t testing.TB, opts ...cacheguard.Option) (*cacheguard.Guard, *redis.Client) {
	rdb := shared(t)
	g := cacheguard.New(rdb, opts...)
	t.Cleanup(func() { g.Close() })
	return g, rdb
}

// counter is a loader that counts its calls and returns item{n, name}.
type counter struct {
	n     atomic.Int64
	delay time.Duration
	name  string
}

func (c *counter) load(ctx context.Context) (item, error) {
	n := c.n.Add(1)
	if c.delay > 0 {
		select {
		case <-time.After(c.delay): // stands for the database's work
		case <-ctx.Done():
			return item{}, ctx.Err()
		}
	}
	return item{ID: int(n), Name: c.name}, nil
}

// eventually waits for an observable event, bounded by d.
var eventually = redistest.Eventually

// watchWaiting returns a channel closed once the Guard on rdb waits for
// another process's fill (redistest.FillWaiting).
var watchWaiting = redistest.FillWaiting

// replyHook is a go-redis hook that shows every reply, of a command sent
// alone or in a pipeline, to the function once it came.
type replyHook func(cmd redis.Cmder)

func (h replyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h replyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h(cmd)
		}
		return err
	}
}
func (h replyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h(cmd)
		return err
	}
}

// The Redis names of a test key's values hash, the field of its item value in
// it, and its item fill lease (see cacheguard/DESIGN.md, "Keys").
func valueKey(key string) string { return "cg:v:{" + key + "}" }
func leaseKey(key string) string { return "cg:fl:{" + key + "}|" + itemField }

// envHead is the length of an envelope's header (cacheguard/envelope.go).
const envHead = 40

const itemField = "github.com/cacheguard/cacheguard/cacheguard_test.item"

// storeRaw writes raw bytes as a test key's item value.
func storeRaw(ctx context.Context, rdb redis.UniversalClient, key string, raw []byte) error {
	if err := rdb.HSet(ctx, valueKey(key), itemField, raw).Err(); err != nil {
		return err
	}
	return rdb.Expire(ctx, valueKey(key), time.Hour).Err()
}
