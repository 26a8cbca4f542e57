package cacheguard

import (
	"crypto/sha256"
	"encoding/base64"
	"reflect"
	"strings"
	"unsafe"

	"github.com/cacheguard/cacheguard/internal/slot"
)

// names are the Redis names of one entry — a cache key in one representation
// — all under the key's hash tag, so that they share a slot on a cluster: the
// generation, the values hash and the wake-up channel belong to the key
// (every representation shares them), the field in that hash and the fill
// lease to the representation.
type names struct {
	gen, values, field, lease, wake string
}

// maxTypeName bounds the type name inside a key; a longer one is hashed.
const maxTypeName = 64

// typeName names a value type inside Redis names: its Go name with the
// package path of every named type in it (e.g. "example.com/app/model.Repo",
// "[]example.com/app/model.Repo"), or a hash of it when long or when it holds
// a '|' (a struct tag's; see representation). (Two types of one name declared
// in different functions of one package still share it.)
// Built once per type and Guard (building it allocates; the hit path must not).
func (g *Guard) typeName(t reflect.Type) string {
	if s, ok := g.typeNames.Load(t); ok {
		return s.(string)
	}
	s := typeString(t)
	if len(s) > maxTypeName || strings.IndexByte(s, '|') >= 0 {
		sum := sha256.Sum256([]byte(s))
		s = "#" + base64.RawURLEncoding.EncodeToString(sum[:12])
	}
	g.typeNames.Store(t, s)
	return s
}

// typeString is reflect's String of t with package paths for the names of
// named types, its elements' included (struct, func and chan literals as
// String has them).
func typeString(t reflect.Type) string {
	switch s := t.String(); {
	case t.Name() != "" && t.PkgPath() != "":
		return t.PkgPath() + "." + t.Name()
	case t.Name() == "" && (t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		return s[:len(s)-len(t.Elem().String())] + typeString(t.Elem())
	case t.Name() == "" && t.Kind() == reflect.Map:
		return "map[" + typeString(t.Key()) + "]" + typeString(t.Elem())
	default:
		return s
	}
}

// representation names the form a value is stored in under a key: its type,
// the call's Variant and its tag set (see Tags), so that values of different
// types, variants or tags never share an entry, a fill or a near-cache slot.
// Its parts are joined by '|' and a tag set's starts with '#' (then base 36):
// a Variant that contains '|' or starts with '#' is written as "#=" and its
// base64 (which has neither), so that no name is two representations'.
func (g *Guard) representation(t reflect.Type, variant string, tags *tagSet) string {
	rep := g.typeName(t)
	switch {
	case variant == "":
	case variant[0] == '#' || strings.IndexByte(variant, '|') >= 0:
		rep += "|#=" + base64.RawURLEncoding.EncodeToString([]byte(variant))
	default:
		rep += "|" + variant
	}
	if tags != nil {
		rep += "|#" + tags.id
	}
	return rep
}

// name returns the Redis name of kind ("v:" a values hash, "t:" a tag's
// version) for key, under key's hash tag.
func (g *Guard) name(kind, key string) string {
	tag, rest := slot.Tag(key)
	return g.cfg.prefix + kind + "{" + tag + "}" + rest
}

// readLine returns the command line of a read of key's entry in the
// representation field (see hget), the name of key's values hash (see name)
// built into it when it fits: a hit's name and line in one allocation.
func (g *Guard) readLine(key, field string) *hget {
	tag, rest := slot.Tag(key)
	p := g.cfg.prefix
	var l *hitLine
	if n := len(p) + len("v:{}") + len(tag) + len(rest); n > len(l.buf) {
		return newLine(p+"v:{"+tag+"}"+rest, field)
	}
	l = new(hitLine)
	b := append(append(append(append(append(l.buf[:0], p...), "v:{"...), tag...), '}'), rest...)
	l.name, l.field = unsafe.String(&b[0], len(b)), field // l.buf, written here only
	l.args = [3]any{"hget", &l.name, &l.field}
	return &l.hget
}

// valuesKeys returns the names of the values hashes of keys (see name),
// built in one buffer rather than one allocation each.
func (g *Guard) valuesKeys(keys []string) []string {
	p := g.cfg.prefix
	n := 0
	for _, k := range keys {
		n += len(p) + len("v:{}") + len(k)
	}
	var b strings.Builder
	b.Grow(n) // a long hash tag (see slot.Tag) grows it; the names cut before stay valid
	out := make([]string, len(keys))
	for i, k := range keys {
		tag, rest := slot.Tag(k)
		from := b.Len()
		b.WriteString(p)
		b.WriteString("v:{")
		b.WriteString(tag)
		b.WriteByte('}')
		b.WriteString(rest)
		out[i] = b.String()[from:]
	}
	return out
}

// goneKey is the name of the tokens whose request for n's fill lease was
// given back (see release.lua), beside the lease ("fg:" for "fl:"). Made on
// the miss path only: the hit path never needs it.
func (g *Guard) goneKey(n names) string {
	p := len(g.cfg.prefix)
	return n.lease[:p] + "fg:" + n.lease[p+len("fl:"):]
}

// names returns every Redis name of key in representation rep.
func (g *Guard) names(key, rep string) names {
	tag, rest := slot.Tag(key)
	t := "{" + tag + "}" + rest
	p := g.cfg.prefix
	return names{gen: p + "g:" + t, values: p + "v:" + t, field: rep, lease: p + "fl:" + t + "|" + rep, wake: p + "fw:" + t}
}
