"""Lua scripts of ``RedisStore``. Each runs atomically inside Redis in one round trip (EVALSHA).

The window math mirrors ``fleet.store.window`` exactly (same doubles, same bucket indices, same order),
so ``MemoryStore`` and ``RedisStore`` agree to the bit. Fractional numbers cross the Lua boundary only as
``%.17g`` strings: Redis truncates returned Lua numbers to integers, and may format arguments with fewer digits.

Time: the limit scripts (``ADMIT``, ``SETTLE``, ``REPLICA_HEARTBEAT``) take the caller's ``now`` and a clock flag.
With the flag (``RedisStore``'s default) they run on Redis's own ``TIME``, so every gateway replica sees the same
windows, slots and registry whatever its clock says; a ``reserved_at`` on the caller's clock is moved onto the
server's by its age on the caller's clock (``now - reserved_at``), which no skew changes. Without the flag they
run on the caller's ``now`` (virtual-time tests, where ``MemoryStore`` gives identical results). Calling ``TIME``
before writing is allowed: Redis 5+ replicates a script's effects, not the script (the only mode from Redis 7),
and on Redis Cluster every key a script touches is in ``KEYS`` and in one slot, so one master's clock decides.
"""

from __future__ import annotations

_CLOCK_LIB = """
-- ARGV[1]: the caller's now (Unix s); ARGV[4]: '1' to run on the server's clock instead
local CALLER_NOW = tonumber(ARGV[1])
local SERVER_CLOCK = ARGV[4] == '1'
local function clock_now()
  if not SERVER_CLOCK then return CALLER_NOW end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

_WINDOW_LIB = (
    _CLOCK_LIB
    + """
local NB = tonumber(ARGV[2])
local function width(window) return window / NB end
local function bucket_of(t, window) return math.floor(t / width(window)) end
local function expiry(index, window) return (index + 1) * width(window) + window end
-- live buckets of a window hash as a sorted list of {index, count}; deletes the dead ones
local function live_buckets(key, window, now)
  local flat = redis.call('HGETALL', key)
  local live = {}
  for i = 1, #flat, 2 do
    local index = tonumber(flat[i])
    if expiry(index, window) <= now then
      redis.call('HDEL', key, flat[i])
    else
      live[#live + 1] = {index, tonumber(flat[i + 1])}
    end
  end
  table.sort(live, function(a, b) return a[1] < b[1] end)
  return live
end
-- idle keys vanish a minute after their last unit stops counting
local function window_ttl_ms(window) return math.ceil((2 * window + 60) * 1000) end
local function reserve(key, cost, window, now)
  if cost > 0 then
    redis.call('HINCRBY', key, string.format('%d', bucket_of(now, window)), cost)
    redis.call('PEXPIRE', key, window_ttl_ms(window))
  end
end
"""
)

_ADMIT_LIB = (
    _WINDOW_LIB
    + """
-- One admission: KEYS[k0 + 1 .. k0 + n], 4 ARGV per key from ARGV[a0 + 1]: kind ('w'|'s'|'b'|'r') and three
-- parameters:
--   w: cost, limit, window_s    s: slot_id, limit, ttl_s    b: limit_usd, pending_usd, ''
--   r: slot_id, '', '' (a finished request's slot on this key, freed before any check, even on a refusal)
-- returns {1, spent} when admitted, else {0, index of the refusing limit, retry_after_s, spent}; spent is the budget
-- counter as read by the check ('' when no budget limit was checked). ARGV[3] is the slot retry-after.
local function retry_window(key, cost, limit, window, now)
  local live = live_buckets(key, window, now)
  local used = 0
  for _, b in ipairs(live) do used = used + b[2] end
  local need = used + cost - limit
  if need <= 0 then return nil end
  if cost > limit then return window end
  local freed = 0
  for _, b in ipairs(live) do
    freed = freed + b[2]
    if freed >= need then return expiry(b[1], window) - now end
  end
  return window
end
local function retry_slot(key, slot_id, limit, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now))
  if redis.call('ZSCORE', key, slot_id) then return nil end
  if redis.call('ZCARD', key) < limit then return nil end
  return tonumber(ARGV[3])
end
local function admit(k0, n, a0, now)
  for i = 1, n do
    local base = a0 + (i - 1) * 4
    if ARGV[base + 1] == 'r' then redis.call('ZREM', KEYS[k0 + i], ARGV[base + 2]) end
  end
  local spent_seen = ''
  for i = 1, n do
    local base = a0 + (i - 1) * 4
    local kind, key = ARGV[base + 1], KEYS[k0 + i]
    local retry = nil
    if kind == 'w' then
      retry = retry_window(key, tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), now)
    elseif kind == 's' then
      retry = retry_slot(key, ARGV[base + 2], tonumber(ARGV[base + 3]), now)
    elseif kind == 'b' then
      local counter = redis.call('GET', key) or '0'
      spent_seen = counter
      if tonumber(counter) + tonumber(ARGV[base + 3]) >= tonumber(ARGV[base + 2]) then retry = 0 end
    end
    if retry then return {0, i, string.format('%.17g', retry), spent_seen} end
  end
  for i = 1, n do
    local base = a0 + (i - 1) * 4
    local kind, key = ARGV[base + 1], KEYS[k0 + i]
    if kind == 'w' then
      reserve(key, tonumber(ARGV[base + 2]), tonumber(ARGV[base + 4]), now)
    elseif kind == 's' then
      local ttl = tonumber(ARGV[base + 4])
      redis.call('ZADD', key, string.format('%.17g', now + ttl), ARGV[base + 2])
      redis.call('PEXPIRE', key, math.ceil((ttl + 60) * 1000))
    end
  end
  return {1, spent_seen}
end
"""
)

ADMIT = (
    _ADMIT_LIB
    + """
-- KEYS: one per limit. ARGV: now, NB, slot retry-after, clock flag, then 4 per limit (see admit above)
return admit(0, #KEYS, 4, clock_now())
"""
)
"""ARGV[3] is the slot retry-after, ARGV[4] the clock flag; limits start at ARGV[5]."""

ADMIT_MANY = (
    _ADMIT_LIB
    + """
-- Several admissions of one scope, in order, each all-or-nothing as ADMIT alone would be. KEYS: every admission's
-- keys in turn. ARGV: now, NB, slot retry-after, clock flag, then per admission: its caller's now, its number of
-- keys n, and 4 per key. Returns one ADMIT reply per admission.
local server_now = SERVER_CLOCK and clock_now() or nil
local out, k0, a = {}, 0, 5
while a <= #ARGV do
  local n = tonumber(ARGV[a + 1])
  out[#out + 1] = admit(k0, n, a + 1, server_now or tonumber(ARGV[a]))
  k0, a = k0 + n, a + 2 + 4 * n
end
return out
"""
)

SETTLE = (
    _WINDOW_LIB
    + """
-- Applies one or more settlements of one scope in order. KEYS, per settlement: its windows, its slots, its spend
-- counters, then (with a settle id) the settled-ids set. ARGV: now, NB, dedupe_s, clock flag, then per settlement:
-- settle id or '', n_windows, n_slots, n_counters, 3 per window (cost, window_s, reserved_at or ''), 1 per slot
-- (slot_id), 1 per counter (usd). A settlement whose id was applied within dedupe_s is skipped. Returns how many
-- were applied.
local now = clock_now()
local dedupe_s = tonumber(ARGV[3])
local k, arg, applied = 1, 5, 0
-- a reservation's time on the caller's clock, on ours: its age on the caller's clock is what skew cannot change
local function on_our_clock(reserved_at)
  if reserved_at == nil then return now end
  if SERVER_CLOCK then return now - (CALLER_NOW - reserved_at) end
  return reserved_at
end
local function refund(key, cost, window, reserved_at)
  local live = live_buckets(key, window, now)
  if cost > 0 then
    reserve(key, cost, window, now)
  elseif cost < 0 then
    local amount, newest = -cost, bucket_of(reserved_at, window)
    for _, b in ipairs(live) do
      if amount <= 0 or b[1] > newest then break end
      local take = math.min(b[2], amount)
      amount = amount - take
      local field = string.format('%d', b[1])
      if take == b[2] then redis.call('HDEL', key, field) else redis.call('HINCRBY', key, field, -take) end
    end
  end
end
while arg <= #ARGV do
  local sid = ARGV[arg]
  local nw, ns, nc = tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2]), tonumber(ARGV[arg + 3])
  arg = arg + 4
  local fresh = true
  if sid ~= '' then
    local ids = KEYS[k + nw + ns + nc]
    redis.call('ZREMRANGEBYSCORE', ids, '-inf', string.format('%.17g', now - dedupe_s))
    fresh = redis.call('ZADD', ids, 'NX', string.format('%.17g', now), sid) == 1
    redis.call('PEXPIRE', ids, math.ceil(dedupe_s * 1000))
  end
  if fresh then
    applied = applied + 1
    for i = 0, nw - 1 do
      local a = arg + 3 * i
      refund(KEYS[k + i], tonumber(ARGV[a]), tonumber(ARGV[a + 1]), on_our_clock(tonumber(ARGV[a + 2])))
    end
    for i = 0, ns - 1 do redis.call('ZREM', KEYS[k + nw + i], ARGV[arg + 3 * nw + i]) end
    for i = 0, nc - 1 do
      local key = KEYS[k + nw + ns + i]
      local total = tonumber(redis.call('GET', key) or '0') + tonumber(ARGV[arg + 3 * nw + ns + i])
      redis.call('SET', key, string.format('%.17g', total))
    end
  end
  arg = arg + 3 * nw + ns + nc
  k = k + nw + ns + nc + (sid ~= '' and 1 or 0)
end
return applied
"""
)

WORKER_STATES = """
-- KEYS[1]: the set of published worker ids. ARGV[1]: the prefix of the per-worker keys (which carry the TTL)
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local text = redis.call('GET', ARGV[1] .. id)
  if text then out[#out + 1] = text else redis.call('SREM', KEYS[1], id) end
end
return out
"""

DOCS = """
-- KEYS[1]: the set of a collection's document ids. ARGV[1]: the prefix of the per-document keys (which may carry
-- a TTL). Returns id, text, id, text, ...
local out = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local text = redis.call('GET', ARGV[1] .. id)
  if text then out[#out + 1] = id out[#out + 1] = text else redis.call('SREM', KEYS[1], id) end
end
return out
"""

ACQUIRE_LEASE = """
-- KEYS[1]: lease. ARGV: holder, ttl_ms. Take it when free, renew it when ours.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
if not current then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""

RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

REPLICA_HEARTBEAT = (
    _CLOCK_LIB
    + """
-- KEYS[1]: the replica registry (sorted set replica id → alive until). ARGV: now, replica id, ttl_s, clock flag.
local now = clock_now()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.17g', now))
redis.call('ZADD', KEYS[1], string.format('%.17g', now + tonumber(ARGV[3])), ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""
)

_LEDGER_LIB = """
local function fmt(x) return string.format('%.17g', x) end
local function rollup_field(size, unit) return fmt(size) .. ':' .. string.format('%d', unit) end
"""

APPEND_USAGE = (
    _LEDGER_LIB
    + """
-- Appends one tenant's records, in order, in one round trip. KEYS: the tenant's ledger stream, index (sorted set
-- at → record JSON), roll-ups (hash 'size:unit' → 'requests prompt completion usd') and request ids (hash id →
-- 1), then the spend counters the batch bills (fleet.budget_period: the lifetime one, then one per budget period and
-- record period). ARGV: '1' when the caller will WAIT for replicas (else ''), the number of roll-up sizes, the
-- sizes, then per spend counter its time to live in ms ('' for none), then 8 per record: request id,
-- at, record JSON, tenant, prompt, completion, cost_usd, and the KEYS indices of its spend counters (space
-- separated). A request id already in the ledger is skipped (no double billing); each new record's cost is added
-- to each of its spend counters. Returns how many records were new.
local nsizes = tonumber(ARGV[2])
local sizes = {}
for i = 1, nsizes do sizes[i] = tonumber(ARGV[2 + i]) end
local ttl_at = 3 + nsizes - 5 -- ARGV[ttl_at + i] is KEYS[i]'s time to live, for i >= 5
local first = 3 + nsizes + #KEYS - 4
local appended, spent = 0, {}
for arg = first, #ARGV, 8 do
  if redis.call('HSETNX', KEYS[4], ARGV[arg], '1') == 1 then
    appended = appended + 1
    for index in string.gmatch(ARGV[arg + 7], '%d+') do
      local i = tonumber(index)
      spent[i] = (spent[i] or 0.0) + tonumber(ARGV[arg + 6])
    end
    redis.call('ZADD', KEYS[2], ARGV[arg + 1], ARGV[arg + 2])
    redis.call('XADD', KEYS[1], '*', 'tenant', ARGV[arg + 3], 'record', ARGV[arg + 2])
    local at = tonumber(ARGV[arg + 1])
    for _, size in ipairs(sizes) do
      local field = rollup_field(size, math.floor(at / size))
      local n, p, c, usd = 0, 0, 0, 0.0
      local old = redis.call('HGET', KEYS[3], field)
      if old then
        local a, b, d, e = string.match(old, '^(%S+) (%S+) (%S+) (%S+)$')
        n, p, c, usd = tonumber(a), tonumber(b), tonumber(d), tonumber(e)
      end
      n, p, c = n + 1, p + tonumber(ARGV[arg + 4]), c + tonumber(ARGV[arg + 5])
      usd = usd + tonumber(ARGV[arg + 6])
      redis.call('HSET', KEYS[3], field, string.format('%d %d %d ', n, p, c) .. fmt(usd))
    end
  end
end
for i = 5, #KEYS do
  if (spent[i] or 0.0) > 0 then
    redis.call('SET', KEYS[i], fmt(tonumber(redis.call('GET', KEYS[i]) or '0') + spent[i]))
    if ARGV[ttl_at + i] ~= '' then redis.call('PEXPIRE', KEYS[i], ARGV[ttl_at + i]) end
  end
end
if appended == 0 and ARGV[1] == '1' and first <= #ARGV then
  -- a replay whose records are all here already writes nothing, and WAIT counts only this connection's writes:
  -- re-mark one id (a no-op that replicates) so the WAIT after it covers the earlier write of these records
  redis.call('HSET', KEYS[4], ARGV[first], '1')
end
return appended
"""
)

USAGE = (
    _LEDGER_LIB
    + """
-- KEYS: the tenant's index, the tenant's roll-ups. ARGV: since, until (exclusive), limit, the roll-up sizes.
-- Returns {requests, prompt, completion, usd, first `limit` records}; see fleet.store.ledger for the split.
local since, until_, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local sizes = {}
for i = 4, #ARGV do sizes[#sizes + 1] = tonumber(ARGV[i]) end
local records = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '(' .. ARGV[2], 'LIMIT', 0, ARGV[3])
local n, p, c, usd = 0, 0, 0, 0.0
local function add_records(lo, hi)
  for _, text in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], fmt(lo), '(' .. fmt(hi))) do
    local r = cjson.decode(text)
    n, p, c, usd = n + 1, p + r.prompt_tokens, c + r.completion_tokens, usd + r.cost_usd
  end
end
local function add_units(size, first, last)
  for unit = first, last do
    local v = redis.call('HGET', KEYS[2], rollup_field(size, unit))
    if v then
      local a, b, d, e = string.match(v, '^(%S+) (%S+) (%S+) (%S+)$')
      n, p, c, usd = n + tonumber(a), p + tonumber(b), c + tonumber(d), usd + tonumber(e)
    end
  end
end
local function split(lo, hi, level)
  if level > #sizes then add_records(lo, hi) return end
  local size = sizes[level]
  local first, last = math.ceil(lo / size), math.floor(hi / size)
  if first >= last then split(lo, hi, level + 1) return end
  split(lo, first * size, level + 1)
  add_units(size, first, last - 1)
  split(last * size, hi, level + 1)
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #oldest > 0 then
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  local lo, hi = math.max(since, tonumber(oldest[2])), math.min(until_, tonumber(newest[2]) + 1)
  if lo < hi then split(lo, hi, 1) end
end
return {n, string.format('%d', p), string.format('%d', c), fmt(usd), records}
"""
)

TRIM_USAGE = (
    _LEDGER_LIB
    + """
-- Retention (fleet.store.retention): removes a tenant's records with at < ARGV[1] from its index, their request
-- ids and the roll-ups wholly before ARGV[1], and trims the stream to the records left; only when exactly
-- ARGV[2] records are there (the ones the caller exported), else nothing changes and -1 is returned. KEYS: the
-- tenant's stream, index, roll-ups, ids. ARGV: before, expected, the roll-up sizes. Returns how many it removed.
local bound = '(' .. ARGV[1]
local before = tonumber(ARGV[1])
local n = redis.call('ZCOUNT', KEYS[2], '-inf', bound)
if n ~= tonumber(ARGV[2]) then return -1 end
if n == 0 then return 0 end
for _, text in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', bound)) do
  redis.call('HDEL', KEYS[4], cjson.decode(text).request_id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', bound)
for _, field in ipairs(redis.call('HKEYS', KEYS[3])) do
  local size, unit = string.match(field, '^(%S+):(%S+)$')
  if (tonumber(unit) + 1) * tonumber(size) <= before then redis.call('HDEL', KEYS[3], field) end
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', redis.call('ZCARD', KEYS[2]))
return n
"""
)

PUT_DOC_LOGGED = """
-- A document change and its log entry, all or nothing (Store.put_doc_logged). KEYS: the document, the collection's
-- id set, the log (a sorted set by time; all three in the collection's slot). ARGV: '1' to store ARGV[2] as the
-- document ('' deletes it), the body, the document id, the log member, its time, the log's cap, and the version the
-- stored document must have ('' for any: its top-level integer `version`, 0 without one). Returns {1, 0} when
-- written, {0, found version} when the version differs (nothing written). Every key's type is checked before
-- anything is written: a script stops at its first failing command and keeps what it wrote before.
local want = {'string', 'set', 'zset'}
for i = 1, 3 do
  local kind = redis.call('TYPE', KEYS[i]).ok
  if kind ~= 'none' and kind ~= want[i] then
    return redis.error_reply('WRONGTYPE ' .. KEYS[i] .. ' holds a ' .. kind .. ': nothing written')
  end
end
if ARGV[7] ~= '' then
  local found, text = 0, redis.call('GET', KEYS[1])
  if text then
    local ok, doc = pcall(cjson.decode, text)
    if ok and type(doc) == 'table' and type(doc.version) == 'number' and doc.version % 1 == 0 then
      found = doc.version
    end
  end
  if found ~= tonumber(ARGV[7]) then return {0, found} end
end
if ARGV[1] == '1' then
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('SADD', KEYS[2], ARGV[3])
else
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[2], ARGV[3])
end
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -(tonumber(ARGV[6]) + 1))
return {1, 0}
"""

REVOKE_KEY = """
-- KEYS: id → digest hash, revoked set. ARGV[1]: key id.
local digest = redis.call('HGET', KEYS[1], ARGV[1])
if not digest then return 0 end
redis.call('SADD', KEYS[2], digest)
return 1
"""

EJECTED = """
-- KEYS[1]: ejections (sorted set worker id → ejected until). ARGV[1]: now. Drops the ejections over by then and
-- returns the rest as worker id, until, worker id, until, ...
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
"""

BUNDLED = {
    "admit_many": ADMIT_MANY,
    "settle": SETTLE,
    "append_usage": APPEND_USAGE,
    "worker_states": WORKER_STATES,
    "docs": DOCS,
    "ejected": EJECTED,
    "replica_heartbeat": REPLICA_HEARTBEAT,
}
"""The scripts ``BUNDLE`` can run, by name; a call names one by its 1-based place here (``BUNDLE_INDEX``)."""
BUNDLE_INDEX = {name: str(i) for i, name in enumerate(BUNDLED, start=1)}

BUNDLE = (
    "local SCRIPTS = {\n"
    + ",\n".join(f"-- {name}\nfunction(KEYS, ARGV)\n{text}\nend" for name, text in BUNDLED.items())
    + """}
-- Several calls of the scripts above in one round trip (RedisStore's rides: the writes and reads that wait for the
-- next admit and go with it). ARGV: the number of calls n, then per call its script's place in SCRIPTS, its number of
-- keys and of arguments, then every call's arguments in turn; KEYS: every call's keys in turn. Each call runs as the
-- script would alone (its own KEYS and ARGV), in order; one that fails does not stop the others (its place in the
-- reply is its error). Returns one reply per call.
local n = tonumber(ARGV[1])
local k, a, out = 0, 1 + 3 * n, {}
for i = 1, n do
  local base = 1 + 3 * (i - 1)
  local script, nk, na = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[k + j] end
  for j = 1, na do args[j] = ARGV[a + j] end
  k, a = k + nk, a + na
  local ok, reply = pcall(SCRIPTS[script], keys, args)
  if not ok then
    reply = {err = type(reply) == 'table' and reply.err or tostring(reply)}
  elseif reply == nil then
    reply = false
  end
  out[i] = reply
end
return out
"""
)
"""Calls of the scripts of ``BUNDLED`` in one script call: see its text."""
