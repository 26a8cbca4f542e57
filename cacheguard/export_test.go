package cacheguard

import "time"

// NearLen is the number of entries in g's near cache.
func NearLen(g *Guard) int {
	n := 0
	g.near.m.Range(func(_, v any) bool {
		if reps := v.(*nearNode).reps.Load(); reps != nil {
			n += len(*reps)
		}
		return true
	})
	return n
}

// NearTrusted reports whether g's near cache is subscribed and trusted now.
func NearTrusted(g *Guard) bool {
	_, until := unpackState(g.near.state.Load())
	return g.near.mono(time.Now()) < until
}
