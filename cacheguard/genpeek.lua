-- Read a key's generation for a call whose entry has a flight running in the
-- process (see flights.admit): the generation, or, when it is absent, the
-- server's clock (counterPeek): later than every generation the key had,
-- earlier than every one it will have.
-- KEYS[1] the generation
return counterPeek(KEYS[1])
