// Package counter keeps the counters that guard correctness — cache
// generations and tag versions (and, in time, fence tokens) — never smaller
// than a value they had before, even when their key was lost, with one rule
// for what an absent counter means: newer than every value it ever had.
//
// Scripts that move or create a counter embed Lua (counterNext, counterRead,
// counterPeek: see counter.lua) with Script; readers parse a reply with
// Parse. A value recorded under a counter (an envelope's generation, its
// tags' versions) is current only while it is not older than the counter
// read. An absent counter reads as the server's clock (counterPeek, where a
// script reads it) or as Unknown (a plain GET): either way every recorded
// value is older and is refused — a miss, never a hit — and the next fill
// creates the counter again from the server's clock, later than every value
// recorded before. (The clock also tells what an absent counter cannot: a
// value recorded under a counter created after the read is not older.)
package counter

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"
)

//go:embed counter.lua
var lua string

// Unknown is what an absent counter reads as: newer than any value it had,
// so that nothing recorded under it is current.
const Unknown = math.MaxInt64

// Script returns body, a Lua script, with the counter functions before it.
func Script(body string) string { return lua + body }

// Parse reads a counter from the reply to a GET of it (s, err): Unknown when
// absent (err matches redis.Nil), else its value; any other error is
// returned as it is.
func Parse(s string, err error) (int64, error) {
	switch {
	case errors.Is(err, redis.Nil):
		return Unknown, nil
	case err != nil:
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("counter: bad value %q", s)
	}
	return v, nil
}
