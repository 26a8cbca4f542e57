-- Acquire (or re-enter) a lock in one step, and on failure optionally queue as a waiter.
-- KEYS[1] lock hash {o=owner, a=last acquisition id, n=hold count, f=fence}
-- KEYS[2] fence counter   KEYS[3] waiter queue (zset: arrival µs)   KEYS[4] waiter deadlines (zset: ms)
-- ARGV: owner, acquisition id, "lease ms,queue-place ttl ms (0 = do not queue),fence ttl ms,fair (1/0)"
-- (the numbers travel packed in one argument: fewer arguments, fewer client allocations)
-- Returns {1, fence, holds} when held, {0, pttl, queued} when not.
local lk, fk, q, qt = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local owner, acq = ARGV[1], ARGV[2]
local leases, places, fencettls, fairs = string.match(ARGV[3], '^(%d+),(%d+),(%d+),(%d)$')
local lease, place, fencettl, fair = tonumber(leases), tonumber(places), tonumber(fencettls), fairs == '1'
local member = owner .. '|' .. leases

-- The fence token: the counter plus one; when the counter was lost (restart
-- without persistence, failover, eviction, or its retention ran out), the
-- server's clock in microseconds, which is above every earlier token unless one
-- lock was taken more than once per microsecond since the counter's last reset
-- or the server's clock went back. INCR keeps the key's TTL, so the retention
-- counts from that reset and needs no write per acquisition.
local function nextFence()
  local f = redis.call('INCR', fk)
  if f == 1 then
    local t = redis.call('TIME')
    f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', fk, string.format('%.0f', f), 'PX', fencettl)
  end
  return f
end

-- Fast path: free and nobody queued (4 commands).
if redis.call('EXISTS', lk, q) == 0 then
  local f = nextFence()
  redis.call('HSET', lk, 'o', owner, 'a', acq, 'n', 1, 'f', string.format('%.0f', f))
  redis.call('PEXPIRE', lk, lease)
  return {1, f, 1}
end

local t = redis.call('TIME')
local nowms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local cur = redis.call('HMGET', lk, 'o', 'a', 'n', 'f')
if cur[1] == owner then
  -- Held by this owner: re-entry, or go-redis retrying a call whose reply was lost
  -- (same acquisition id), or a hand-off to this waiter that it has not heard of.
  local n = tonumber(cur[3])
  if cur[2] ~= acq then
    if cur[2] == 'h' then
      redis.call('HSET', lk, 'a', acq)
    else
      n = redis.call('HINCRBY', lk, 'n', 1)
      redis.call('HSET', lk, 'a', acq)
    end
  end
  if redis.call('PTTL', lk) < lease then redis.call('PEXPIRE', lk, lease) end
  redis.call('ZREM', q, member)
  redis.call('ZREM', qt, member)
  return {1, tonumber(cur[4]), n}
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
    local f = nextFence()
    redis.call('HSET', lk, 'o', owner, 'a', acq, 'n', 1, 'f', string.format('%.0f', f))
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
