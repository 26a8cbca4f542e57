package cacheguard

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tags are invalidated without knowing the keys that carry them: each tag has
// a version in Redis (prefix+"t:{tag}", one small key per tag, in the tag's
// own slot), which a load of a tagged value reads before it begins and stores
// in the envelope, and which InvalidateTags moves forward. A tagged call reads
// its tags' versions with the value (in the same round trip: one pipeline, on
// a cluster one per node, in parallel), and a value whose recorded versions
// are older than the current ones is stale. No tag→key set is kept, so
// nothing grows with the number of keys, and no command spans two slots.

var (
	//go:embed tagread.lua
	tagReadLua string
	//go:embed tagbump.lua
	tagBumpLua string

	tagReadScript = redis.NewScript(tagReadLua)
	tagBumpScript = redis.NewScript(tagBumpLua)
)

// maxTags bounds the tags of one call.
const maxTags = 16

// tagSet is a call's tags, sorted and without duplicates.
type tagSet struct {
	names []string
	hash  uint64 // recorded in the envelope, to tell tag sets apart
	key   string // the names joined, for the coalescing of reads and flights
}

// Tags marks the value as depending on tags — e.g. a list page on "repos" —
// so that InvalidateTags of any of them voids it, in every process, like an
// Invalidate of its key: a Get that begins after InvalidateTags returned never
// returns a value whose load began before it. A call reads the current
// versions of its tags with the value (see the package documentation,
// Tags); values of one key stored with other tags (or none) are not served to
// it. At most 16 tags, each a valid key. The default is none.
func Tags(tags ...string) CallOption {
	names := slices.Clone(tags)
	slices.Sort(names)
	names = slices.Compact(names)
	h := fnv.New64a()
	for _, t := range names {
		h.Write([]byte(t))
		h.Write([]byte{0})
	}
	ts := &tagSet{names: names, hash: h.Sum64(), key: strings.Join(names, "\x00")}
	return callOption(func(c *config) { c.tags = ts })
}

func (ts *tagSet) validate() error {
	if ts == nil {
		return nil
	}
	if len(ts.names) > maxTags {
		return invalid("%d tags, more than %d", len(ts.names), maxTags)
	}
	for _, t := range ts.names {
		if err := validKey(t); err != nil {
			return fmt.Errorf("tag: %w", err)
		}
	}
	return nil
}

func (ts *tagSet) list() []string {
	if ts == nil {
		return nil
	}
	return ts.names
}

// tagKey is the Redis name of a tag's version.
func (g *Guard) tagKey(tag string) string { return g.cfg.prefix + "t:{" + hashTag(tag) + "}" }

// fresh reports whether a stored envelope was loaded under the current
// versions of the call's tags (cur, read with it).
func (ts *tagSet) fresh(e *envelope, cur []uint64) bool {
	if ts == nil {
		return true
	}
	if e.tagVers == nil || e.tagHash != ts.hash || len(e.tagVers) != len(cur) {
		return false
	}
	for i, v := range cur {
		if e.tagVers[i] < v {
			return false
		}
	}
	return true
}

// atLeast reports whether versions recorded by a load (got) are no older
// than the ones a call read (want): the load began after every tag
// invalidation that returned before the call's read.
func (ts *tagSet) atLeast(got []uint64, hash uint64, want []uint64) bool {
	if ts == nil {
		return true
	}
	if hash != ts.hash || len(got) != len(want) {
		return false
	}
	for i := range want {
		if got[i] < want[i] {
			return false
		}
	}
	return true
}

// readTagVersions reads (creating the absent ones) the versions of tags for a
// load about to begin, whose value will live ttl.
func (g *Guard) readTagVersions(ctx context.Context, tags []string, ttl time.Duration) ([]uint64, error) {
	pipe := g.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(tags))
	for i, t := range tags {
		cmds[i] = tagReadScript.Eval(ctx, pipe, []string{g.tagKey(t)}, max(ttl.Milliseconds(), genTTL.Milliseconds()))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	vers := make([]uint64, len(tags))
	for i, c := range cmds {
		s, err := c.Text()
		if err != nil {
			return nil, err
		}
		if vers[i], err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, fmt.Errorf("cacheguard: tag version %q: %w", s, err)
		}
	}
	return vers, nil
}

// InvalidateTags voids every value stored with any of tags (see Tags), of
// every key, in every process: the tags' versions move forward in Redis, so
// that a Get that begins after InvalidateTags returned — in any process —
// never returns a value whose load began before it, and every near cache
// drops the values carrying them. It costs one small script per tag (on a
// cluster, in each tag's own slot; one round trip per node) and nothing per
// key. When Redis cannot be reached it returns an error matching
// ErrUnavailable.
func (g *Guard) InvalidateTags(ctx context.Context, tags ...string) error {
	if g == nil {
		return invalid("nil Guard")
	}
	for _, t := range tags {
		if err := validKey(t); err != nil {
			return fmt.Errorf("tag: %w", err)
		}
	}
	if g.isClosed() {
		return ErrClosed
	}
	if len(tags) == 0 {
		return nil
	}
	if g.near != nil {
		for _, t := range tags {
			g.near.dropTag(t)
		}
		defer func() {
			for _, t := range tags {
				g.near.dropTag(t)
			}
		}()
	}
	pipe := g.rdb.Pipeline()
	cmds := make([]*redis.Cmd, len(tags))
	for i, t := range tags {
		cmds[i] = tagBumpScript.Eval(ctx, pipe, []string{g.tagKey(t)}, genTTL.Milliseconds(), g.ncChannel, g.origin+" t"+t)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		var errs []error
		for i, c := range cmds {
			if err := c.Err(); err != nil {
				errs = append(errs, fmt.Errorf("tag %q: %w", tags[i], err))
			}
		}
		err = errors.Join(errs...)
		g.note(ctx, EventRedisError, tags[0], 0, err)
		return fmt.Errorf("%w: invalidate tags: %w", ErrUnavailable, err)
	}
	return nil
}
