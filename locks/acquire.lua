-- Acquire (or re-enter) a lock in one step, and on failure optionally queue as a waiter.
-- KEYS[1] lock hash {o=owner, n=hold count, f=fence, h:<acquisition id>=1 per hold,
--   b=the acquisition id whose hold began the holding (granted or handed to it; a
--   fresh owner, whose acquisition id is the owner, may leave it out),
--   w=1 when waiters may be queued, p=previous holder after a hand-off}
-- KEYS[2] fence counter   KEYS[3] waiter queue (zset: arrival µs)   KEYS[4] waiter deadlines (zset: ms),
--   and tombstones of attempts given back (see release.lua)
-- ARGV: owner, acquisition id, lease ms, fence ttl ms, "queue-place ttl ms (0 = do not queue),fair (1/0)",
-- the waiting client's id (its hand-offs are published on KEYS[1]..':w:'..id; see release.lua)
-- Returns the fence token (a decimal string) for a fresh grant, {1, fence, holds} when
-- re-entered, {0, pttl, queued} when not held (also when this attempt was given back before
-- this request arrived: see release.lua). A retry (this acquisition id holds already)
-- answers as the first run did, whatever happened between: the fence alone when its hold
-- began the holding (b), else {1, fence, holds}.
--
-- Invariant kept by every script: while the lock hash exists and its queue is
-- not empty, the hash has w. A release without w thus skips the queue.
local lk, fk, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, acq = ARGV[1], ARGV[2]

-- Fast path: free, nobody queued and no attempt given back (5 commands).
if redis.call('EXISTS', lk, q, qt) == 0 then
  local f = nextFence(fk, ARGV[4], redis.call('TIME'))
  if acq == owner then
    redis.call('HSET', lk, 'o', owner, 'n', '1', 'f', f, 'h:' .. acq, '1')
  else
    redis.call('HSET', lk, 'o', owner, 'n', '1', 'f', f, 'h:' .. acq, '1', 'b', acq)
  end
  redis.call('PEXPIRE', lk, ARGV[3])
  return f
end

local lease = tonumber(ARGV[3])
local places, fairs = string.match(ARGV[5], '^(%d+),(%d)$')
local place, fair = tonumber(places), fairs == '1'
-- A queue entry names the waiter's owner, lease, client and acquisition id; a
-- hand-off writes that id into the lock, so only the waiter's own attempt matches it.
local member = owner .. '|' .. ARGV[3] .. '|' .. ARGV[6] .. '|' .. acq
local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- This attempt was given back already (see release.lua): it ended without the lock,
-- so whatever it would take here nobody would hold.
local gone = redis.call('ZSCORE', qt, '!' .. acq)
if gone and tonumber(gone) > nowms then
  local pttl = redis.call('PTTL', lk)
  if pttl < 0 then pttl = 0 end
  return {0, pttl, 0}
end

local cur = redis.call('HMGET', lk, 'o', 'n', 'f', 'w', 'b')
if cur[1] == owner then
  -- Held by this owner. A hold under this acquisition id exists already: go-redis
  -- retrying a call whose reply was lost, or a hand-off to this waiter that it has
  -- not heard of yet. Otherwise a re-entry, which takes one more hold.
  local n = tonumber(cur[2])
  local retry = redis.call('HSETNX', lk, 'h:' .. acq, '1') == 0
  if not retry then n = redis.call('HINCRBY', lk, 'n', '1') end
  if redis.call('PTTL', lk) < lease then redis.call('PEXPIRE', lk, ARGV[3]) end
  redis.call('ZREM', q, member)
  redis.call('ZREM', qt, member)
  -- The hold count alone cannot tell a retry of the grant from a re-entry: holds
  -- of the owner may have been taken or given back between a call and its retry.
  if retry and (acq == owner or cur[5] == acq) then return cur[3] end
  return {1, cur[3], n}
end

if cur[1] == false then
  -- Drop waiters whose place expired (they died or gave up without saying so)
  -- before the head is read. While the lock is held only a hand-off reads the
  -- head, and release.lua drops them first too.
  dropDead(q, qt, nowms)
  local head = nil
  if fair then head = redis.call('ZRANGE', q, 0, 0)[1] end
  if head == nil or head == member then
    local f = nextFence(fk, ARGV[4], t)
    redis.call('ZREM', q, member)
    redis.call('ZREM', qt, member)
    redis.call('HSET', lk, 'o', owner, 'n', '1', 'f', f, 'h:' .. acq, '1', 'b', acq)
    if redis.call('EXISTS', q) == 1 then redis.call('HSET', lk, 'w', '1') end
    redis.call('PEXPIRE', lk, ARGV[3])
    return f
  end
end

local queued = 0
if place > 0 then
  redis.call('ZADD', q, 'NX', t[1] .. string.sub('00000' .. t[2], -6), member)
  redis.call('ZADD', qt, nowms + place, member)
  local keep = place + lease
  redis.call('PEXPIRE', q, keep)
  if redis.call('PTTL', qt) < keep then redis.call('PEXPIRE', qt, keep) end -- never cuts a tombstone's life
  if cur[1] and not cur[4] then redis.call('HSET', lk, 'w', '1') end
  queued = 1
end
local pttl = redis.call('PTTL', lk)
if pttl < 0 then pttl = 0 end
return {0, pttl, queued}
