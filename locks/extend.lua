-- Extend the lease of a lock held by owner. KEYS[1] lock hash. ARGV: owner, lease ms.
-- Returns 1 when extended, 0 when the lock is not held by owner.
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
