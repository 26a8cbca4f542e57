-- Redlock: give back one acquisition on one node.
-- KEYS[1] lock hash (see redlock_acquire.lua), KEYS[2] the acquisition's tombstone.
-- ARGV: owner, acquisition id, the acquisition's lease ms, the tombstone's life ms.
-- A release ends the acquisition (an attempt: each has its own id) on this node for
-- good. When the node has nothing of it, the attempt's request may still come (written
-- into a stall, or retried by go-redis) and would take a hold nobody keeps — or, for an
-- owner holding the lock, add a hold to that holding that outlives its release: the
-- release then leaves a tombstone, kept as long as such a request may come
-- (rcmd.CleanupHorizon, not the lease: a stall outlasts it), and redlock_acquire.lua
-- refuses it.
-- Returns the owner's remaining holds (0 = key deleted), -1 when another owner
-- (or nobody) holds the key, -2 when the owner holds it without this acquisition.
local k, owner, acq = KEYS[1], ARGV[1], ARGV[2]
local mine = redis.call('HGET', k, 'o') == owner
if not mine or redis.call('HDEL', k, acq) == 0 then
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[4])
  if mine then return -2 end
  return -1
end
local n = redis.call('HLEN', k) - 1
if n <= 0 then
  redis.call('DEL', k)
  return 0
end
return n
