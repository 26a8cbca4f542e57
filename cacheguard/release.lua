-- Give up the fill lease without storing anything and tell the waiters why:
-- the load failed (so they do not each retry a failing load), found nothing,
-- or was handed over by a closing Guard (so one of them takes it over now).
-- KEYS[1] fill lease; KEYS[2], for a fill's release, the key's generation (the
-- reply says whether it is still the one the lease was granted under), for a
-- give-back, the lease's given-back tokens (a zset scored with each one's end,
-- unix ms)
-- ARGV: lease ("<generation> <token>", or "*<token>": whatever generation that
-- token's lease has, for a lease its holder asked for without learning it was
-- granted), wake channel, publish command, message; for a give-back, ARGV[5]
-- how long its token stays refused (ms): lease.lua never grants it, so a
-- request of that token that reaches Redis after this one takes nothing.
-- Returns 0 when the lease was no longer this token's; when released, 2 if the
-- generation (a fill's release) is still the lease's, else 1.
local giveBack = ARGV[5] ~= nil
if giveBack then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local life = tonumber(ARGV[5])
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('ZADD', KEYS[2], now + life, string.sub(ARGV[1], 2))
  if redis.call('PTTL', KEYS[2]) < life then redis.call('PEXPIRE', KEYS[2], life) end
end
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
if string.sub(ARGV[1], 1, 1) == '*' then
  local tok = ' ' .. string.sub(ARGV[1], 2)
  if string.sub(cur, -#tok) ~= tok then
    return 0
  end
elseif cur ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[3], ARGV[2], ARGV[4])
if not giveBack and KEYS[2] and redis.call('GET', KEYS[2]) == string.match(ARGV[1], '^(%S+) ') then
  return 2
end
return 1
