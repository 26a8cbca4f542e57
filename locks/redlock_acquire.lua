-- Redlock: take (or re-enter) a lock on one node.
-- KEYS[1] lock hash {o = owner, <acquisition id> = 1 for the hold that began the
-- holding on this node, 2 for each re-entry; followed by "."..<seq> once an extend of it
-- applied (see redlock_extend.lua)}
-- KEYS[2] the acquisition's tombstone, set by its release (see redlock_release.lua)
-- ARGV: owner, acquisition id, lease ms
-- Returns {1, 1} when this acquisition began the owner's holding, {1, 2} when it
-- re-entered it, {0, pttl} when another owner holds the lock (or when this
-- acquisition was released here already).
-- A client retry whose first reply was lost finds its acquisition's field and
-- answers as the first call did, instead of counting a second hold or reading
-- the hold count (holds of the owner may have come and gone in between).
local k, owner, acq, px = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
if redis.call('EXISTS', KEYS[2]) == 1 then
  -- Released already on this node: this request came after its release (see
  -- redlock_release.lua), and what it took here nobody would hold.
  local pttl = redis.call('PTTL', k)
  if pttl < 0 then pttl = 0 end
  return {0, pttl}
end
local cur = redis.call('HGET', k, 'o')
if cur == false then
  redis.call('HSET', k, 'o', owner, acq, 1)
  redis.call('PEXPIRE', k, px)
  return {1, 1}
end
if cur == owner then
  local was = redis.call('HGET', k, acq)
  if not was then redis.call('HSET', k, acq, 2) end
  if redis.call('PTTL', k) < px then redis.call('PEXPIRE', k, px) end
  return {1, tonumber(string.match(was or '2', '^%d+'))}
end
local pttl = redis.call('PTTL', k)
if pttl < 0 then pttl = 0 end
return {0, pttl}
