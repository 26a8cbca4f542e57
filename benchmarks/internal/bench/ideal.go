package bench

import (
	"slices"
	"time"
)

// idealLoads is the fewest loads that can serve requests for keys (keys[i]
// sent at at[i], unix ns) from a cache whose entries stay fresh for ttl: per
// key, a load at the first request opens a window of ttl that serves every
// request inside it, and the first request after it needs the next load. No
// cache-aside system can do with fewer loads without serving values older
// than ttl (it could if a load's own duration delayed the window's end,
// which this count ignores: a few per cent at most for loads short against
// ttl).
func idealLoads(keys []int32, at []int64, ttl time.Duration) int {
	byKey := map[int32][]int64{}
	for i, k := range keys {
		byKey[k] = append(byKey[k], at[i])
	}
	n := 0
	for _, ts := range byKey {
		slices.Sort(ts)
		var until int64
		for i, t := range ts {
			if i == 0 || t >= until {
				n++
				until = t + int64(ttl)
			}
		}
	}
	return n
}
