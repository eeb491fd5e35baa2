-- wrk script for bench/gateway_load.py: streaming completions, each with its group's shared
-- prefix and a unique suffix (the same prompts as the bench's own clients), and a JSON line
-- with the latency percentiles at the end.
--
-- wrk -t1 -c32 -d10s -s bench/wrk_completions.lua http://127.0.0.1:8000 -- \
--     OFFSET GROUPS PROMPT_TOKENS SHARED_PREFIX_TOKENS MAX_TOKENS MODEL

local offset, groups, prompt_tokens, shared, max_tokens, model
local counter = 0
local threads = {}

function setup(thread)
  thread:set("thread_index", #threads)
  table.insert(threads, thread)
end

function init(args)
  offset = tonumber(args[1]) + thread_index * 100000000
  groups = tonumber(args[2])
  prompt_tokens = tonumber(args[3])
  shared = tonumber(args[4])
  max_tokens = tonumber(args[5])
  model = args[6]
end

local headers = { ["Content-Type"] = "application/json" }

function request()
  local i = offset + counter
  counter = counter + 1
  local prefix = string.sub(string.rep("[group " .. (i % groups) .. "] shared system prompt. ", 64), 1, shared)
  local rest = math.max(1, prompt_tokens - #prefix)
  local suffix = string.sub(string.rep(" request " .. i .. " asks something unique.", 64), 1, rest)
  local body = '{"model":"' .. model .. '","prompt":"' .. prefix .. suffix
    .. '","max_tokens":' .. max_tokens .. ',"stream":true}'
  return wrk.format("POST", "/v1/completions", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"wrk": {"requests": %d, "duration_us": %d, "bytes": %d, '
      .. '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, '
      .. '"latency_us": {"p50": %d, "p90": %d, "p99": %d, "mean": %.1f, "max": %d}}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max))
end
