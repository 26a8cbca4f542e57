-- Release one hold of a lock, or withdraw from its queue; on the last hold, hand
-- the lock straight to the longest-waiting live waiter and tell it.
-- KEYS as acquire.lua. ARGV: owner, acquisition id of the hold to give back, own queue
-- member (or ''), "fence ttl ms,queue-place ttl ms", publish command, the holder's
-- fence token (or ''), and the queue member of the next waiter of the holder's process (or
-- ''): queued here, so that its wait costs no call of its own, when the hold is the holder's. Giving back a hold that is already gone (go-redis retrying a release whose
-- reply was lost, or a waiter withdrawing that was never handed the lock) changes nothing;
-- a retry of the release of the last hold is recognised as such (see below) and answers 0
-- again.
-- A hand-off's lease is a claim, the shorter of the waiter's own lease and the queue-place
-- ttl, until the new holder renews it (a waiter that died while queued thus blocks the lock
-- for at most this long); the waiter counts its lease the same way. A waiter's client listens on
-- the channel KEYS[1]..':w:'..client id (same hash tag, so SPUBLISH stays in the script's
-- slot).
-- A give-back (the clean-up of an acquisition attempt abandoned, whose outcome may be
-- unknown) passes ARGV[8], how long a request of the attempt may still reach Redis (ms:
-- rcmd.CleanupHorizon, not the lease, which a stall outlasts): it ends the acquisition for
-- good, and leaves its tombstone, '!'..acquisition id in KEYS[4] scored with its end, which
-- acquire.lua checks: a request of the attempt that reaches Redis after its give-back
-- (written into a stall, or retried by go-redis on another connection) would take a lock
-- nobody holds, or add a hold to its owner's holding that outlives that holding's release.
-- Returns the remaining hold count (0 = released), or -1 when not held by owner; when the
-- last hold was handed to the next waiter given, that waiter's fence token (a string); -3
-- when the lease had run out unnoticed (released, as 0) and the next waiter was not queued.
local lk, fk, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, acq, mine, nextm = ARGV[1], ARGV[2], ARGV[3], ARGV[7] or ''
if ARGV[8] then
  local t = redis.call('TIME')
  local life = tonumber(ARGV[8])
  redis.call('ZADD', qt, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + life, '!' .. acq)
  if redis.call('PTTL', qt) < life then redis.call('PEXPIRE', qt, life) end
end
local hold = 'h:' .. acq
local cur = redis.call('HMGET', lk, 'o', 'n', hold, 'w')

-- Fast path: the last hold, and no waiter (w unset: see acquire.lua).
if mine == '' and nextm == '' and cur[1] == owner and cur[2] == '1' and cur[3] and not cur[4] then
  redis.call('DEL', lk)
  return 0
end

if mine ~= '' then
  redis.call('ZREM', q, mine)
  redis.call('ZREM', qt, mine)
end
if cur[1] ~= owner then
  -- Released already, if this is a retry: the lock was handed on by this very hold ('p'), or
  -- it is gone and nobody took it since (the fence counter still holds this holder's token).
  if cur[1] and redis.call('HGET', lk, 'p') == owner .. '|' .. acq then return 0 end
  local myfence = ARGV[6] or ''
  if cur[1] == false and myfence ~= '' and redis.call('GET', fk) == myfence then
    if nextm ~= '' then return -3 end -- released, but the next waiter was not queued
    return 0
  end
  return -1
end
local fts, pls = string.match(ARGV[4], '^(%d+),(%d+)$')
local fencettl, place = tonumber(fts), tonumber(pls)
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if nextm ~= '' then
  -- Queue the holder's process's next waiter (as acquire.lua queues a waiter).
  local nl = tonumber(string.match(nextm, '|(%d+)|[^|]*|[^|]*$'))
  redis.call('ZADD', q, 'NX', t[1] .. string.sub('00000' .. t[2], -6), nextm)
  redis.call('ZADD', qt, nowms + place, nextm)
  redis.call('PEXPIRE', q, place + nl)
  if redis.call('PTTL', qt) < place + nl then redis.call('PEXPIRE', qt, place + nl) end -- never cuts a tombstone's life
  cur[4] = '1'
end
if not cur[3] then
  if nextm ~= '' then redis.call('HSET', lk, 'w', '1') end
  return tonumber(cur[2])
end
if cur[2] ~= '1' then
  redis.call('HDEL', lk, hold)
  if nextm ~= '' then redis.call('HSET', lk, 'w', '1') end
  return redis.call('HINCRBY', lk, 'n', -1)
end
redis.call('DEL', lk)
if not cur[4] then return 0 end

dropDead(q, qt, nowms)
local head = redis.call('ZPOPMIN', q)[1]
if head then
  -- owner|lease|client|acquisition id (the owner may itself contain '|'); the
  -- waiter's client alone listens on its channel, so no other process wakes for
  -- it. (A member without the client, queued by an older version, is told on
  -- the channel that version listens on.)
  local chan
  local w, wl, wc, wacq = string.match(head, '^(.*)|(%d+)|([^|]*)|([^|]*)$')
  if w then
    chan = lk .. ':w:' .. wc
  else
    w, wl, wacq = string.match(head, '^(.*)|(%d+)|([^|]*)$')
    chan = lk .. ':w'
  end
  local wlease = tonumber(wl)
  local f = nextFence(fk, fencettl, t)
  redis.call('ZREM', qt, head)
  -- w: more waiters may be queued (a stale w only costs the next release this check)
  redis.call('HSET', lk, 'o', w, 'n', '1', 'f', f, 'h:' .. wacq, '1', 'b', wacq, 'p', owner .. '|' .. acq, 'w', '1')
  redis.call('PEXPIRE', lk, math.min(wlease, place))
  -- The releasing process's own next waiter learns of it from this reply;
  -- only another process's waiter is told by a push.
  if head == nextm then return f end
  redis.call(ARGV[5], chan, wacq .. ' ' .. f)
end
return 0
