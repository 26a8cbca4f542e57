-- Redlock: extend one acquisition's lease on one node.
-- KEYS[1] lock hash (see redlock_acquire.lua). ARGV: owner, acquisition id, lease ms, and the
-- sequence number of the holder's command.
-- Replies as extend.lua: 1 when extended, 0 when the owner does not hold the lock here, 2
-- when this command was overtaken (see below) and the lease left is shorter, 3 when the
-- owner holds it here without this acquisition (its other holds stand).
-- A holder sends its renewals and extends one at a time, numbered (as extend.lua); the
-- acquisition's field keeps its kind (1 or 2, see redlock_acquire.lua) and the last number
-- applied, "<kind>.<seq>", so a command whose reply never came and that reaches the node after
-- a newer one (held in a stall, or retried by go-redis) never shortens what the newer one set.
-- With other holds of the same owner present the lease is only raised, never
-- cut, so one hold's renewal cannot shorten another's validity.
local k, owner, acq, px, seq = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if redis.call('HGET', k, 'o') ~= owner then return 0 end
local v = redis.call('HGET', k, acq)
if not v then return 3 end
if seq then
  local kind, last = string.match(v, '^(%d+)%.?(%d*)$')
  if last ~= '' and tonumber(seq) < tonumber(last) then
    if redis.call('PTTL', k) >= px then return 1 end
    return 2
  end
  redis.call('HSET', k, acq, kind .. '.' .. seq)
end
if redis.call('HLEN', k) == 2 or redis.call('PTTL', k) < px then
  redis.call('PEXPIRE', k, px)
end
return 1
