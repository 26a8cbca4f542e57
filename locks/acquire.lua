-- Acquire (or re-enter) a lock in one step, and on failure optionally queue as a waiter.
-- KEYS[1] lock hash {o=owner, n=hold count, f=fence, h:<acquisition id>=1 per hold}
-- KEYS[2] fence counter   KEYS[3] waiter queue (zset: arrival µs)   KEYS[4] waiter deadlines (zset: ms)
-- ARGV: owner, acquisition id, "lease ms,queue-place ttl ms (0 = do not queue),fence ttl ms,fair (1/0)"
-- (the numbers travel packed in one argument: fewer arguments, fewer client allocations)
-- Returns {1, fence, holds} when held, {0, pttl, queued} when not.
local lk, fk, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, acq = ARGV[1], ARGV[2]
local leases, places, fencettls, fairs = string.match(ARGV[3], '^(%d+),(%d+),(%d+),(%d)$')
local lease, place, fencettl, fair = tonumber(leases), tonumber(places), tonumber(fencettls), fairs == '1'
-- A queue entry names the waiter's owner, lease and acquisition id; a hand-off
-- writes that id into the lock, so only the waiter's own attempt matches it.
local member = owner .. '|' .. leases .. '|' .. acq

-- Fast path: free and nobody queued (5 commands).
if redis.call('EXISTS', lk, q) == 0 then
  local f, fs = nextFence(fk, fencettl, redis.call('TIME'))
  redis.call('HSET', lk, 'o', owner, 'n', 1, 'f', fs, 'h:' .. acq, 1)
  redis.call('PEXPIRE', lk, lease)
  return {1, f, 1}
end

local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local cur = redis.call('HMGET', lk, 'o', 'n', 'f')
if cur[1] == owner then
  -- Held by this owner. A hold under this acquisition id exists already: go-redis
  -- retrying a call whose reply was lost, or a hand-off to this waiter that it has
  -- not heard of yet. Otherwise a re-entry, which takes one more hold.
  local n = tonumber(cur[2])
  if redis.call('HSETNX', lk, 'h:' .. acq, 1) == 1 then
    n = redis.call('HINCRBY', lk, 'n', 1)
  end
  if redis.call('PTTL', lk) < lease then redis.call('PEXPIRE', lk, lease) end
  redis.call('ZREM', q, member)
  redis.call('ZREM', qt, member)
  return {1, tonumber(cur[3]), n}
end

-- Drop waiters whose place expired (they died or gave up without saying so).
local dead = redis.call('ZRANGEBYSCORE', qt, '-inf', nowms)
if #dead > 0 then
  redis.call('ZREM', q, unpack(dead))
  redis.call('ZREMRANGEBYSCORE', qt, '-inf', nowms)
end

if cur[1] == false then
  local head = nil
  if fair then head = redis.call('ZRANGE', q, 0, 0)[1] end
  if head == nil or head == member then
    local f, fs = nextFence(fk, fencettl, t)
    redis.call('HSET', lk, 'o', owner, 'n', 1, 'f', fs, 'h:' .. acq, 1)
    redis.call('PEXPIRE', lk, lease)
    redis.call('ZREM', q, member)
    redis.call('ZREM', qt, member)
    return {1, f, 1}
  end
end

local queued = 0
if place > 0 then
  redis.call('ZADD', q, 'NX', tonumber(t[1]) * 1000000 + tonumber(t[2]), member)
  redis.call('ZADD', qt, nowms + place, member)
  local keep = place + lease
  redis.call('PEXPIRE', q, keep)
  redis.call('PEXPIRE', qt, keep)
  queued = 1
end
local pttl = redis.call('PTTL', lk)
if pttl < 0 then pttl = 0 end
return {0, pttl, queued}
