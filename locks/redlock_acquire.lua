-- Redlock: take (or re-enter) a lock on one node.
-- KEYS[1] lock hash {o = owner, <acquisition id> = 1 for each hold}
-- ARGV: owner, acquisition id, lease ms
-- Returns {1, holds} when the owner holds it, {0, pttl} when another owner does.
-- Setting the acquisition's field is idempotent, so a client retry whose first
-- reply was lost succeeds again instead of counting a second hold.
local k, owner, acq, px = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local cur = redis.call('HGET', k, 'o')
if cur == false then
  redis.call('HSET', k, 'o', owner, acq, 1)
  redis.call('PEXPIRE', k, px)
  return {1, 1}
end
if cur == owner then
  redis.call('HSET', k, acq, 1)
  if redis.call('PTTL', k) < px then redis.call('PEXPIRE', k, px) end
  return {1, redis.call('HLEN', k) - 1}
end
local pttl = redis.call('PTTL', k)
if pttl < 0 then pttl = 0 end
return {0, pttl}
