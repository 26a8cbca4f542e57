-- Redlock: extend one acquisition's lease on one node.
-- KEYS[1] lock hash (see redlock_acquire.lua). ARGV: owner, acquisition id, lease ms.
-- Returns 1 when extended, 0 when the owner does not hold the lock here, 2 when the owner
-- holds it here without this acquisition (its other holds stand).
-- With other holds of the same owner present the lease is only raised, never
-- cut, so one hold's renewal cannot shorten another's validity.
local k, owner, acq, px = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('HGET', k, 'o') ~= owner then return 0 end
if redis.call('HEXISTS', k, acq) == 0 then return 2 end
if redis.call('HLEN', k) == 2 or redis.call('PTTL', k) < px then
  redis.call('PEXPIRE', k, px)
end
return 1
