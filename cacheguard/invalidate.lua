-- Invalidate a cache key: move its generation forward, which voids at once
-- every fill lease granted under it, delete its values (of every type and
-- variant: a value present in Redis is therefore always of the current
-- generation, and a hit need not read the generation), and wake the waiters
-- so that they take a new lease.
-- KEYS[1] generation   KEYS[2] values (hash)
-- ARGV: wake channel, publish command, shortest ttl ms of the generation, the
--       near-cache channel and its message (classic PUBLISH, even on a cluster)
-- The new generation is larger than the old one and than the server's clock in
-- µs, so it never repeats one seen before, even if the old one was lost.
local old = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local t = redis.call('TIME')
local g = tonumber(t[1]) * 1000000 + tonumber(t[2])
if g <= old then g = old + 1 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < tonumber(ARGV[3]) then ttl = tonumber(ARGV[3]) end
redis.call('SET', KEYS[1], string.format('%d', g), 'PX', ttl)
redis.call('DEL', KEYS[2])
redis.call(ARGV[2], ARGV[1], 'x')
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
