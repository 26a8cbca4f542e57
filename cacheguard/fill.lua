-- Store a loaded value only while the fill lease still holds this token and
-- the key's generation is still the one the lease was granted under (a
-- compare-and-set: an invalidation or an expired lease means nothing is
-- written), release the lease and wake the waiters with the value itself,
-- naming the lease, generation and token (a waiter trusts only the fill of
-- the lease it saw: a message from an earlier fill may still be on its way
-- when an invalidation has come between, and one token can hold the lease
-- under two generations: see call.fromWake).
-- KEYS[1] values (a hash: one envelope per representation)
-- KEYS[2] fill lease   KEYS[3] generation
-- ARGV: lease ("<generation> <token>"), envelope, value ttl ms, wake channel,
--       publish command (PUBLISH or SPUBLISH), generation, the
--       representation's field, now (unix ms), the near-cache channel and its
--       message (a classic channel, so PUBLISH, even on a cluster)
-- Returns 1 when stored, 0 when the lease was no longer this token's or an
-- invalidation came after it was granted.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if redis.call('GET', KEYS[3]) ~= ARGV[6] then
  return 0
end
-- The hash lives as long as its longest-lived value. Other representations
-- past their keep-until (bytes 33-40 of a version-3 envelope: the one number
-- of a value's retention, the stale window or FailSafe's max age, that its own
-- fill wrote) are dropped here, so a representation no longer asked for does
-- not live on with the others; bytes of another version are no value.
local n = redis.call('HLEN', KEYS[1])
if n > 1 or (n == 1 and redis.call('HEXISTS', KEYS[1], ARGV[7]) == 0) then
  local all = redis.call('HGETALL', KEYS[1])
  local now = tonumber(ARGV[8])
  for i = 1, #all, 2 do
    if all[i] ~= ARGV[7] then
      local e, keep = all[i + 1], 0
      if string.len(e) >= 40 and string.byte(e, 3) == 3 then
        for j = 33, 40 do keep = keep * 256 + string.byte(e, j) end
      end
      if keep <= now then
        redis.call('HDEL', KEYS[1], all[i])
      end
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[7], ARGV[2])
local ttl = tonumber(ARGV[3])
local ht = redis.call('PTTL', KEYS[1])
if ht < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
  ht = ttl
end
-- The generation outlives every value stored under it: were it to expire
-- first, a value could not be told from one of a later generation.
local gt = redis.call('PTTL', KEYS[3])
if gt >= 0 and gt < ht then
  redis.call('PEXPIRE', KEYS[3], ht)
end
-- A value over 1 MiB is not pushed (the waiters read it from Redis): pub/sub
-- output buffers are limited (32 MB by default) and one over it would cut
-- every waiting process's shared subscription.
local push = ARGV[2]
if #push > 1048576 then push = '' end
redis.call(ARGV[5], ARGV[4], 'v' .. ARGV[1] .. ' ' .. push)
redis.call('PUBLISH', ARGV[9], ARGV[10])
return 1
