-- Release one hold of a lock, or withdraw from its queue; on the last hold, hand
-- the lock straight to the longest-waiting live waiter and tell it.
-- KEYS as acquire.lua. ARGV: owner, "fence ttl ms,claim ms", publish command, own queue member (or ''),
-- acquisition id of the hold to give back, and (optional) the holder's fence token. Giving back a
-- hold that is already gone (go-redis retrying a release whose reply was lost, or a waiter
-- withdrawing that was never handed the lock) changes nothing; a retry of the release of the last
-- hold is recognised as such (see below) and answers 0 again.
-- The claim is the lease of a hand-off until the new holder renews it (a waiter that died
-- while queued thus blocks the lock for at most this long). Waiters listen on the channel
-- KEYS[1]..':w' (same hash tag, so SPUBLISH stays in the script's slot).
-- Returns the remaining hold count (0 = released), or -1 when not held by owner.
local lk, fk, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, pub, mine, acq, myfence = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6] or ''
local fts, cls = string.match(ARGV[2], '^(%d+),(%d+)$')
local fencettl, claim = tonumber(fts), tonumber(cls)
local chan = lk .. ':w'
if mine ~= '' then
  redis.call('ZREM', q, mine)
  redis.call('ZREM', qt, mine)
end
local cur = redis.call('HMGET', lk, 'o', 'n', 'p')
if cur[1] ~= owner then
  -- Released already, if this is a retry: the lock was handed on by this very hold ('p'), or
  -- it is gone and nobody took it since (the fence counter still holds this holder's token).
  if cur[3] == owner .. '|' .. acq then return 0 end
  if cur[1] == false and myfence ~= '' and redis.call('GET', fk) == myfence then return 0 end
  return -1
end
if redis.call('HDEL', lk, 'h:' .. acq) == 0 then return tonumber(cur[2]) end
if tonumber(cur[2]) > 1 then return redis.call('HINCRBY', lk, 'n', -1) end
redis.call('DEL', lk)
if redis.call('EXISTS', q) == 0 then return 0 end

local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', qt, '-inf', nowms)
if #dead > 0 then
  redis.call('ZREM', q, unpack(dead))
  redis.call('ZREMRANGEBYSCORE', qt, '-inf', nowms)
end
local head = redis.call('ZRANGE', q, 0, 0)[1]
if head then
  -- owner|lease|acquisition id (the owner may itself contain '|')
  local w, wl, wacq = string.match(head, '^(.*)|(%d+)|([^|]*)$')
  local wlease = tonumber(wl)
  local _, f = nextFence(fk, fencettl, t)
  redis.call('HSET', lk, 'o', w, 'n', 1, 'f', f, 'h:' .. wacq, 1, 'p', owner .. '|' .. acq)
  redis.call('PEXPIRE', lk, math.min(wlease, claim))
  redis.call('ZREM', q, head)
  redis.call('ZREM', qt, head)
  redis.call(pub, chan, wacq .. ' ' .. f)
end
return 0
