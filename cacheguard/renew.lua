-- Extend the fill lease while its holder is still loading.
-- KEYS[1] fill lease   ARGV: token, lease ms
-- Returns 1 when extended, 0 when the lease is gone or another's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
