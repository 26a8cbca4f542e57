-- Fence tokens (prepended to acquire.lua and release.lua).
-- The next token of the lock whose counter is fk: the larger of the counter
-- plus one and the server's clock in microseconds (t is a TIME reply), stored
-- back with a TTL of fencettl ms, refreshed by every token issued. The clock
-- keeps tokens increasing when the counter is behind what was issued — lost
-- with a restart, expired, evicted, or stale after a failover to a replica
-- that missed the last writes — as long as the server's clock (the new
-- master's, after a failover) is not behind the time of the last token; the
-- counter keeps them increasing across more than one token per microsecond,
-- and across a clock that stepped back by less than the retention.
-- Returns the token as a number and as a string. (One SET ... GET reads and
-- writes the counter; a second SET only when the counter is ahead of the clock.)
local function nextFence(fk, fencettl, t)
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local s = string.format('%.0f', now)
  local old = redis.call('SET', fk, s, 'PX', fencettl, 'GET')
  if old then
    local f = tonumber(old) + 1
    if f > now then
      s = string.format('%.0f', f)
      redis.call('SET', fk, s, 'PX', fencettl)
      return f, s
    end
  end
  return now, s
end

