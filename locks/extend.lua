-- Extend the lease of a lock held by owner. KEYS[1] lock hash. ARGV: owner, lease ms, and
-- (optional) the hold's acquisition id and the sequence number of the holder's command.
-- Returns 1 when the lock keeps at least the lease, 0 when it is not held by owner, 3 when
-- (given the acquisition id) the owner holds it without that hold — a renewal of an owner's
-- earlier holding must not touch a later one, and the owner's other holds stand — and 2 when
-- held but this command was overtaken (see below) and the lease left is shorter.
-- A holder sends its renewals and extends one at a time, numbered; the hold's field keeps
-- the last number applied, so a command whose reply never came and that reaches Redis after
-- a newer one never shortens what the newer one set. While the owner holds it more than once
-- (re-entered with different leases), a renewal of one hold never shortens the lease another
-- hold relies on.
local cur = redis.call('HMGET', KEYS[1], 'o', 'n')
if cur[1] ~= ARGV[1] then return 0 end
local lease = tonumber(ARGV[2])
if ARGV[4] then
  local hold = 'h:' .. ARGV[3]
  local last = redis.call('HGET', KEYS[1], hold)
  if not last then return 3 end
  if tonumber(ARGV[4]) < tonumber(last) then
    if redis.call('PTTL', KEYS[1]) >= lease then return 1 end
    return 2
  end
  redis.call('HSET', KEYS[1], hold, ARGV[4])
end
if tonumber(cur[2]) > 1 and redis.call('PTTL', KEYS[1]) > lease then return 1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
