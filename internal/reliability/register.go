package reliability

import (
	"context"
	_ "embed"
	"errors"
	"strconv"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed fenced_write.lua
	fencedWriteLua    string
	fencedWriteScript = redis.NewScript(fencedWriteLua)
)

// Register is the resource a lock protects in these tests: one value with the
// fence token of its last write, kept in a hash on a Redis server that the
// faults leave alone. Writes are fenced unless Unfenced is set (a negative
// control standing for a resource that ignores tokens).
type Register struct {
	RDB      redis.Cmdable
	Key      string
	Unfenced bool
}

// Write applies value with the writer's fence token; false when refused.
func (r Register) Write(ctx context.Context, fence uint64, value string) (bool, error) {
	check := "1"
	if r.Unfenced {
		check = "0"
	}
	n, err := fencedWriteScript.Run(ctx, r.RDB, []string{r.Key}, strconv.FormatUint(fence, 10), value, check).Int()
	return n == 1, err
}

// Read returns the value last applied and its token (0, "" when none).
func (r Register) Read(ctx context.Context) (uint64, string, error) {
	v, err := r.RDB.HMGet(ctx, r.Key, "f", "v").Result()
	if err != nil {
		return 0, "", err
	}
	if v[0] == nil {
		return 0, "", nil
	}
	fs, _ := v[0].(string)
	val, _ := v[1].(string)
	f, err := strconv.ParseUint(fs, 10, 64)
	if err != nil {
		return 0, "", errors.New("reliability: corrupt register token " + strconv.Quote(fs))
	}
	return f, val, nil
}
