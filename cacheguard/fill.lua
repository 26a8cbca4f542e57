-- Store a loaded value only while the fill lease still holds this token and
-- the key's generation is still the one the lease was granted under (a
-- compare-and-set: an invalidation or an expired lease means nothing is
-- written), release the lease and wake the waiters with the value itself,
-- naming the token (a waiter trusts only the fill whose lease it saw: a
-- message from an earlier fill may still be on its way when an invalidation
-- has come between).
-- KEYS[1] value   KEYS[2] fill lease   KEYS[3] generation
-- ARGV: lease ("<generation> <token>"), envelope, value ttl ms, wake channel,
--       publish command (PUBLISH or SPUBLISH), token, generation
-- Returns 1 when stored, 0 when the lease was no longer this token's or an
-- invalidation came after it was granted.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if redis.call('GET', KEYS[3]) ~= ARGV[7] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
-- The generation outlives every value stored under it: were it to expire
-- first, a value could not be told from one of a later generation.
local gt = redis.call('PTTL', KEYS[3])
if gt >= 0 and gt < tonumber(ARGV[3]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
redis.call(ARGV[5], ARGV[4], 'v' .. ARGV[6] .. ' ' .. ARGV[2])
return 1
