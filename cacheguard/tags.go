package cacheguard

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Each tag has a version in Redis (prefix+"t:{tag}"), read by a fill before
// its load and recorded in the envelope, moved forward by InvalidateTags, and
// read with the value by a tagged call: judge refuses older recorded
// versions (DESIGN.md, Tags).

// maxTags bounds the tags of one call.
const maxTags = 16

// tagSet is a call's tags, sorted and without duplicates.
type tagSet struct {
	names []string
	hash  uint64 // recorded in the envelope
	id    string // the hash in text, in the representation
	key   string // the names joined, to tell near-cache entries apart
}

// Tags marks the value as depending on tags — e.g. a list page on "repos" —
// so that InvalidateTags of any of them voids it, in every process, like an
// Invalidate of its key: a call that begins after InvalidateTags returned
// never gets a value whose load began before it. The tags are part of the
// entry: a call with other tags (or none) reads and fills an entry of its
// own under the same key, and Invalidate(key) voids them all. At most 16
// tags, each a valid key. The default is none; Tags() with no tag is the same:
// the entry of a call without Tags.
func Tags(tags ...string) CallOption {
	if len(tags) == 0 {
		return callOption(func(c *config) { c.tags = nil })
	}
	names := slices.Clone(tags)
	slices.Sort(names)
	names = slices.Compact(names)
	h := fnv.New64a()
	for _, t := range names {
		h.Write([]byte(t))
		h.Write([]byte{0})
	}
	ts := &tagSet{names: names, hash: h.Sum64(), key: strings.Join(names, "\x00")}
	ts.id = strconv.FormatUint(ts.hash, 36)
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
		if err := validTag(t); err != nil {
			return err
		}
	}
	return nil
}

func validTag(t string) error { return validName("tag", t) }

func (ts *tagSet) list() []string {
	if ts == nil {
		return nil
	}
	return ts.names
}

// current reports whether e was stored under this tag set, with versions no
// older than cur (those a call read, nil when it read none).
func (ts *tagSet) current(e *envelope, cur []uint64) bool {
	if ts == nil {
		return e.tagVers == nil
	}
	if e.tagVers == nil || e.tagHash != ts.hash || len(e.tagVers) != len(ts.names) {
		return false
	}
	for i, v := range cur {
		if e.tagVers[i] < v {
			return false
		}
	}
	return true
}

// InvalidateTags voids every value stored with any of tags (see Tags), of
// every key, in every process: the tags' versions move forward in Redis, so
// that a call that begins after InvalidateTags returned — in any process —
// never gets a value whose load began before it, and every near cache drops
// the values carrying them (another process's, when the message arrives).
// It costs one small script per tag (on a cluster, in each tag's own slot;
// one round trip per node) and nothing per key. When
// Redis cannot be reached it returns an error matching ErrUnavailable; when
// ctx ends first, ctx's error (see Invalidate).
func (g *Guard) InvalidateTags(ctx context.Context, tags ...string) error {
	return g.invalidate(ctx, "invalidate tags", tags, validTag, func(t string) redis.Cmder {
		return tagBumpScript.Cmd(ctx, keys(g.name("t:", t)), genTTL.Milliseconds(), g.ncChannel, g.origin+" t"+t)
	}, func(ts []string) { g.near.dropTags(ts) })
}
