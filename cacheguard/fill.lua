-- Store a loaded value only while the fill lease still holds this token (a
-- compare-and-set: an invalidation or an expired lease means nothing is written),
-- release the lease and wake the waiters with the value itself, naming the
-- token (a waiter trusts only the fill whose lease it saw: a message from an
-- earlier fill may still be on its way when an invalidation has come between).
-- KEYS[1] value   KEYS[2] fill lease
-- ARGV: token, envelope, value ttl ms, wake channel, publish command (PUBLISH or SPUBLISH)
-- Returns 1 when stored, 0 when the lease was no longer this token's.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
redis.call(ARGV[5], ARGV[4], 'v' .. ARGV[1] .. ' ' .. ARGV[2])
return 1
