// Package slot computes Redis Cluster hash slots, for the packages that route
// by slot (the wake-up hub, cacheguard's batches) and the test harness that
// builds clusters, and the hash tag that keeps every key of one name in one
// slot (the names of locks and of cache keys).
package slot

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Count is the number of hash slots in a Redis Cluster.
const Count = 16384

// Of returns the hash slot of key: CRC16 of its hash tag (the part between the
// first '{' and the next '}', when not empty), or of the whole key, mod 16384.
func Of(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % Count)
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), as Redis uses.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Tag returns the hash tag under which a name's keys are stored, and what
// follows the tag in them, so that every key of one name shares a slot: the
// name itself (cg:lock:{repo:42}), readable, unless the name contains '}',
// which would end the tag early (a name starting with '}' would leave it
// empty, and Redis would hash each whole key). Such a name is tagged with a
// hash of itself and follows the tag (cg:lock:{#1f0c…}a}b), so that every
// name keeps its keys in one slot and distinct names keep distinct keys.
func Tag(name string) (tag, rest string) {
	if strings.IndexByte(name, '}') < 0 {
		return name, ""
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	return "#" + strconv.FormatUint(h.Sum64(), 16), name
}
