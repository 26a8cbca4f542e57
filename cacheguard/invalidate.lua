-- Invalidate a cache key: move its generation forward (counterNext: never to
-- a value it held before, even if it was lost), which voids at once every
-- fill lease granted under it, delete its values (of every type and variant:
-- a value present in Redis is therefore always of the current generation,
-- and a hit need not read the generation), and wake the waiters so that they
-- take a new lease.
-- KEYS[1] generation   KEYS[2] values (hash)
-- ARGV: wake channel, publish command, shortest ttl ms of the generation, the
--       near-cache channel and its message (classic PUBLISH, even on a cluster)
counterNext(KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
redis.call(ARGV[2], ARGV[1], 'x')
redis.call('PUBLISH', ARGV[4], ARGV[5])
return 1
