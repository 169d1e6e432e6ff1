"""Pure decisions, no I/O: from one snapshot of the world to every write and Event.

`decide` is the pipeline; each concern has a package of its own: `placement` (sizing, catalogs,
Kueue), `rollout` (revisions, canary analysis, collapse guard, autotune), `children` (manifests,
vLLM arguments, drift) and `status` (conditions and the status document)."""
