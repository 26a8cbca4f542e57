-- Write a value to a register guarded by fence tokens: applied only when the
-- writer's token is at least the register's. KEYS[1] register hash {f, v}.
-- ARGV: fence token (decimal), value, check (1 = fenced, 0 = a control that does not check).
-- Returns 1 when applied, 0 when refused.
local cur = tonumber(redis.call('HGET', KEYS[1], 'f') or '0')
if ARGV[3] == '1' and tonumber(ARGV[1]) < cur then
  return 0
end
redis.call('HSET', KEYS[1], 'f', ARGV[1], 'v', ARGV[2])
return 1
