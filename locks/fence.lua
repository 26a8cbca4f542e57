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
-- Returns the token as a decimal string. One SET ... GET reads and writes the
-- counter; only when the counter is not behind the clock (rare) does it take
-- number formatting and a second SET. The clock's token is built from TIME's
-- two strings without converting them: tokens have 16 digits (until 2286), and
-- decimal strings of equal length compare as their numbers do.
local function nextFence(fk, fencettl, t)
  local s = t[1] .. string.sub('00000' .. t[2], -6)
  -- A retention of 0 (NoFencing): no counter is kept; the token (the clock)
  -- only identifies the holding.
  if fencettl == '0' or fencettl == 0 then return s end
  local old = redis.call('SET', fk, s, 'PX', fencettl, 'GET')
  if old and (#old > #s or (#old == #s and old >= s)) then
    s = string.format('%.0f', tonumber(old) + 1)
    redis.call('SET', fk, s, 'PX', fencettl)
  end
  return s
end
