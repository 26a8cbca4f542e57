-- Read a tag's version for a load that is about to begin, creating it when
-- absent (counterRead), and make it outlive the value the load will store.
-- KEYS[1] the tag's version   ARGV: ttl ms of the value to be stored
return counterRead(KEYS[1], ARGV[1])
