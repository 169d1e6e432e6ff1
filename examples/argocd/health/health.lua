-- Argo CD health check for specdeploy.dev/SpeculativeDeployment.
--
-- Read from what the operator writes (operator/specdeploy/plan/status/report.py): status.observedGeneration,
-- status.phase (Pending, Progressing, Canary, Serving, Degraded, RolledBack, Failed) and the
-- conditions Ready, Progressing and Degraded (operator/specdeploy/api/conditions.py).
--   Progressing  no status yet, a spec not yet observed, pods starting, waiting for Kueue quota,
--                a canary under analysis (holding on inconclusive verdicts included)
--   Healthy      Ready=True: every pod of the desired pair is ready and it is the stable revision
--   Suspended    Ready=True with reason ScaledToZero (spec.replicas is 0)
--   Degraded     Degraded=True (a collapsed acceptance rate, a rolled-back canary, a pair the
--                launcher refused), phase Failed, Degraded or RolledBack, or a model that could
--                not be read (Ready=False, ModelNotFound: the pods crash-loop until it can)
-- Argo CD gives health scripts only Lua's base and table libraries: no string functions here.
-- examples/argocd/argocd-cm-health.yaml is generated from this file (hack/argocd_health.py).
local hs = {}

local function findCondition(conditionType)
  if obj.status.conditions == nil then
    return nil
  end
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == conditionType then
      return condition
    end
  end
  return nil
end

local function describe(condition, fallback)
  if condition ~= nil and condition.message ~= nil and condition.message ~= "" then
    return condition.message
  end
  if condition ~= nil and condition.reason ~= nil and condition.reason ~= "" then
    return condition.reason
  end
  return fallback
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile the SpeculativeDeployment"
  return hs
end
if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for spec update to be observed"
  return hs
end

local ready = findCondition("Ready")
local degraded = findCondition("Degraded")
local progressing = findCondition("Progressing")
local phase = obj.status.phase

-- Degraded=True also while a stable revision keeps serving: the pair asked for is not served.
-- While Ready is False its message says more (the launcher's reason for refusing a pair).
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  if ready ~= nil and ready.status == "False" then
    hs.message = describe(ready, describe(degraded, "Degraded"))
  else
    hs.message = describe(degraded, "Degraded")
  end
  return hs
end
if phase == "Failed" or phase == "Degraded" or phase == "RolledBack" then
  hs.status = "Degraded"
  hs.message = describe(ready, "phase " .. phase)
  return hs
end
if ready ~= nil and ready.status == "False" and ready.reason == "ModelNotFound" then
  hs.status = "Degraded"
  hs.message = describe(ready, "ModelNotFound")
  return hs
end
if ready ~= nil and ready.status == "True" then
  if ready.reason == "ScaledToZero" then
    hs.status = "Suspended"
  else
    hs.status = "Healthy"
  end
  hs.message = describe(ready, "")
  return hs
end

hs.status = "Progressing"
if phase == "Canary" and progressing ~= nil then
  hs.message = describe(progressing, "canary under analysis")
else
  hs.message = describe(ready, "Waiting for the SpeculativeDeployment to become ready")
end
return hs
