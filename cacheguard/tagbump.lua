-- Invalidate a tag: move its version forward, so that every value whose load
-- began under the old one is stale, and tell the near caches.
-- KEYS[1] the tag's version
-- ARGV: shortest ttl ms of the version, the near-cache channel, its message
local old = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local t = redis.call('TIME')
local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
if v <= old then v = old + 1 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < tonumber(ARGV[1]) then ttl = tonumber(ARGV[1]) end
redis.call('SET', KEYS[1], string.format('%d', v), 'PX', ttl)
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
