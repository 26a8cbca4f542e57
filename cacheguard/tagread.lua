-- Read a tag's version for a load that is about to begin, creating it when
-- absent, and make it outlive the value the load will store (a version that
-- expired and came back could otherwise equal one recorded before an
-- invalidation).
-- KEYS[1] the tag's version
-- ARGV: ttl ms of the value to be stored
-- Returns the version (µs of the server's clock when created; invalidate moves
-- it forward, never back).
local v = redis.call('GET', KEYS[1])
local ttl = tonumber(ARGV[1])
if not v then
  local t = redis.call('TIME')
  v = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('SET', KEYS[1], v, 'PX', ttl)
  return v
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl >= 0 and pttl < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return v
