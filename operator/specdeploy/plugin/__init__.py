"""`kubectl specdeploy`: the verbs a person steers a rollout with, acting through the SD's API."""
