"""A vLLM-compatible server that serves a target and its draft the way a GPU would, in real time.

`python -m specdeploy.sim <vllm serve arguments>` answers the OpenAI completions and chat API,
`/health`, `/v1/models` and `/metrics` with vLLM 0.32's metric families, from an engine loop of
discrete steps whose timings and acceptance come from GPU-shaped profiles (`profiles.py`, the
catalog in `catalog.yaml`). The engine launcher starts it in place of vLLM for models named
`sim/<profile>` (docs/simulator.md). It proves the operator's decisions on GPU-shaped figures;
it never proves a claim about vLLM (e2e/test_sim_contract.py holds it to the real engine).
"""
