-- Invalidate a tag: move its version forward (counterNext), so that every
-- value whose load began under the old one is stale, and tell the near caches.
-- KEYS[1] the tag's version
-- ARGV: shortest ttl ms of the version, the near-cache channel, its message
counterNext(KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
