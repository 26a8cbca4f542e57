-- Waiter queues (prepended to acquire.lua and release.lua).
-- Drops the places of queue q whose deadline in qt is past nowms (ms), and
-- the deadlines (and ended tombstones, see release.lua) from qt. Their members
-- go to ZREM at most 1000 at a time: Lua cannot unpack much more than 8000
-- values into one call ("too many results to unpack"), and a fleet of dead
-- waiters leaves that many. No script passes a list of unbounded size to one
-- command.
local function dropDead(q, qt, nowms)
  local dead = redis.call('ZRANGEBYSCORE', qt, '-inf', nowms)
  if #dead == 0 then return end
  for i = 1, #dead, 1000 do
    redis.call('ZREM', q, unpack(dead, i, math.min(i + 999, #dead)))
  end
  redis.call('ZREMRANGEBYSCORE', qt, '-inf', nowms)
end
