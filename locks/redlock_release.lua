-- Redlock: give back one acquisition on one node.
-- KEYS[1] lock hash (see redlock_acquire.lua). ARGV: owner, acquisition id.
-- Returns the owner's remaining holds (0 = key deleted), -1 when another owner
-- (or nobody) holds the key, -2 when the owner holds it without this acquisition.
local k, owner, acq = KEYS[1], ARGV[1], ARGV[2]
if redis.call('HGET', k, 'o') ~= owner then return -1 end
if redis.call('HDEL', k, acq) == 0 then return -2 end
local n = redis.call('HLEN', k) - 1
if n <= 0 then
  redis.call('DEL', k)
  return 0
end
return n
