-- Extend the fill lease while its holder is still loading, and the key's
-- generation with it.
-- KEYS[1] fill lease   KEYS[2] generation
-- ARGV: lease ("<generation> <token>"), lease ms, generation
-- Returns 1 when extended, 0 when the lease is gone or another's, or the key
-- was invalidated since it was granted (the store would fail).
if redis.call('GET', KEYS[1]) ~= ARGV[1] or redis.call('GET', KEYS[2]) ~= ARGV[3] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local gt = redis.call('PTTL', KEYS[2])
if gt >= 0 and gt < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
