-- Counters that guard correctness (internal/counter): prepended to the scripts
-- that move or create one. A counter is never smaller than a value it had
-- before, even when its key was lost (evicted, flushed, expired, its node
-- restarted without persistence): it moves to the larger of its value plus
-- one and the server's clock in microseconds, and a counter created afresh
-- starts at the clock. Values are decimal strings of 16 digits (until 2286);
-- strings of equal length compare as their numbers do.

-- The server's clock in µs, as a decimal string.
local function counterClock()
  local t = redis.call('TIME')
  return t[1] .. string.sub('00000' .. t[2], -6)
end

-- Move the counter k forward and return its new value; it lives at least ttl
-- ms from now (a longer life is kept).
local function counterNext(k, ttl)
  local s = counterClock()
  local old = redis.call('GET', k)
  if old and (#old > #s or (#old == #s and old >= s)) then
    s = string.format('%.0f', tonumber(old) + 1)
  end
  local pt = redis.call('PTTL', k)
  if pt < tonumber(ttl) then pt = ttl end
  redis.call('SET', k, s, 'PX', pt)
  return s
end

-- Return the counter k, created from the clock when absent; it lives at
-- least ttl ms from now (a longer life is kept).
local function counterRead(k, ttl)
  local v = redis.call('GET', k)
  if not v then
    v = counterClock()
    redis.call('SET', k, v, 'PX', ttl)
    return v
  end
  local pt = redis.call('PTTL', k)
  if pt >= 0 and pt < tonumber(ttl) then
    redis.call('PEXPIRE', k, ttl)
  end
  return v
end

-- Return the counter k, or the server's clock when it is absent (what it
-- would be created as): a reader's "absent" is then "now", newer than every
-- value the counter had and older than every one it will have.
local function counterPeek(k)
  return redis.call('GET', k) or counterClock()
end
