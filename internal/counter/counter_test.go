package counter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/counter"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

var addr string

func TestMain(m *testing.M) { redistest.Main(m, &addr) }

var (
	next = redis.NewScript(counter.Script(`return counterNext(KEYS[1], ARGV[1])`))
	read = redis.NewScript(counter.Script(`return counterRead(KEYS[1], ARGV[1])`))
	peek = redis.NewScript(counter.Script(`return counterPeek(KEYS[1])`))
)

// A counter never goes back, even when its key is lost between two moves; an
// absent one reads as newer than every value it had (Parse: Unknown; Peek:
// the clock), and is created again later than them.
func TestCounterSurvivesItsLoss(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	k := "counter:" + t.Name() + ":" + strconv.FormatInt(time.Now().UnixNano(), 10) // unique per run (-count)
	num := func(s string, err error) int64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v, err := counter.Parse(rdb.Get(ctx, k).Result()); err != nil || v != counter.Unknown {
		t.Fatalf("absent: %d, %v; want Unknown", v, err)
	}
	last := int64(0)
	for i := range 200 {
		var v int64
		switch i % 4 {
		case 0:
			v = num(next.Run(ctx, rdb, []string{k}, 60000).Text())
		case 1:
			v = num(read.Run(ctx, rdb, []string{k}, 60000).Text())
			if v < last {
				t.Fatalf("read %d after %d", v, last)
			}
			continue
		case 2:
			rdb.Del(ctx, k) // lost
			if p := num(peek.Run(ctx, rdb, []string{k}).Text()); p <= last {
				t.Fatalf("absent counter peeked as %d, not newer than %d", p, last)
			}
			v = num(read.Run(ctx, rdb, []string{k}, 60000).Text())
		case 3:
			// Many moves in one microsecond: the counter, not the clock.
			v = num(next.Run(ctx, rdb, []string{k}, 60000).Text())
		}
		if v <= last {
			t.Fatalf("step %d: %d after %d", i, v, last)
		}
		last = v
	}
	if pt := rdb.PTTL(ctx, k).Val(); pt <= 0 {
		t.Fatalf("counter without a life: %v", pt)
	}
}
