package redistest

import "github.com/cacheguard/cacheguard/internal/slot"

// Short names for the shared slot arithmetic (parameters named slot shadow the package).
var keySlot = slot.Of

const clusterSlots = slot.Count
