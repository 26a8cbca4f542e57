-- Extend the lease of a lock held by owner. KEYS[1] lock hash. ARGV: owner, lease ms.
-- Returns 1 when extended, 0 when the lock is not held by owner. While the owner
-- holds it more than once (re-entered with different leases), a renewal of one
-- hold never shortens the lease another hold relies on.
local cur = redis.call('HMGET', KEYS[1], 'o', 'n')
if cur[1] ~= ARGV[1] then return 0 end
local lease = tonumber(ARGV[2])
if tonumber(cur[2]) > 1 and redis.call('PTTL', KEYS[1]) > lease then return 1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
