-- Deletes KEYS[1] only when it still holds this caller's token ARGV[1].
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
