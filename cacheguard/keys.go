package cacheguard

import (
	"crypto/sha256"
	"encoding/base64"
	"reflect"
	"strings"
)

// keySet holds the Redis names of one representation of one cache key, all
// under one hash tag so that they share a slot on a cluster: the generation
// and the wake-up channel belong to the cache key (every representation
// shares them), the envelope and the fill lease to the representation.
type keySet struct {
	gen, value, lease, wake string
}

// hashTag returns what goes between the braces of key's Redis names. A key
// that contains no '}' and does not start with '~' is used as it is, so the
// names stay readable; any other key is written as '~' and the key in
// unpadded base64url, which has no braces (an empty tag, or a '}' inside it,
// would split the entry's names over several slots). Both forms are
// injective and cannot meet: only the encoded form starts with '~'.
func hashTag(key string) string {
	if strings.IndexByte(key, '}') < 0 && !strings.HasPrefix(key, "~") {
		return key
	}
	return "~" + base64.RawURLEncoding.EncodeToString([]byte(key))
}

// maxTypeName bounds the type name inside a key; a longer one is hashed.
const maxTypeName = 64

// typeName names a value type inside Redis names: its Go name (reflect's
// String, e.g. "main.Repo" or "[]model.Repo"), or a hash of it when long.
func typeName(t reflect.Type) string {
	s := t.String()
	if len(s) <= maxTypeName {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "#" + base64.RawURLEncoding.EncodeToString(sum[:12])
}

// representation names the form a value is stored in under a key: its type,
// and the call's Variant if any.
func representation(t reflect.Type, variant string) string {
	if variant == "" {
		return typeName(t)
	}
	return typeName(t) + "|" + variant
}

// readKeys returns the generation and value names of a representation (what
// a hit reads), cut from one string so that a hit allocates once for both.
func (g *Guard) readKeys(key, rep string) (gen, value string) {
	tag := hashTag(key)
	p := g.cfg.prefix
	s := p + "g:{" + tag + "}" + p + "v:{" + tag + "}|" + rep
	n := len(p) + len("g:{") + len(tag) + len("}")
	return s[:n], s[n:]
}

// keys returns every Redis name of a representation.
func (g *Guard) keys(key, rep string) keySet {
	tag := "{" + hashTag(key) + "}"
	p := g.cfg.prefix
	return keySet{gen: p + "g:" + tag, value: p + "v:" + tag + "|" + rep, lease: p + "fl:" + tag + "|" + rep, wake: p + "fw:" + tag}
}

// cacheKeys returns the names of a cache key that every representation
// shares: the generation and the wake-up channel.
func (g *Guard) cacheKeys(key string) (gen, wake string) {
	tag := "{" + hashTag(key) + "}"
	return g.cfg.prefix + "g:" + tag, g.cfg.prefix + "fw:" + tag
}
