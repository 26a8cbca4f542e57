-- Release one hold of a lock, or withdraw from its queue; on the last hold, hand
-- the lock straight to the longest-waiting live waiter and tell it.
-- KEYS as acquire.lua. ARGV: owner, fence ttl ms, channel, publish command, own queue member (or ''),
-- claim ms: the lease of a hand-off until the new holder renews it (a waiter that died
-- while queued thus blocks the lock for at most this long).
-- Returns the remaining hold count (0 = released), or -1 when not held by owner.
local lk, fk, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, fencettl, chan, pub, mine, claim = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
if mine ~= '' then
  redis.call('ZREM', q, mine)
  redis.call('ZREM', qt, mine)
end
if redis.call('HGET', lk, 'o') ~= owner then return -1 end
local n = redis.call('HINCRBY', lk, 'n', -1)
if n > 0 then return n end
redis.call('DEL', lk)

local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', qt, '-inf', nowms)
if #dead > 0 then
  redis.call('ZREM', q, unpack(dead))
  redis.call('ZREMRANGEBYSCORE', qt, '-inf', nowms)
end
local head = redis.call('ZRANGE', q, 0, 0)[1]
if head then
  local sep = string.find(head, '|', 1, true)
  local w, wlease = string.sub(head, 1, sep - 1), tonumber(string.sub(head, sep + 1))
  local c = tonumber(redis.call('GET', fk) or '0')
  local f = string.format('%.0f', math.max(c + 1, tonumber(t[1]) * 1000000 + tonumber(t[2])))
  redis.call('SET', fk, f, 'PX', fencettl)
  redis.call('HSET', lk, 'o', w, 'a', 'h', 'n', 1, 'f', f)
  redis.call('PEXPIRE', lk, math.min(wlease, claim))
  redis.call('ZREM', q, head)
  redis.call('ZREM', qt, head)
  redis.call(pub, chan, w .. ' ' .. f)
end
return 0
