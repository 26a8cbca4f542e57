package redistest

import "strings"

// clusterSlots is the number of hash slots in a Redis Cluster.
const clusterSlots = 16384

// keySlot is the Redis Cluster hash slot of key: CRC16 of its hash tag (the
// part between the first '{' and the next '}', when not empty) mod 16384.
//
// It repeats internal/wake's Slot so that redistest stays free of project
// packages: a package's in-package tests may import redistest without a cycle.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
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
