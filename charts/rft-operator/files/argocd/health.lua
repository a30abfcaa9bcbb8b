-- Argo CD health check for rft.dev/RFTJob (resource.customizations.health.rft.dev_RFTJob in argocd-cm).
-- Reads only what the operator writes: status.observedGeneration, status.phase, status.message,
-- status.step / status.totalSteps and the Failed condition. Lua 5.1, no library beyond the base.
--   Healthy      Succeeded
--   Degraded     Failed, ValidationFailed
--   Suspended    Suspended (spec.suspend: true, acknowledged)
--   Progressing  Pending, Provisioning, Running; and any phase of a generation the operator has not
--                reconciled yet (a spec change just synced)
local hs = {}
local function say(status, message)
  hs.status = status
  hs.message = message
  return hs
end

local status = obj.status
if status == nil or status.phase == nil then
  return say("Progressing", "waiting for the rft-operator to reconcile the job")
end
local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  return say("Progressing", "waiting for the rft-operator to reconcile generation " .. tostring(generation))
end

local phase = status.phase
local message = status.message or ""
local function with(text)
  if message ~= "" then
    return text .. ": " .. message
  end
  return text
end

if phase == "Succeeded" then
  return say("Healthy", with("Succeeded"))
end
if phase == "Failed" or phase == "ValidationFailed" then
  local reason = phase
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == "Failed" and c.status == "True" and c.reason ~= nil and c.reason ~= "" then
        reason = phase .. " (" .. c.reason .. ")"
      end
    end
  end
  return say("Degraded", with(reason))
end
if phase == "Suspended" then
  return say("Suspended", with("Suspended"))
end
if phase == "Running" then
  local step = status.step or 0
  local total = status.totalSteps or 0
  if total > 0 then
    return say("Progressing", with("Running, step " .. tostring(step) .. "/" .. tostring(total)))
  end
  return say("Progressing", with("Running"))
end
if phase == "Pending" or phase == "Provisioning" then
  return say("Progressing", with(phase))
end
return say("Unknown", "unknown phase " .. tostring(phase))
